package ident

import (
	"regexp"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, c := range []struct {
		s    string
		max  int
		want bool
	}{
		{"ferry_outbox", 63, true},
		{"_x9", 63, true},
		{"a", 1, true},
		{"", 63, false},
		{"9lives", 63, false},
		{"Outbox", 63, false},
		{"a-b", 63, false},
		{"a b", 63, false},
		{`a"; drop table x; --`, 63, false},
		{"é", 63, false},
		{strings.Repeat("a", 63), 63, true},
		{strings.Repeat("a", 64), 63, false},
		{strings.Repeat("a", 41), 40, false},
	} {
		if got := Valid(c.s, c.max); got != c.want {
			t.Errorf("Valid(%q, %d) = %v, want %v", c.s, c.max, got, c.want)
		}
	}
}

// FuzzValid: the loop accepts exactly what the documented pattern does.
func FuzzValid(f *testing.F) {
	re := regexp.MustCompile(`^` + Pattern + `$`)
	for _, s := range []string{"a", "_", "9", "a9", "A", "a\n", "ab_c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Valid(s, 1<<20), re.MatchString(s); got != want {
			t.Fatalf("Valid(%q) = %v, pattern says %v", s, got, want)
		}
	})
}
