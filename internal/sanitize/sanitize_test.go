package sanitize

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 100, "plain"},
		{"line\nforged=1\r\x00\x1b[31m\x7f\u0085end", 100, "line forged=1   [31m  end"},
		{"bad \xff utf8", 100, "bad \uFFFD utf8"},
		{"tab\there", 100, "tab here"},
		{"abcdef", 6, "abcdef"},
		{"abcdefg", 6, "abc…"},
		{"ééééé", 7, "éé…"}, // 10 bytes; a cut never splits a rune
		{"abcdef", 2, "ab"}, // no room for the mark
		{"abcdef", 0, ""},
		{"abcdef", -1, ""},
	} {
		got := Text(c.in, c.max)
		if got != c.want {
			t.Errorf("Text(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
		if c.max >= 0 && len(got) > c.max {
			t.Errorf("Text(%q, %d) has %d bytes, over the limit", c.in, c.max, len(got))
		}
		if !utf8.ValidString(got) {
			t.Errorf("Text(%q, %d) = %q is not valid UTF-8", c.in, c.max, got)
		}
	}
}

// TestError: what a broker or database says is kept (it names the
// cause), but a multi-line or oversized message cannot forge log lines or
// fill a column.
func TestError(t *testing.T) {
	if Error(nil) != "" {
		t.Fatal("Error(nil) is not empty")
	}
	long := errors.New("broker said: " + strings.Repeat("é", 600) + "\n\x00tail\xff")
	got := Error(long)
	if len(got) > MaxErrorBytes || strings.ContainsAny(got, "\n\x00") || !strings.HasPrefix(got, "broker said: ") ||
		!strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Fatalf("Error: %q (len %d)", got, len(got))
	}
}

func FuzzText(f *testing.F) {
	f.Add("a\nb\xff\x1b", 5)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= 4096
		got := Text(s, n)
		if !utf8.ValidString(got) || strings.ContainsFunc(got, func(r rune) bool { return r < 0x20 || (r >= 0x7f && r < 0xa0) }) {
			t.Fatalf("Text(%q, %d) = %q", s, n, got)
		}
		if len(got) > max(n, 0) {
			t.Fatalf("Text(%q, %d) = %q: %d bytes", s, n, got, len(got))
		}
	})
}
