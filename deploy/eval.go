package deploy

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"

	dto "github.com/prometheus/client_model/go"
)

// Sample is one series of an instant vector.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Eval evaluates an alert expression against gathered metric families, as
// Prometheus would at one instant, and returns the samples that satisfy it
// (an alert fires for each). It understands the subset the rule file is
// written in:
//
//	expr     = operand [cmp operand]
//	operand  = number | selector | agg [by (labels)] ( selector )
//	selector = name [{ label = "v" | label != "v", … }]
//	agg      = max | min | sum | count
//	cmp      = > | < | >= | <= | == | !=
//
// A comparison filters the left side (PromQL's default, not bool); between
// two vectors, samples match on identical label sets. An expression outside
// the subset is an error, never a silent false.
func Eval(expr string, families []*dto.MetricFamily) ([]Sample, error) {
	p := &exprParser{toks: tokenize(expr)}
	left, err := p.operand(families)
	if err != nil {
		return nil, fmt.Errorf("eval %q: %w", expr, err)
	}
	if p.done() {
		if left.scalar {
			return nil, fmt.Errorf("eval %q: a bare number is not an alert", expr)
		}
		return left.vec, nil
	}
	op := p.next()
	if !isCmp(op) {
		return nil, fmt.Errorf("eval %q: unsupported operator %q", expr, op)
	}
	right, err := p.operand(families)
	if err != nil {
		return nil, fmt.Errorf("eval %q: %w", expr, err)
	}
	if !p.done() {
		return nil, fmt.Errorf("eval %q: unexpected %q", expr, p.peek())
	}
	if left.scalar {
		return nil, fmt.Errorf("eval %q: number on the left of a comparison is outside the subset", expr)
	}
	var out []Sample
	for _, s := range left.vec {
		var rv float64
		if right.scalar {
			rv = right.num
		} else {
			found := false
			for _, r := range right.vec {
				if sameLabels(s.Labels, r.Labels) {
					rv, found = r.Value, true
					break
				}
			}
			if !found {
				continue
			}
		}
		if compare(op, s.Value, rv) {
			out = append(out, s)
		}
	}
	return out, nil
}

type operand struct {
	scalar bool
	num    float64
	vec    []Sample
}

type exprParser struct {
	toks []string
	i    int
}

func (p *exprParser) done() bool { return p.i >= len(p.toks) }
func (p *exprParser) peek() string {
	if p.done() {
		return ""
	}
	return p.toks[p.i]
}
func (p *exprParser) next() string { t := p.peek(); p.i++; return t }
func (p *exprParser) expect(t string) error {
	if got := p.next(); got != t {
		return fmt.Errorf("want %q, got %q", t, got)
	}
	return nil
}

func (p *exprParser) operand(fams []*dto.MetricFamily) (operand, error) {
	t := p.peek()
	if f, err := strconv.ParseFloat(t, 64); err == nil {
		p.i++
		return operand{scalar: true, num: f}, nil
	}
	switch t {
	case "max", "min", "sum", "count":
		p.i++
		var by []string
		if p.peek() == "by" {
			p.i++
			var err error
			if by, err = p.labelList(); err != nil {
				return operand{}, err
			}
		}
		if err := p.expect("("); err != nil {
			return operand{}, err
		}
		vec, err := p.selector(fams)
		if err != nil {
			return operand{}, err
		}
		if err := p.expect(")"); err != nil {
			return operand{}, err
		}
		if p.peek() == "by" {
			p.i++
			if by, err = p.labelList(); err != nil {
				return operand{}, err
			}
		}
		return operand{vec: aggregate(t, by, vec)}, nil
	}
	vec, err := p.selector(fams)
	return operand{vec: vec}, err
}

func (p *exprParser) labelList() ([]string, error) {
	if err := p.expect("("); err != nil {
		return nil, err
	}
	var out []string
	for {
		t := p.next()
		if t == ")" {
			return out, nil
		}
		if t == "," {
			continue
		}
		if !isIdent(t) {
			return nil, fmt.Errorf("bad label %q", t)
		}
		out = append(out, t)
	}
}

