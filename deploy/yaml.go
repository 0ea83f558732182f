package deploy

import (
	"fmt"
	"strconv"
	"strings"
)

// parseYAML reads the block-style YAML subset the rule file uses: maps,
// lists of maps, and scalars (plain, single- or double-quoted) on one line.
// No anchors, flow collections or multi-line scalars: the rule file is
// written within this subset, and anything outside it is an error naming
// the line, not a silent misread. (gopkg.in/yaml.v3 is not in go.sum, and
// this is all the deploy pack needs.)
func parseYAML(src string) (any, error) {
	var lines []yLine
	for i, raw := range strings.Split(src, "\n") {
		s := stripComment(raw)
		if strings.TrimSpace(s) == "" {
			continue
		}
		if strings.Contains(s, "\t") {
			return nil, fmt.Errorf("yaml line %d: tab in indentation", i+1)
		}
		ind := len(s) - len(strings.TrimLeft(s, " "))
		lines = append(lines, yLine{n: i + 1, indent: ind, text: strings.TrimSpace(s)})
	}
	p := &yParser{lines: lines}
	if len(lines) == 0 {
		return nil, nil
	}
	v, err := p.block(lines[0].indent)
	if err != nil {
		return nil, err
	}
	if p.i < len(p.lines) {
		return nil, fmt.Errorf("yaml line %d: unexpected indentation", p.lines[p.i].n)
	}
	return v, nil
}

type yLine struct {
	n      int
	indent int
	text   string
}

type yParser struct {
	lines []yLine
	i     int
}

// block parses the node whose lines start at indent.
func (p *yParser) block(indent int) (any, error) {
	if strings.HasPrefix(p.lines[p.i].text, "- ") || p.lines[p.i].text == "-" {
		return p.list(indent)
	}
	return p.mapping(indent)
}

func (p *yParser) list(indent int) (any, error) {
	var out []any
	for p.i < len(p.lines) && p.lines[p.i].indent == indent && strings.HasPrefix(p.lines[p.i].text+" ", "- ") {
		l := p.lines[p.i]
		rest := strings.TrimSpace(strings.TrimPrefix(l.text, "-"))
		if rest == "" {
			p.i++
			if p.i >= len(p.lines) || p.lines[p.i].indent <= indent {
				out = append(out, nil)
				continue
			}
			v, err := p.block(p.lines[p.i].indent)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			continue
		}
		// "- key: value" starts a map whose keys sit at indent+2.
		if k, _, ok := splitKey(rest); ok && k != "" {
			inner := indent + (len(l.text) - len(rest))
			p.lines[p.i] = yLine{n: l.n, indent: inner, text: rest}
			v, err := p.mapping(inner)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			continue
		}
		s, err := scalar(rest, l.n)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
		p.i++
	}
	return out, nil
}

func (p *yParser) mapping(indent int) (any, error) {
	out := map[string]any{}
	for p.i < len(p.lines) && p.lines[p.i].indent == indent {
		l := p.lines[p.i]
		if strings.HasPrefix(l.text+" ", "- ") {
			return nil, fmt.Errorf("yaml line %d: list item where a key was expected", l.n)
		}
		k, v, ok := splitKey(l.text)
		if !ok {
			return nil, fmt.Errorf("yaml line %d: want key: value, got %q", l.n, l.text)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("yaml line %d: duplicate key %q", l.n, k)
		}
		p.i++
		if v != "" {
			if v == "|" || v == ">" || strings.HasPrefix(v, "|") || strings.HasPrefix(v, ">") || strings.HasPrefix(v, "&") || strings.HasPrefix(v, "*") {
				return nil, fmt.Errorf("yaml line %d: multi-line scalars and anchors are outside the supported subset", l.n)
			}
			s, err := scalar(v, l.n)
			if err != nil {
				return nil, err
			}
			out[k] = s
			continue
		}
		if p.i < len(p.lines) && p.lines[p.i].indent > indent {
			child, err := p.block(p.lines[p.i].indent)
			if err != nil {
				return nil, err
			}
			out[k] = child
		} else if p.i < len(p.lines) && p.lines[p.i].indent == indent && strings.HasPrefix(p.lines[p.i].text+" ", "- ") {
			// A list at the same indentation as its key.
			child, err := p.list(indent)
			if err != nil {
				return nil, err
			}
			out[k] = child
		} else {
			out[k] = nil
		}
	}
	if p.i < len(p.lines) && p.lines[p.i].indent > indent {
		return nil, fmt.Errorf("yaml line %d: unexpected indentation", p.lines[p.i].n)
	}
	return out, nil
}

// splitKey splits "key: value" outside quotes.
func splitKey(s string) (string, string, bool) {
	if strings.HasPrefix(s, `"`) || strings.HasPrefix(s, `'`) {
		return "", "", false
	}
	i := strings.Index(s, ":")
	if i <= 0 || (i+1 < len(s) && s[i+1] != ' ') {
		return "", "", false
	}
	return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+1:]), true
}

func scalar(s string, line int) (string, error) {
	switch {
	case strings.HasPrefix(s, `"`):
		v, err := strconv.Unquote(s)
		if err != nil {
			return "", fmt.Errorf("yaml line %d: bad double-quoted string: %w", line, err)
		}
		return v, nil
	case strings.HasPrefix(s, `'`):
		if len(s) < 2 || !strings.HasSuffix(s, `'`) {
			return "", fmt.Errorf("yaml line %d: unterminated single-quoted string", line)
		}
		return strings.ReplaceAll(s[1:len(s)-1], `''`, `'`), nil
	case strings.HasPrefix(s, "{") || strings.HasPrefix(s, "["):
		return "", fmt.Errorf("yaml line %d: flow collections are outside the supported subset", line)
	}
	return s, nil
}

// stripComment removes a # comment that is not inside quotes.
func stripComment(s string) string {
	inS, inD := false, false
	for i, r := range s {
		switch {
		case r == '\'' && !inD:
			inS = !inS
		case r == '"' && !inS:
			inD = !inD
		case r == '#' && !inS && !inD && (i == 0 || s[i-1] == ' '):
			return s[:i]
		}
	}
	return s
}
