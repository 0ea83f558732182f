package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// `ferry relay --mode cdc` end to end: events committed before and after
// the relay starts are published (to the embedded JetStream) and recorded
// as sent in the outbox, which the CDC relay does only after broker acks.
func TestRelayCDCModeCLI(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	ctx := context.Background()
	var level string
	if err := s.Pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil || level != "logical" {
		testenv.Unavailable(t, "Postgres wal_level=logical (have %q, %v); .ci/run sets it", level, err)
	}
	drv := pgxv5.New(s.Pool)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	insert := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%7),
				EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	slot := "ferry_cli_" + strings.TrimPrefix(s.Schema, "ferry_test_")
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = s.Pool.Exec(cctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
		_, _ = s.Pool.Exec(cctx, fmt.Sprintf(`DROP PUBLICATION IF EXISTS %q`, slot))
	})
	insert(0, 20) // committed while no relay runs: must come from the table/slot

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := runCLIContext(rctx, "relay", "--mode", "cdc", "--database-url", s.URL, "--broker-url", "embedded",
			"--embedded-dir", filepath.Join(t.TempDir(), "nats"), "--subjects", "order.events", "--provision",
			"--slot", slot, "--publication", slot, "--listen", "", "--log-level", "warn")
		done <- err
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay exited with %v", err)
		}
	}()
	insert(20, 50) // committed while it streams
	deadline := time.Now().Add(60 * time.Second)
	for {
		var sent, total int
		if err := s.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'sent' AND broker_receipt <> ''), count(*) FROM ferry_outbox`).Scan(&sent, &total); err != nil {
			t.Fatal(err)
		}
		if sent == 50 && total == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: %d of %d rows sent by the CDC relay", sent, total)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRelayRejectsUnknownMode(t *testing.T) {
	if _, err := runCLI(t, "relay", "--mode", "magic", "--database-url", "sqlite:x.db"); err == nil || !strings.Contains(err.Error(), `"poll" or "cdc"`) {
		t.Fatalf("err = %v", err)
	}
}

// A scheduled cleanup with a retention below the replay window must refuse
// to start the relay, naming both numbers, rather than fail in the background.
func TestRelayScheduledCleanupRefusesShortRetention(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "x.db")
	if _, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
		t.Fatal(err)
	}
	_, err := runCLI(t, "relay", "--database-url", url, "--broker-url", "embedded", "--embedded-dir", filepath.Join(t.TempDir(), "n"),
		"--subjects", "order.events", "--provision", "--listen", "", "--cleanup-interval", "1m", "--cleanup-retention", "1s")
	if err == nil || !strings.Contains(err.Error(), "--cleanup-retention") || !strings.Contains(err.Error(), "window") {
		t.Fatalf("err = %v", err)
	}
}
