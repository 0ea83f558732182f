package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/archive"
	"github.com/ferryhq/ferry/outbox"
)

// cleanup --archive, archive verify and archive restore end to end through
// the CLI on SQLite: rows archived then deleted, verify passes, restore
// into a second database twice inserts once, a flipped byte fails verify
// and restore.
func TestArchiveCLI(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	src, dst := "sqlite:"+filepath.Join(dir, "src.db"), "sqlite:"+filepath.Join(dir, "dst.db")
	arch := "file://" + filepath.Join(dir, "archive") + "?create_dir=1"
	for _, u := range []string{src, dst} {
		if out, err := runCLI(t, "migrate", "up", "--database-url", u); err != nil {
			t.Fatalf("migrate: %v\n%s", err, out)
		}
	}
	s, err := openStore(ctx, src, ferry.Tables{})
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

	// An archive that cannot take the objects (its outbox/ folder is a
	// file) fails the cleanup and deletes nothing: the run below still
	// finds all 12 rows.
	blocked := filepath.Join(dir, "blocked")
	if err := os.MkdirAll(blocked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blocked, "outbox"), []byte("not a folder"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "cleanup", "--database-url", src, "--older-than", "240h", "--batch-size", "5", "--archive", "file://"+blocked, "--approve", "--reason", "test")
	if err == nil || !strings.Contains(err.Error(), "nothing deleted") {
		t.Fatalf("cleanup into a blocked archive: %v\n%s", err, out)
	}
	out, err = runCLI(t, "cleanup", "--database-url", src, "--older-than", "240h", "--batch-size", "5", "--archive", arch, "--approve", "--reason", "test")
	if err != nil || !strings.Contains(out, "archived 12 rows to file://") || !strings.Contains(out, "outbox 12") {
		t.Fatalf("cleanup --archive: %v\n%s", err, out)
	}
	out, err = runCLI(t, "archive", "verify", arch)
	if err != nil || !strings.Contains(out, "3 of 3 objects verified, 12 rows, outbox 12") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	out, err = runCLI(t, "archive", "restore", arch, "--into", dst)
	if err != nil || !strings.Contains(out, "DRY RUN: would restore up to 12 rows from 3 objects") {
		t.Fatalf("restore dry run: %v\n%s", err, out)
	}
	for _, want := range []string{"restored 12 rows from 3 objects; 0 were already present", "restored 0 rows from 3 objects; 12 were already present"} {
		out, err = runCLI(t, "archive", "restore", arch, "--into", dst, "--approve", "--reason", "inspect")
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("restore: %v\n%s\nwant %q", err, out, want)
		}
	}
	if _, err := runCLI(t, "archive", "restore", arch, "--approve", "--reason", "x"); err == nil || !strings.Contains(err.Error(), "--into") {
		t.Fatalf("restore without --into: %v", err)
	}

	// Flip one byte: verify and restore fail, naming the object.
	objs, _ := filepath.Glob(filepath.Join(dir, "archive", "outbox", "*"+archive.DataSuffix))
	b, err := os.ReadFile(objs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0x40
	if err := os.WriteFile(objs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	name := "outbox/" + filepath.Base(objs[0])
	out, err = runCLI(t, "archive", "verify", arch)
	if err == nil || !strings.Contains(out, "FAIL digest") || !strings.Contains(out, name) || !strings.Contains(out, "2 of 3 objects verified") {
		t.Fatalf("verify of a corrupted archive: %v\n%s", err, out)
	}
	if out, err = runCLI(t, "archive", "restore", arch, "--into", dst, "--approve", "--reason", "x"); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("restore of a corrupted archive: %v\n%s", err, out)
	}
}
