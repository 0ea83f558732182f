package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRelayCleanupArchiveValidated: a --cleanup-archive the archive package
// cannot open refuses to start the relay, naming the flag; so does one
// without --cleanup-interval. Control: the same relay with a good archive
// URL gets past the check and stops at the retention guard instead.
func TestRelayCleanupArchiveValidated(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "x.db")
	if _, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	relay := func(extra ...string) error {
		args := append([]string{"relay", "--database-url", url, "--broker-url", "embedded", "--embedded-dir", filepath.Join(t.TempDir(), "n"),
			"--subjects", "order.events", "--provision", "--listen", ""}, extra...)
		_, err := runCLI(t, args...)
		return err
	}
	if err := relay("--cleanup-interval", "1m", "--cleanup-retention", "720h", "--cleanup-archive", "bogus://nowhere"); err == nil || !strings.Contains(err.Error(), "--cleanup-archive") {
		t.Fatalf("bad URL: err = %v, want an error naming --cleanup-archive", err)
	}
	if err := relay("--cleanup-archive", "file://"+t.TempDir()); err == nil || !strings.Contains(err.Error(), "--cleanup-archive") || !strings.Contains(err.Error(), "--cleanup-interval") {
		t.Fatalf("no interval: err = %v", err)
	}
	// Control: a valid archive passes; the too-short retention is what stops it.
	err := relay("--cleanup-interval", "1m", "--cleanup-retention", "1s", "--cleanup-archive", "file://"+t.TempDir())
	if err == nil || strings.Contains(err.Error(), "--cleanup-archive") || !strings.Contains(err.Error(), "--cleanup-retention") {
		t.Fatalf("control: err = %v, want the retention refusal only", err)
	}
}
