package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/claimcheck"
	"github.com/ferryhq/ferry/outbox"
)

// TestClaimCheckSweepCLI: a committed large event and a rolled-back one,
// both blobs aged past the grace period: the preview counts one orphan and
// deletes nothing; --approve --reason deletes the orphan only, with an
// audit row; bad flags are refused by name.
func TestClaimCheckSweepCLI(t *testing.T) {
	ctx := context.Background()
	url := "sqlite:" + filepath.Join(t.TempDir(), "cc.db")
	if out, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	s, err := openStore(ctx, url, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir := t.TempDir()
	bucket := "file://" + dir
	st, err := claimcheck.Open(ctx, bucket, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	w, err := outbox.New(s.sql, outbox.WithClaimCheck(st))
	if err != nil {
		t.Fatal(err)
	}
	ev := func(agg string) ferry.Event {
		return ferry.Event{TenantID: "acme", AggregateType: "doc", AggregateID: agg, EventType: "doc.uploaded", SchemaVersion: 1,
			Payload: []byte(`{"body":"` + strings.Repeat("x", 64) + `"}`)}
	}
	kept, err := w.Insert(ctx, ev("kept"))
	if err != nil {
		t.Fatal(err)
	}
	tx, dtx, err := s.sql.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := w.InsertTx(ctx, tx, ev("rolled-back"))
	if err != nil {
		t.Fatal(err)
	}
	if err := dtx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for _, e := range []ferry.Event{kept[0], gone[0]} {
		if err := os.Chtimes(filepath.Join(dir, claimcheck.Key(e.ID)), old, old); err != nil {
			t.Fatal(err)
		}
	}
	blobThere := func(e ferry.Event) bool {
		_, err := os.Stat(filepath.Join(dir, claimcheck.Key(e.ID)))
		return err == nil
	}
	args := []string{"claimcheck", "sweep", "--database-url", url, "--bucket", bucket, "--retention", "192h"}
	out, err := runCLI(t, args...)
	if err != nil || !strings.Contains(out, "DRY RUN claimcheck.sweep: 1 orphaned blob(s) would be deleted") || !strings.Contains(out, "referenced 1") {
		t.Fatalf("preview: %v\n%s", err, out)
	}
	if !blobThere(gone[0]) {
		t.Fatal("the preview deleted a blob")
	}
	out, err = runCLI(t, append(args, "--approve", "--actor", "ops", "--reason", "nightly")...)
	if err != nil || !strings.Contains(out, "claimcheck.sweep: 1 orphaned blob(s) deleted (audit #") {
		t.Fatalf("approve: %v\n%s", err, out)
	}
	if blobThere(gone[0]) || !blobThere(kept[0]) {
		t.Fatalf("after the sweep: orphan there %v, committed blob there %v; want false, true", blobThere(gone[0]), blobThere(kept[0]))
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"claimcheck", "sweep", "--database-url", url, "--retention", "192h"}, "--bucket"},
		{append(args, "--grace", "10s"), "--grace"},
		{[]string{"claimcheck", "sweep", "--database-url", url, "--bucket", bucket}, "--retention"},
		{[]string{"claimcheck", "sweep", "--database-url", url, "--bucket", "nope://x", "--retention", "192h"}, "--bucket"},
	} {
		out, err := runCLI(t, tc.args...)
		if err == nil || !strings.Contains(err.Error()+out, tc.want) {
			t.Errorf("%v: %v\n%s, want an error naming %s", tc.args, err, out, tc.want)
		}
	}
}
