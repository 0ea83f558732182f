package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/ops"
)

func TestCleanupRefusesRetentionShorterThanWindow(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("1", "order.created"), event("2", "order.created"))
		markSent(t, e, time.Now().Add(-48*time.Hour), evs[0].ID.String(), evs[1].ID.String())
		before := snapshot(t, e, "outbox", "ops_audit")

		// Default window: broker dedup 2m, inbox replay horizon 168h.
		_, err := e.ops.Cleanup(ctx, ops.CleanupOptions{Retention: 24 * time.Hour}, approve)
		var re *ops.RetentionError
		if !errors.Is(err, ops.ErrRetentionTooShort) || !errors.As(err, &re) {
			t.Fatalf("err %v, want ErrRetentionTooShort", err)
		}
		for _, s := range []string{"24h0m0s", "168h0m0s", "2m0s"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not name %s", err, s)
			}
		}
		// Inbox rows must outlive outbox rows.
		_, err = e.ops.Cleanup(ctx, ops.CleanupOptions{Retention: 400 * time.Hour, InboxRetention: 200 * time.Hour}, approve)
		if !errors.Is(err, ops.ErrRetentionTooShort) || !strings.Contains(err.Error(), "200h0m0s") || !strings.Contains(err.Error(), "400h0m0s") {
			t.Fatalf("inbox shorter than outbox: err %v", err)
		}
		// A configured minimum above the stored setting wins.
		strict, err := ops.New(e.db, ops.WithMinimumWindow(ops.Window{InboxReplayHorizon: 30 * 24 * time.Hour}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := strict.Cleanup(ctx, ops.CleanupOptions{Retention: 200 * time.Hour}, approve); !errors.Is(err, ops.ErrRetentionTooShort) {
			t.Fatalf("WithMinimumWindow ignored: %v", err)
		}
		if after := snapshot(t, e, "outbox", "ops_audit"); after != before {
			t.Fatal("a refused cleanup changed the tables")
		}

		// Negative control: the same request once the window is lowered
		// (audited) deletes the rows — the guard is what kept them.
		if _, err := e.ops.SetReplayWindow(ctx, ops.Window{BrokerDedupWindow: 2 * time.Minute, InboxReplayHorizon: time.Hour}, approve); err != nil {
			t.Fatal(err)
		}
		res, err := e.ops.Cleanup(ctx, ops.CleanupOptions{Retention: 24 * time.Hour}, approve)
		if err != nil || res.Outbox != 2 {
			t.Fatalf("cleanup after lowering the window: %+v %v", res, err)
		}
	})
}

func TestCleanupBatchesDeleteOnlyEligibleRows(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		old := time.Now().Add(-10 * 24 * time.Hour)
		var evs []ferry.Event
		for i := 0; i < 23; i++ {
			evs = append(evs, event(fmt.Sprint("agg-", i%5), "order.created"))
		}
		evs = e.insert(t, evs...)
		var oldIDs []string
		for _, ev := range evs[:13] {
			oldIDs = append(oldIDs, ev.ID.String())
		}
		markSent(t, e, old, oldIDs...)
		markSent(t, e, time.Now().Add(-time.Hour), evs[13].ID.String(), evs[14].ID.String()) // recent: kept
		markDead(t, e, evs[15].ID.String(), evs[16].ID.String())
		if _, err := e.ops.DiscardDead(ctx, ops.Filter{EventIDs: []string{evs[16].ID.String()}}, approve); err != nil {
			t.Fatal(err)
		}
		// discarded long ago
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET discarded_at = $1 WHERE event_id = $2`, tn("outbox")), old.UTC(), evs[16].ID.String())
		// evs[17:] stay pending, even though created "old"
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET created_at = $1 WHERE status = 'pending'`, tn("outbox")), old.UTC())

		opts := ops.CleanupOptions{Retention: 8 * 24 * time.Hour, BatchSize: 5}
		before := snapshot(t, e, "outbox")
		dry, err := e.ops.Cleanup(ctx, opts, preview)
		if err != nil || !dry.DryRun || dry.Outbox != 13 || dry.Discarded != 0 {
			t.Fatalf("dry run %+v %v", dry, err)
		}
		if snapshot(t, e, "outbox") != before {
			t.Fatal("dry-run cleanup changed the outbox")
		}
		res, err := e.ops.Cleanup(ctx, opts, approve)
		if err != nil {
			t.Fatal(err)
		}
		// 13 rows in batches of 5: 5, 5, 3.
		if res.Outbox != 13 || res.Batches < 3 || res.AuditID == 0 {
			t.Fatalf("cleanup %+v, want 13 outbox rows in >= 3 batches", res)
		}
		if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s`, tn("outbox"))); n != 10 {
			t.Fatalf("%d rows left, want 10 (2 recent sent, 2 dead, 6 pending)", n)
		}
		if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s WHERE status = 'dead'`, tn("outbox"))); n != 2 {
			t.Fatalf("dead rows deleted without IncludeDiscarded: %d left", n)
		}
		opts.IncludeDiscarded = true
		res, err = e.ops.Cleanup(ctx, opts, approve)
		if err != nil || res.Discarded != 1 || res.Outbox != 0 {
			t.Fatalf("cleanup with discarded %+v %v", res, err)
		}
		if _, err := e.ops.Message(ctx, evs[15].ID.String()); err != nil {
			t.Fatalf("an undiscarded dead letter was deleted: %v", err)
		}
		audit, _ := e.ops.Audit(ctx, 10)
		if len(audit) < 2 || audit[0].Action != "cleanup" || audit[0].RowCount != 1 {
			t.Fatalf("audit %+v", audit)
		}
	})
}

func TestCapacityGuard(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.insert(t, event("1", "a"), event("2", "a"), event("3", "a"))
		if err := ops.CheckCapacity(ctx, e.exec, tables, 4); err != nil {
			t.Fatalf("3 pending under cap 4: %v", err)
		}
		err := ops.CheckCapacity(ctx, e.exec, tables, 3)
		var full *ops.OutboxFullError
		if !errors.Is(err, ops.ErrOutboxFull) || !errors.As(err, &full) || full.Cap != 3 || full.Pending != 3 {
			t.Fatalf("at cap: %v", err)
		}
		now := time.Now()
		g, err := ops.NewCapacityGuard(e.exec, 4, ops.WithCapacityRefresh(time.Minute), ops.WithCapacityClock(func() time.Time { return now }))
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Check(ctx); err != nil {
			t.Fatal(err)
		}
		e.insert(t, event("4", "a"))
		if err := g.Check(ctx); err != nil {
			t.Fatalf("cached count should be reused within the refresh: %v", err)
		}
		now = now.Add(time.Minute)
		if err := g.Check(ctx); !errors.Is(err, ops.ErrOutboxFull) {
			t.Fatalf("after refresh: %v, want ErrOutboxFull", err)
		}
	})
}
