package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/vet/dualwrite/dualwritetest"
)

// TestGoVetVettool builds ferry-vet and runs `go vet -vettool=…` on the
// analyzer's fixture module: the findings come back through go vet, which
// exits non-zero.
func TestGoVetVettool(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary and runs go vet")
	}
	bin := filepath.Join(t.TempDir(), "ferry-vet")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := dualwritetest.Fixture(t)
	cmd := exec.Command("go", "vet", "-vettool="+bin, "./shapes", "./clean")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("go vet succeeded, want findings:\n%s", out)
	}
	s := string(out)
	if !strings.Contains(s, "dual write: PublishAfterCommit") || !strings.Contains(s, "in a defer of PublishInDefer") {
		t.Errorf("go vet output lacks the findings:\n%s", s)
	}
	if strings.Contains(s, "clean.go") {
		t.Errorf("finding in the clean fixture:\n%s", s)
	}
}
