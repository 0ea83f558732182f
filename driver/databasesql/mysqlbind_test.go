package databasesql

import (
	"reflect"
	"strings"
	"testing"
)

func TestBindMySQL(t *testing.T) {
	cases := []struct {
		in, sql string
		order   []int
	}{
		{`SELECT 1`, `SELECT 1`, nil},
		{`SELECT $1, $2`, `SELECT ?, ?`, []int{0, 1}},
		{`UPDATE "t" SET a = $2 WHERE b = $1 AND c = $2`, "UPDATE `t` SET a = ? WHERE b = ? AND c = ?", []int{1, 0, 1}},
		{`SELECT '$1', $1 FROM "s"."t"`, "SELECT '$1', ? FROM `s`.`t`", []int{0}},
		{`SELECT 'it''s $2', 'a\'$3', $1`, `SELECT 'it''s $2', 'a\'$3', ?`, []int{0}},
		{"SELECT `$1`, $10 -- $2\n, $1 /* $3 \" */ # $4", "SELECT `$1`, ? -- $2\n, ? /* $3 \" */ # $4", []int{9, 0}},
		{`SELECT "a""b"`, "SELECT `a\"b`", nil},
		{`SELECT ? , '"x"'`, `SELECT ? , '"x"'`, nil},
		{`SELECT $ FROM t`, `SELECT $ FROM t`, nil},
	}
	for _, c := range cases {
		b, err := bindMySQL(c.in)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if b.sql != c.sql || !reflect.DeepEqual(b.order, c.order) {
			t.Errorf("%q:\n got %q %v\nwant %q %v", c.in, b.sql, b.order, c.sql, c.order)
		}
	}
}

func TestBindMySQLRejects(t *testing.T) {
	for in, want := range map[string]string{
		`SELECT $1, ?`:         "mixes",
		`SELECT "unterminated`: "unterminated",
		`SELECT $0`:            "out of range",
		`SELECT $99999999999`:  "out of range",
	} {
		if _, err := bindMySQL(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err %v, want %q", in, err, want)
		}
	}
}

func TestBoundArgs(t *testing.T) {
	b, err := bindMySQL(`SELECT $3, $1, $3`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.args([]any{"a", "b", "c"})
	if err != nil || !reflect.DeepEqual(got, []any{"c", "a", "c"}) {
		t.Fatalf("args = %v, %v", got, err)
	}
	if _, err := b.args([]any{"a"}); err == nil || !strings.Contains(err.Error(), "$3 but 1 arguments") {
		t.Fatalf("too few args: %v", err)
	}
}

func TestBindCacheBounded(t *testing.T) {
	var c bindCache
	for i := range maxBindCache + 10 {
		if _, err := c.get("SELECT $1 /*" + strings.Repeat("x", i) + "*/"); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.m) != maxBindCache {
		t.Fatalf("cache holds %d entries, want the bound %d", len(c.m), maxBindCache)
	}
	b1, _ := c.get(`SELECT $2, $1`)
	b2, _ := c.get(`SELECT $2, $1`)
	if b1.sql != b2.sql || !reflect.DeepEqual(b1.order, b2.order) {
		t.Fatal("cached rewrite differs")
	}
}

// FuzzBindMySQL: never panics; every ? outside literals comes from a $n
// (order has one entry per ? added), text inside '…' literals is kept
// byte for byte, and the rewrite of a statement without $ or " is itself.
func FuzzBindMySQL(f *testing.F) {
	for _, s := range []string{`SELECT $1`, `'$1' "x" $2`, "`a` -- $1\n$1", `/* $1`, `'\`, `"a""`, `$`, `$1$2$33`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := bindMySQL(s)
		if err != nil {
			return
		}
		if !strings.ContainsAny(s, `$"`) && b.sql != s {
			t.Fatalf("%q rewritten to %q without $ or \"", s, b.sql)
		}
		for _, j := range b.order {
			if j < 0 || j >= b.maxArg {
				t.Fatalf("order %v outside 0..%d", b.order, b.maxArg)
			}
		}
		if strings.HasPrefix(s, `'`) {
			if end, ok := skipQuoted(s, 0, '\'', true); ok && !strings.HasPrefix(b.sql, s[:end]) {
				t.Fatalf("literal %q changed: %q", s[:end], b.sql)
			}
		}
		if b.order != nil {
			args := make([]any, b.maxArg)
			got, err := b.args(args)
			if err != nil || len(got) != len(b.order) {
				t.Fatalf("args: %d, %v", len(got), err)
			}
		}
	})
}
