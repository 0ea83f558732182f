package databasesql

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// bound is a statement rewritten for MySQL: SQL with ? placeholders and
// `backtick` identifiers, and for each ? the index of the argument it takes
// (nil: the arguments go as given).
type bound struct {
	sql   string
	order []int
	// maxArg is the highest $n used (the arguments a call must pass).
	maxArg int
}

// args returns the arguments for b's placeholders.
func (b bound) args(in []any) ([]any, error) {
	if b.order == nil {
		return in, nil
	}
	if len(in) < b.maxArg {
		return nil, fmt.Errorf("databasesql: statement uses $%d but %d arguments were given", b.maxArg, len(in))
	}
	out := make([]any, len(b.order))
	for i, j := range b.order {
		out[i] = in[j]
	}
	return out, nil
}

// bindCache keeps the rewrites of a Driver's statements. Ferry's statements
// are a few hundred fixed strings; statements built per call (batch inserts
// of n rows) are bounded by maxBindCache entries and by length.
type bindCache struct {
	mu sync.RWMutex
	m  map[string]bound
}

const (
	maxBindCache    = 2048
	maxBindCacheLen = 16 << 10
)

func (c *bindCache) get(query string) (bound, error) {
	c.mu.RLock()
	b, ok := c.m[query]
	c.mu.RUnlock()
	if ok {
		return b, nil
	}
	b, err := bindMySQL(query)
	if err != nil {
		return bound{}, err
	}
	if len(query) <= maxBindCacheLen {
		c.mu.Lock()
		if c.m == nil {
			c.m = map[string]bound{}
		}
		if len(c.m) < maxBindCache {
			c.m[query] = b
		}
		c.mu.Unlock()
	}
	return b, nil
}

// bindMySQL rewrites a statement written in Ferry's portable form for
// MySQL/MariaDB: $n placeholders become ? (a $n may repeat and appear in any
// order; the returned order says which argument each ? takes) and
// "double-quoted" identifiers become `backtick` ones, so the statement does
// not depend on the session's ANSI_QUOTES. Nothing inside string literals
// ('…', with MySQL's backslash escapes), backtick identifiers or comments
// (-- …, # …, /* … */) is touched. A statement that already uses ? and no
// $n is passed through with its arguments as given; mixing both is an error.
func bindMySQL(query string) (bound, error) {
	var b strings.Builder
	b.Grow(len(query))
	var order []int
	maxArg := 0
	question := false
	n := len(query)
	for i := 0; i < n; {
		c := query[i]
		switch {
		case c == '\'':
			j, _ := skipQuoted(query, i, '\'', true)
			b.WriteString(query[i:j])
			i = j
		case c == '`':
			j, _ := skipQuoted(query, i, '`', false)
			b.WriteString(query[i:j])
			i = j
		case c == '"':
			j, ok := skipQuoted(query, i, '"', false)
			if !ok {
				return bound{}, fmt.Errorf("databasesql: unterminated quoted identifier at byte %d", i)
			}
			inner := strings.ReplaceAll(query[i+1:j-1], `""`, `"`)
			b.WriteByte('`')
			b.WriteString(strings.ReplaceAll(inner, "`", "``"))
			b.WriteByte('`')
			i = j
		case c == '-' && i+1 < n && query[i+1] == '-', c == '#':
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = n - i
			}
			b.WriteString(query[i : i+j])
			i += j
		case c == '/' && i+1 < n && query[i+1] == '*':
			j := strings.Index(query[i+2:], "*/")
			end := n
			if j >= 0 {
				end = i + 2 + j + 2
			}
			b.WriteString(query[i:end])
			i = end
		case c == '?':
			question = true
			b.WriteByte(c)
			i++
		case c == '$' && i+1 < n && query[i+1] >= '0' && query[i+1] <= '9':
			j := i + 1
			for j < n && query[j] >= '0' && query[j] <= '9' {
				j++
			}
			k, err := strconv.Atoi(query[i+1 : j])
			if err != nil || k < 1 || k > 65535 {
				return bound{}, fmt.Errorf("databasesql: placeholder %s out of range (1..65535)", query[i:j])
			}
			order = append(order, k-1)
			maxArg = max(maxArg, k)
			b.WriteByte('?')
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	if order != nil && question {
		return bound{}, fmt.Errorf("databasesql: statement mixes $n and ? placeholders")
	}
	return bound{sql: b.String(), order: order, maxArg: maxArg}, nil
}

// skipQuoted returns the index just past the quoted run starting at
// query[i] (a doubled quote stays inside; backslash escapes when
// backslash), or len(query) and false when it is not terminated.
func skipQuoted(query string, i int, q byte, backslash bool) (int, bool) {
	n := len(query)
	for j := i + 1; j < n; j++ {
		switch query[j] {
		case '\\':
			if backslash {
				j++
			}
		case q:
			if j+1 < n && query[j+1] == q {
				j++
				continue
			}
			return j + 1, true
		}
	}
	return n, false
}