func (p *exprParser) selector(fams []*dto.MetricFamily) ([]Sample, error) {
	name := p.next()
	if !isIdent(name) {
		return nil, fmt.Errorf("want a metric name, got %q", name)
	}
	type matcher struct {
		label, op, val string
	}
	var ms []matcher
	if p.peek() == "{" {
		p.i++
		for p.peek() != "}" {
			if p.done() {
				return nil, fmt.Errorf("unterminated selector")
			}
			if p.peek() == "," {
				p.i++
				continue
			}
			l, op, v := p.next(), p.next(), p.next()
			if !isIdent(l) || (op != "=" && op != "!=") || !strings.HasPrefix(v, `"`) {
				return nil, fmt.Errorf("unsupported matcher %s%s%s", l, op, v)
			}
			uv, err := strconv.Unquote(v)
			if err != nil {
				return nil, fmt.Errorf("bad matcher value %s", v)
			}
			ms = append(ms, matcher{l, op, uv})
		}
		p.i++
	}
	var out []Sample
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for _, mt := range ms {
				if (labels[mt.label] == mt.val) != (mt.op == "=") {
					continue metrics
				}
			}
			var v float64
			switch {
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Untyped != nil:
				v = m.GetUntyped().GetValue()
			default:
				return nil, fmt.Errorf("%s: only gauges and counters can be selected directly", name)
			}
			labels["__name__"] = name
			out = append(out, Sample{Labels: labels, Value: v})
		}
	}
	return out, nil
}

func aggregate(op string, by []string, in []Sample) []Sample {
	groups := map[string]*Sample{}
	counts := map[string]int{}
	var keys []string
	for _, s := range in {
		labels := map[string]string{}
		var kb strings.Builder
		for _, l := range by {
			if v, ok := s.Labels[l]; ok && v != "" {
				labels[l] = v
			}
			kb.WriteString(l + "=" + s.Labels[l] + "\x00")
		}
		k := kb.String()
		g := groups[k]
		if g == nil {
			g = &Sample{Labels: labels, Value: s.Value}
			if op == "sum" || op == "count" {
				g.Value = 0
			}
			groups[k] = g
			keys = append(keys, k)
		}
		counts[k]++
		switch op {
		case "max":
			g.Value = math.Max(g.Value, s.Value)
		case "min":
			g.Value = math.Min(g.Value, s.Value)
		case "sum":
			g.Value += s.Value
		case "count":
			g.Value = float64(counts[k])
		}
	}
	sort.Strings(keys)
	out := make([]Sample, 0, len(keys))
	for _, k := range keys {
		out = append(out, *groups[k])
	}
	return out
}

func sameLabels(a, b map[string]string) bool {
	strip := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			if k != "__name__" {
				out[k] = v
			}
		}
		return out
	}
	a, b = strip(a), strip(b)
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func isCmp(op string) bool {
	switch op {
	case ">", "<", ">=", "<=", "==", "!=":
		return true
	}
	return false
}

func compare(op string, a, b float64) bool {
	switch op {
	case ">":
		return a > b
	case "<":
		return a < b
	case ">=":
		return a >= b
	case "<=":
		return a <= b
	case "==":
		return a == b
	case "!=":
		return a != b
	}
	return false
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r == ':' || unicode.IsLetter(r) || (i > 0 && unicode.IsDigit(r))) {
			return false
		}
	}
	return true
}

// tokenize splits an expression into names, numbers, strings and operators.
func tokenize(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			i++
		case c == '"':
			j := i + 1
			for j < len(s) && s[j] != '"' {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			out = append(out, s[i:min(j+1, len(s))])
			i = j + 1
		case strings.ContainsRune("(){},", rune(c)):
			out = append(out, string(c))
			i++
		case strings.ContainsRune("<>=!", rune(c)):
			if i+1 < len(s) && s[i+1] == '=' {
				out = append(out, s[i:i+2])
				i += 2
			} else {
				out = append(out, string(c))
				i++
			}
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\"(){},<>=!", rune(s[j])) {
				j++
			}
			if j == i {
				j++
			}
			out = append(out, s[i:j])
			i = j
		}
	}
	return out
}
