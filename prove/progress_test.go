package prove

import (
	"bytes"
	"strings"
	"testing"
)

// To a pipe or a file, progress is plain lines, rate-limited: no carriage
// returns, no escape codes, and a burst of updates writes one line.
func TestProgressPlainWhenNotATerminal(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf)
	if p.tty {
		t.Fatal("a bytes.Buffer taken for a terminal")
	}
	p.scenario(1, 2, "relay-sigkill")
	for i := 0; i < 1000; i++ {
		p.update("%d events", i)
	}
	p.done()
	out := buf.String()
	if strings.ContainsAny(out, "\r\033") {
		t.Fatalf("redraw codes written to a non-terminal: %q", out)
	}
	if lines := strings.Count(out, "\n"); lines != 1 {
		t.Fatalf("%d lines for a start and a burst of 1000 updates, want 1 (the start): %q", lines, out)
	}
	if !strings.Contains(out, "[1/2] relay-sigkill: starting\n") {
		t.Fatalf("output %q", out)
	}
	// On a terminal the line is redrawn in place.
	var tty bytes.Buffer
	q := &progress{w: &tty, tty: true}
	q.scenario(1, 1, "x")
	q.done()
	if !strings.Contains(tty.String(), "\r\033[K") {
		t.Fatalf("terminal progress %q lacks the redraw", tty.String())
	}
}
