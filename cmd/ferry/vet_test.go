package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/vet/dualwrite/dualwritetest"
)

// TestVetCommand runs `ferry vet` on the analyzer's fixture module (real
// client libraries): it must list the shapes package's findings, none from
// the clean package, and exit 1.
func TestVetCommand(t *testing.T) {
	dir := dualwritetest.Fixture(t)
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"vet", "--dir", dir, "./..."})
	err := root.Execute()
	var ec exitCodeError
	if !errors.As(err, &ec) || ec.code != 1 {
		t.Fatalf("ferry vet: err = %v, want exit status 1; stderr: %s", err, errOut.String())
	}
	got := out.String()
	for _, want := range []string{"PublishAfterCommit publishes nats.Conn.Publish after commit", "in a goroutine started from PublishInGoroutine", "inside the transaction"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "clean.go") {
		t.Errorf("finding in the clean fixture:\n%s", got)
	}
	if n := strings.Count(got, "dual write:"); n != 11 {
		t.Errorf("%d findings, want 11:\n%s", n, got)
	}
}
