package main

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchCPUProfile: --cpuprofile on any bench writes a readable CPU
// profile, also when the bench fails (here on a bad flag value, named in
// the error).
func TestBenchCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	_, err := runCLI(t, "bench", "cleanup", "--cpuprofile", path, "--table", "ledger")
	if err == nil || !strings.Contains(err.Error(), "--table must be outbox or inbox") {
		t.Fatalf("bench cleanup --table ledger: %v, want the --table error", err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("the profile was not written: %v", err)
	}
	defer f.Close()
	// A CPU profile is a gzipped protocol buffer, complete only once
	// the profile was stopped.
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the profile is not gzip: %v", err)
	}
	if b, err := io.ReadAll(zr); err != nil || len(b) == 0 {
		t.Fatalf("the profile is truncated or empty: %d bytes, %v", len(b), err)
	}
}
