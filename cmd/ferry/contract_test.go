package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeContracts(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func runFerry(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String() + errOut.String(), err
}

func TestContractCheckCommand(t *testing.T) {
	v1 := `{"type":"object","required":["id"],"properties":{"id":{"type":"string"},"s":{"enum":["a","b"]}}}`
	old := writeContracts(t, map[string]string{"order.created/v1.json": v1})
	bad := writeContracts(t, map[string]string{"order.created/v1.json": v1,
		"order.created/v2.json": `{"type":"object","required":["id","qty"],"properties":{"id":{"type":"string"},"qty":{"type":"integer"},"s":{"enum":["a"]}}}`})
	out, err := runFerry(t, "contract", "check", old, bad, "--mode", "backward")
	var ec exitCodeError
	if !errors.As(err, &ec) || ec.code != 1 {
		t.Fatalf("err = %v, want exit 1; output:\n%s", err, out)
	}
	for _, want := range []string{"order.created v2 (against v1): new-required", "enum-removed", "2 breaking change(s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	safe := writeContracts(t, map[string]string{"order.created/v1.json": v1,
		"order.created/v2.json": `{"type":"object","required":["id"],"properties":{"id":{"type":"string"},"note":{"type":"string"},"s":{"enum":["a","b"]}}}`})
	if out, err := runFerry(t, "contract", "check", old, safe); err != nil || !strings.Contains(out, "no breaking changes (mode full") {
		t.Errorf("safe change: err = %v, output:\n%s", err, out)
	}
	if _, err := runFerry(t, "contract", "check", old, safe, "--mode", "sideways"); err == nil || !strings.Contains(err.Error(), "backward, forward or full") {
		t.Errorf("bad mode: err = %v", err)
	}
}

func TestContractTestCommand(t *testing.T) {
	dir := writeContracts(t, map[string]string{
		"order.created/v1.json":                       `{"type":"object","required":["id"],"properties":{"id":{"type":"string"}}}`,
		"order.created/v1.samples/a.json":             `{"id":"1"}`,
		"order.created/v1.samples/no-id.invalid.json": `{}`,
	})
	out, err := runFerry(t, "contract", "test", dir)
	if err != nil || !strings.Contains(out, "2 samples ok") {
		t.Fatalf("err = %v, output:\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "order.created/v1.samples/b.json"), []byte(`{"id":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = runFerry(t, "contract", "test", dir)
	var ec exitCodeError
	if !errors.As(err, &ec) || ec.code != 1 || !strings.Contains(out, "FAIL") || !strings.Contains(out, "at /id: rule type") {
		t.Fatalf("err = %v, want exit 1 naming /id and rule type; output:\n%s", err, out)
	}
}
