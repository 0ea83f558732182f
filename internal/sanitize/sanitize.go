// Package sanitize is Ferry's one rule for text that leaves a component
// in a log line, a stored error column or an error message, when the text
// came from outside (a broker's error, a consumed message's field, a
// user's flag): valid UTF-8 (invalid bytes become U+FFFD), no control
// characters (each becomes a space, so a value cannot forge a log line or
// a terminal escape), and bounded (cut on a rune boundary, marked "…",
// never longer than the limit).
//
// It makes text safe to print; it does not decide what may be printed.
// Payloads are never passed to it (they are not logged at all), and a
// secret must be kept out before (the CDC relay drops a connection
// string's parse error for this reason).
package sanitize

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxErrorBytes bounds an error's text in logs and stored error columns
// (outbox last_error, inbox parked error).
const MaxErrorBytes = 1024

// ellipsis marks cut text.
const ellipsis = "…"

// Text returns s as valid UTF-8 without control characters, at most max
// bytes (cut text ends in "…", counted in max).
func Text(s string, max int) string {
	if clean(s) {
		return Cut(s, max)
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return Cut(s, max)
}

// Error is Text(err.Error(), MaxErrorBytes), or "" for a nil err.
func Error(err error) string {
	if err == nil {
		return ""
	}
	return Text(err.Error(), MaxErrorBytes)
}

// Cut returns s unchanged if it has at most max bytes; otherwise its
// longest prefix that ends on a rune boundary and, with "…" appended,
// fits in max bytes. A max below 0 counts as 0.
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	mark := ellipsis
	if max < len(mark) {
		mark = ""
	}
	cut := max - len(mark)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// clean reports whether s is valid UTF-8 without control characters (the
// common case, which then needs no copy).
func clean(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return false
		}
	}
	return true
}
