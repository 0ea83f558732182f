package ops_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/ops"
)

// Cleanup of the inbox and the effect ledger: only what is finished and
// older than the retention goes; cursors, open parked messages and open or
// unknown effects stay whatever their age.
func TestCleanupInboxAndEffects(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		old := time.Now().Add(-10 * 24 * time.Hour).UTC()
		recent := time.Now().Add(-24 * time.Hour).UTC()
		for i, at := range []time.Time{old, old, recent} {
			mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ('billing', 'acme', $1, $2, 'order', 'x', $3, 'order.created', $4)`, tn("inbox")), uuid.NewString(), []byte{1}, i+1, at)
		}
		mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at) VALUES ('billing', 'acme', 'order', 'x', 3, $1)`, tn("inbox_cursor")), old)
		for i, c := range []struct {
			resolved bool
		}{{true}, {false}} {
			q := fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, first_seen, last_seen, resolved_at) VALUES ('billing', 'poison', $1, $2, $2, $3)`, tn("inbox_parked"))
			var resolvedAt any
			if c.resolved {
				resolvedAt = old
			}
			mustExec(t, e, q, fmt.Sprint("k", i), old, resolvedAt)
		}
		for i, st := range []struct {
			state     string
			completed any
		}{{"succeeded", old}, {"failed", old}, {"succeeded", recent}, {"unknown", nil}, {"pending", nil}, {"in_flight", nil}} {
			mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (idem_key, consumer, event_id, step, target, operation, request, request_sha, state,
    next_attempt_at, created_at, updated_at, completed_at) VALUES ($1, 'billing', $2, 'charge', 'psp', 'charge', $3, $3, $4, $5, $5, $5, $6)`, tn("effects")),
				fmt.Sprint("fx1_", i), uuid.NewString(), []byte("x"), st.state, old, st.completed)
		}
		opts := ops.CleanupOptions{Retention: 8 * 24 * time.Hour, BatchSize: 1}
		dry, err := e.ops.Cleanup(ctx, opts, preview)
		if err != nil {
			t.Fatal(err)
		}
		if dry.Inbox != 2 || dry.ResolvedParked != 1 || dry.Effects != 2 {
			t.Fatalf("dry run %+v, want inbox 2, resolved parked 1, effects 2", dry)
		}
		res, err := e.ops.Cleanup(ctx, opts, approve)
		if err != nil {
			t.Fatal(err)
		}
		if res.Inbox != 2 || res.ResolvedParked != 1 || res.Effects != 2 || res.Batches < 5 {
			t.Fatalf("cleanup %+v", res)
		}
		for _, c := range []struct {
			q    string
			want int64
		}{
			{fmt.Sprintf(`SELECT count(*) FROM %s`, tn("inbox")), 1},
			{fmt.Sprintf(`SELECT count(*) FROM %s`, tn("inbox_cursor")), 1},
			{fmt.Sprintf(`SELECT count(*) FROM %s WHERE resolved_at IS NULL`, tn("inbox_parked")), 1},
			{fmt.Sprintf(`SELECT count(*) FROM %s`, tn("inbox_parked")), 1},
			{fmt.Sprintf(`SELECT count(*) FROM %s WHERE state IN ('unknown', 'pending', 'in_flight')`, tn("effects")), 3},
			{fmt.Sprintf(`SELECT count(*) FROM %s`, tn("effects")), 4},
		} {
			if n := count(t, e, c.q); n != c.want {
				t.Errorf("%s = %d, want %d", c.q, n, c.want)
			}
		}
	})
}

// RunCleanup is the scheduled mode: it refuses a bad retention at once and
// otherwise cleans on every tick until its context ends.
func TestRunCleanup(t *testing.T) {
	e := newSQLite(t)
	evs := e.insert(t, event("1", "a"), event("2", "a"))
	markSent(t, e, time.Now().Add(-10*24*time.Hour), evs[0].ID.String(), evs[1].ID.String())
	sched := ops.Approval{Actor: "relay/r1", Reason: "scheduled cleanup"}
	err := e.ops.RunCleanup(context.Background(), time.Hour, ops.CleanupOptions{Retention: time.Hour}, sched)
	if !errors.Is(err, ops.ErrRetentionTooShort) {
		t.Fatalf("bad retention: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- e.ops.RunCleanup(ctx, 10*time.Millisecond, ops.CleanupOptions{Retention: 8 * 24 * time.Hour}, sched)
	}()
	waitFor(t, "scheduled cleanup audited", func() bool {
		return count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s`, tn("ops_audit"))) == 1
	})
	if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s`, tn("outbox"))); n != 0 {
		t.Fatalf("%d outbox rows left", n)
	}
	time.Sleep(50 * time.Millisecond) // a few empty ticks
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunCleanup: %v", err)
	}
	audit, err := e.ops.Audit(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	// One audit row for the run that deleted; none for the empty ticks.
	if len(audit) != 1 || audit[0].Actor != "relay/r1" || audit[0].RowCount != 2 {
		t.Fatalf("audit %+v, want one row by relay/r1 for 2 rows", audit)
	}
}
