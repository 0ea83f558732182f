// Package dualwritetest gives tests a loadable copy of the dualwrite
// analyzer's fixture module (vet/dualwrite/testdata).
//
// The fixture module replaces github.com/ferryhq/ferry with this checkout,
// so its requirements and checksums must be the main module's. The copy in
// testdata keeps a snapshot for running go vet by hand; Fixture rebuilds
// go.mod and go.sum from the main module's current ones, so a dependency
// added to the main module later does not break the analyzer's tests.
package dualwritetest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Fixture copies the fixture module into a temporary directory with go.mod
// and go.sum derived from the main module, and returns its path.
func Fixture(tb testing.TB) string {
	tb.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("dualwritetest: cannot locate the fixture")
	}
	src := filepath.Join(filepath.Dir(self), "..", "testdata")
	root := filepath.Join(filepath.Dir(self), "..", "..", "..")
	dst := tb.TempDir()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if rel == "go.mod" || rel == "go.sum" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		tb.Fatalf("dualwritetest: copy fixture: %v", err)
	}
	mainMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		tb.Fatalf("dualwritetest: %v", err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		tb.Fatalf("dualwritetest: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		tb.Fatal(err)
	}
	var mod strings.Builder
	mod.WriteString("module example.com/svc\n\ngo 1.26.0\n\nrequire github.com/ferryhq/ferry v0.0.0\n\nreplace github.com/ferryhq/ferry => " + abs + "\n\n")
	if i := strings.Index(string(mainMod), "\nrequire"); i >= 0 {
		mod.WriteString(string(mainMod)[i+1:])
	}
	if err := os.WriteFile(filepath.Join(dst, "go.mod"), []byte(mod.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "go.sum"), sum, 0o644); err != nil {
		tb.Fatal(err)
	}
	return dst
}
