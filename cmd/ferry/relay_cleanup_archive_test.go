package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/outbox"
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

// TestRelayCleanupArchive: the relay's scheduled cleanup with
// --cleanup-archive deletes old sent rows only after archiving them, and
// `ferry archive verify` counts as many archived rows as were deleted.
// Negative: an archive that cannot take the objects (its outbox/ folder
// is a file) leaves every row in place while the relay runs.
func TestRelayCleanupArchive(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	url := "sqlite:" + filepath.Join(dir, "src.db")
	if out, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	s, err := openStore(ctx, url, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := outbox.New(s.sql)
	if err != nil {
		t.Fatal(err)
	}
	var evs []ferry.Event
	for i := range 12 {
		evs = append(evs, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprint(i), EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{"x":1}`)})
	}
	if _, err := w.Insert(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'sent', published_at = $1`, time.Now().Add(-300*time.Hour).UTC()); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		var n int
		if _, err := driver.QueryRow(ctx, s.Executor(), `SELECT COUNT(*) FROM ferry_outbox`, nil, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// runRelay runs the relay until until() holds or d passes.
	runRelay := func(archiveURL string, d time.Duration, until func() bool) {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := runCLIContext(rctx, "relay", "--database-url", url, "--broker-url", "embedded", "--embedded-dir", filepath.Join(t.TempDir(), "n"),
				"--subjects", "order.events", "--provision", "--listen", "", "--cleanup-interval", "100ms", "--cleanup-retention", "240h", "--cleanup-archive", archiveURL)
			done <- err
		}()
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) && !until() {
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("relay: %v", err)
		}
	}

	blocked := filepath.Join(dir, "blocked")
	if err := os.MkdirAll(blocked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blocked, "outbox"), []byte("not a folder"), 0o600); err != nil {
		t.Fatal(err)
	}
	runRelay("file://"+blocked, 1500*time.Millisecond, func() bool { return false })
	if n := count(); n != 12 {
		t.Fatalf("blocked archive: %d outbox rows left, want all 12 (nothing deleted without a confirmed archive)", n)
	}

	arch := "file://" + filepath.Join(dir, "archive") + "?create_dir=1"
	runRelay(arch, 20*time.Second, func() bool { return count() == 0 })
	if n := count(); n != 0 {
		t.Fatalf("good archive: %d outbox rows left, want 0", n)
	}
	out, err := runCLI(t, "archive", "verify", arch)
	if err != nil || !strings.Contains(out, "12 rows, outbox 12") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}
