package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/statebench"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestPartitionedOutboxCLI: ferry migrate up --partition-outbox makes a
// partitioned outbox and refuses, naming the flag, another interval and
// SQLite; ferry cleanup previews, then drops, a partition of sent rows of
// a day 8 days ago, and says so.
func TestPartitionedOutboxCLI(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	if out, err := runCLI(t, "migrate", "up", "--database-url", s.URL, "--partition-outbox", "24h"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "migrate", "up", "--database-url", s.URL, "--partition-outbox", "1h"); err == nil || !strings.Contains(err.Error()+out, "--partition-outbox") {
		t.Fatalf("another interval: %v\n%s", err, out)
	}
	lite := "sqlite:" + filepath.Join(t.TempDir(), "p.db")
	if out, err := runCLI(t, "migrate", "up", "--database-url", lite, "--partition-outbox", "24h"); err == nil || !strings.Contains(err.Error()+out, "--partition-outbox") {
		t.Fatalf("sqlite: %v\n%s", err, out)
	}
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(-8 * 24 * time.Hour)
	if _, err := partition.Create(ctx, pgxv5.New(s.Pool).Executor(), ferry.Tables{}, partition.Outbox, day, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := statebench.Prefill(ctx, s.Pool, ferry.Tables{}, statebench.Fill{Topic: "cli.order", Marked: 50, Aggregates: 5,
		PayloadBytes: 10, MarkedStatus: true, At: day.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	name := partition.Name(ferry.Tables{}, partition.Outbox, day)
	out, err := runCLI(t, "cleanup", "--database-url", s.URL, "--older-than", "168h")
	if err != nil || !strings.Contains(out, "outbox partition "+name) || !strings.Contains(out, "would drop") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	out, err = runCLI(t, "cleanup", "--database-url", s.URL, "--older-than", "168h", "--approve", "--reason", "cli test", "--actor", "alice")
	if err != nil || !strings.Contains(out, "outbox partition "+name) || !strings.Contains(out, "dropped (outbox locked exclusively") {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	var n int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = $1`, name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("partition %s still there (%d, %v)", name, n, err)
	}
}

// TestPartitionedInboxCLI: ferry migrate up --partition-inbox makes a
// partitioned inbox and refuses, naming the flag, another interval and
// SQLite; ferry migrate sql --partition-inbox prints its DDL; ferry
// cleanup previews, then drops, a partition of claims of a day 8 days
// ago applied then, and says so.
func TestPartitionedInboxCLI(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	if out, err := runCLI(t, "migrate", "up", "--database-url", s.URL, "--partition-inbox", "24h"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "migrate", "up", "--database-url", s.URL, "--partition-inbox", "1h"); err == nil || !strings.Contains(err.Error()+out, "--partition-inbox") {
		t.Fatalf("another interval: %v\n%s", err, out)
	}
	lite := "sqlite:" + filepath.Join(t.TempDir(), "p.db")
	if out, err := runCLI(t, "migrate", "up", "--database-url", lite, "--partition-inbox", "24h"); err == nil || !strings.Contains(err.Error()+out, "--partition-inbox") {
		t.Fatalf("sqlite: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "migrate", "sql", "--partition-inbox", "24h"); err != nil || !strings.Contains(out, "PARTITION BY RANGE (event_id)") || !strings.Contains(out, `PARTITION OF "ferry_inbox" DEFAULT`) {
		t.Fatalf("migrate sql: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "migrate", "sql", "--dialect", "mysql", "--partition-inbox", "24h"); err == nil || !strings.Contains(err.Error()+out, "--partition-inbox") {
		t.Fatalf("migrate sql mysql: %v\n%s", err, out)
	}
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(-8 * 24 * time.Hour)
	if _, err := partition.Create(ctx, pgxv5.New(s.Pool).Executor(), ferry.Tables{}, partition.Inbox, day, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		id, err := partition.UUIDv7At(day.Add(time.Duration(i) * time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Pool.Exec(ctx, `INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ('shipping', 'acme', $1, '\x00', 'order', 'o', $2, 'order.created', $3)`, id, i+1, day.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	name := partition.Name(ferry.Tables{}, partition.Inbox, day)
	out, err := runCLI(t, "cleanup", "--database-url", s.URL, "--older-than", "168h")
	if err != nil || !strings.Contains(out, "inbox partition "+name) || !strings.Contains(out, "would drop") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	out, err = runCLI(t, "cleanup", "--database-url", s.URL, "--older-than", "168h", "--approve", "--reason", "cli test", "--actor", "alice")
	if err != nil || !strings.Contains(out, "inbox partition "+name) || !strings.Contains(out, "dropped (inbox locked exclusively") {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	var n int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = $1`, name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("partition %s still there (%d, %v)", name, n, err)
	}
}
