package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// TestSQLiteCancelAtAnyPointLeavesNoTrace cancels a large InsertTx call from
// another goroutine at varying moments, so that some cancels land before
// the call, some between its statements and some inside a statement. Every
// time, the caller's transaction must stay usable and commit its business
// row, and the call must have written all of its events or none (and no
// sequence bump). Without the uninterruptible statements of writeSQLite, a
// cancel inside a statement makes SQLite roll back the whole transaction:
// the commit then fails and the business row is lost.
func TestSQLiteCancelAtAnyPointLeavesNoTrace(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	const n, rounds = 500, 60
	count := func(q string) int64 {
		var v int64
		if err := db.QueryRowContext(ctx, q).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	batch := func() []ferry.Event {
		events := make([]ferry.Event, n)
		for i := range events {
			events[i] = ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%7), EventType: "order.touched", SchemaVersion: 1}
		}
		return events
	}
	// How long a whole call takes on this machine now, to spread the
	// cancels from before the call to after its end.
	start := time.Now()
	if _, err := w.Insert(ctx, batch()...); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	var whole, cancelled int
	for round := range rounds {
		events := batch()
		rowsBefore := count(`SELECT count(*) FROM ferry_outbox`)
		seqBefore := count(`SELECT coalesce(sum(last_seq), 0) FROM ferry_aggregate_seq`)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		biz := fmt.Sprintf("biz-%d", round)
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ($1)`, biz); err != nil {
			t.Fatal(err)
		}
		callCtx, cancel := context.WithCancel(ctx)
		stop := make(chan struct{})
		go func() {
			select {
			case <-time.After(took * time.Duration(round) / (rounds * 3 / 4)):
			case <-stop:
			}
			cancel()
		}()
		_, callErr := w.InsertTx(callCtx, tx, events...)
		close(stop)
		cancel()
		if callErr != nil && !errors.Is(callErr, context.Canceled) {
			_ = tx.Rollback()
			t.Fatalf("round %d: err = %v, want nil or context.Canceled", round, callErr)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("round %d: commit after the call (err %v): %v; the call must leave the transaction usable", round, callErr, err)
		}
		if got := count(fmt.Sprintf(`SELECT count(*) FROM orders WHERE id = '%s'`, biz)); got != 1 {
			t.Fatalf("round %d: business row lost (call err %v)", round, callErr)
		}
		rows, seq := count(`SELECT count(*) FROM ferry_outbox`)-rowsBefore, count(`SELECT coalesce(sum(last_seq), 0) FROM ferry_aggregate_seq`)-seqBefore
		switch {
		case callErr == nil && rows == n && seq == n:
			whole++
		case callErr != nil && rows == 0 && seq == 0:
			cancelled++
		default:
			t.Fatalf("round %d: call err %v, yet it left %d rows and %d sequence numbers (want all %d or none)", round, callErr, rows, seq, n)
		}
	}
	t.Logf("%d rounds (a whole call took %v): %d calls completed whole, %d cancelled without a trace", rounds, took, whole, cancelled)
	if cancelled == 0 {
		t.Fatal("no call was cancelled: the test exercised nothing")
	}
}
