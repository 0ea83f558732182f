package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/ops"
)

func TestDLQRetryDryRunThenApprove(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("1", "order.created"), event("2", "order.created"), event("3", "order.paid"), event("4", "order.created"))
		markDead(t, e, evs[0].ID.String(), evs[1].ID.String(), evs[2].ID.String())
		f := ops.Filter{EventType: "order.created"}

		before := snapshot(t, e, "outbox", "ops_audit")
		res, err := e.ops.RetryDead(ctx, f, preview)
		if err != nil {
			t.Fatal(err)
		}
		if !res.DryRun || res.Rows != 2 || len(res.Sample) != 2 || res.AuditID != 0 {
			t.Fatalf("dry run result %+v, want 2 rows previewed, no audit", res)
		}
		if after := snapshot(t, e, "outbox", "ops_audit"); after != before {
			t.Fatalf("dry run changed the tables:\nbefore:\n%s\nafter:\n%s", before, after)
		}

		// Refused without a reason or an actor, even approved.
		if _, err := e.ops.RetryDead(ctx, f, ops.Approval{Approve: true, Actor: "alice"}); !errors.Is(err, ops.ErrReasonRequired) {
			t.Fatalf("no reason: err %v, want ErrReasonRequired", err)
		}
		if _, err := e.ops.RetryDead(ctx, f, ops.Approval{Approve: true, Reason: "x"}); !errors.Is(err, ops.ErrActorRequired) {
			t.Fatalf("no actor: err %v, want ErrActorRequired", err)
		}
		if _, err := e.ops.RetryDead(ctx, ops.Filter{}, approve); !errors.Is(err, ops.ErrEmptyFilter) {
			t.Fatalf("empty filter: err %v, want ErrEmptyFilter", err)
		}
		if after := snapshot(t, e, "outbox", "ops_audit"); after != before {
			t.Fatal("a refused action changed the tables")
		}

		res, err = e.ops.RetryDead(ctx, f, approve)
		if err != nil {
			t.Fatal(err)
		}
		if res.DryRun || res.Rows != 2 || res.AuditID == 0 {
			t.Fatalf("approved result %+v", res)
		}
		for _, ev := range evs[:2] {
			m, err := e.ops.Message(ctx, ev.ID.String())
			if err != nil {
				t.Fatal(err)
			}
			if m.Status != "pending" || m.Attempts != 0 || m.NextAttemptAt.After(time.Now().Add(time.Second)) {
				t.Fatalf("retried row %+v, want pending with attempts 0 due now", m)
			}
		}
		if m, _ := e.ops.Message(ctx, evs[2].ID.String()); m.Status != "dead" {
			t.Fatalf("row outside the filter changed: %+v", m)
		}
		audit, err := e.ops.Audit(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(audit) != 1 {
			t.Fatalf("audit rows %d, want 1", len(audit))
		}
		a := audit[0]
		if a.ID != res.AuditID || a.Actor != "alice" || a.Action != "dlq.retry" || a.RowCount != 2 || a.Reason != approve.Reason ||
			!strings.Contains(a.Filter, "order.created") || !strings.Contains(a.IDs, evs[0].ID.String()) || !strings.Contains(a.IDs, evs[1].ID.String()) {
			t.Fatalf("audit row %+v", a)
		}
		// Filter by failure reason (last_error), matched literally.
		if dead, err := e.ops.ListDead(ctx, ops.Filter{ErrorContains: "schema"}, false); err != nil || len(dead) != 1 {
			t.Fatalf("by error text: %+v %v", dead, err)
		}
		if dead, err := e.ops.ListDead(ctx, ops.Filter{ErrorContains: "sch%"}, false); err != nil || len(dead) != 0 {
			t.Fatalf("%% matched as a wildcard: %+v %v", dead, err)
		}
		// The retried rows are no longer dead letters: a second retry finds nothing.
		res, err = e.ops.RetryDead(ctx, f, preview)
		if err != nil || res.Rows != 0 {
			t.Fatalf("second preview %+v %v, want 0 rows", res, err)
		}
	})
}

func TestDLQDiscardKeepsRowAsEvidence(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("1", "order.created"), event("2", "order.created"))
		markDead(t, e, evs[0].ID.String(), evs[1].ID.String())
		res, err := e.ops.DiscardDead(ctx, ops.Filter{EventIDs: []string{evs[0].ID.String()}}, approve)
		if err != nil || res.Rows != 1 {
			t.Fatalf("discard %+v %v", res, err)
		}
		m, err := e.ops.Message(ctx, evs[0].ID.String())
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != "dead" || m.DiscardedAt == nil {
			t.Fatalf("discarded row %+v, want kept with status dead and discarded_at", m)
		}
		if n := count(t, e, fmt.Sprintf(`SELECT discard_audit_id FROM %s WHERE event_id = $1`, tn("outbox")), evs[0].ID.String()); n != res.AuditID {
			t.Fatalf("discard_audit_id %d, want %d", n, res.AuditID)
		}
		dead, err := e.ops.ListDead(ctx, ops.Filter{}, false)
		if err != nil || len(dead) != 1 || dead[0].EventID != evs[1].ID.String() {
			t.Fatalf("DLQ after discard: %+v %v", dead, err)
		}
		all, _ := e.ops.ListDead(ctx, ops.Filter{}, true)
		if len(all) != 2 {
			t.Fatalf("DLQ with discarded: %d rows, want 2", len(all))
		}
		st, err := e.ops.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Outbox.Dead != 1 || st.Outbox.Discarded != 1 {
			t.Fatalf("status outbox %+v, want 1 dead and 1 discarded", st.Outbox)
		}
	})
}

func TestReplayResetsSentRowsWithSameIDs(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("1", "order.created"), event("1", "order.paid"), event("2", "order.created"))
		for _, ev := range evs {
			markSent(t, e, time.Now(), ev.ID.String())
		}
		if _, err := e.ops.Replay(ctx, ops.Filter{}, approve); !errors.Is(err, ops.ErrEmptyFilter) {
			t.Fatalf("empty filter: %v", err)
		}
		f := ops.Filter{AggregateType: "order", AggregateID: "1"}
		before := snapshot(t, e, "outbox", "ops_audit")
		if res, err := e.ops.Replay(ctx, f, preview); err != nil || res.Rows != 2 {
			t.Fatalf("preview %+v %v", res, err)
		}
		if snapshot(t, e, "outbox", "ops_audit") != before {
			t.Fatal("replay preview changed the tables")
		}
		res, err := e.ops.Replay(ctx, f, approve)
		if err != nil || res.Rows != 2 || res.AuditID == 0 {
			t.Fatalf("replay %+v %v", res, err)
		}
		for i, ev := range evs {
			m, err := e.ops.Message(ctx, ev.ID.String())
			if err != nil {
				t.Fatal(err)
			}
			want := "pending"
			if i == 2 {
				want = "sent"
			}
			if m.Status != want || m.EventID != ev.ID.String() {
				t.Fatalf("row %d: %+v, want status %s and the same event id", i, m, want)
			}
		}
		if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s`, tn("outbox"))); n != 3 {
			t.Fatalf("replay must not add rows: %d", n)
		}
	})
}

func TestFilterValidation(t *testing.T) {
	e := newSQLite(t)
	ctx := context.Background()
	for _, f := range []ops.Filter{
		{EventIDs: []string{"not-a-uuid"}},
		{OlderThan: -time.Second},
		{Limit: ops.MaxActionLimit + 1},
		{Since: time.Now(), Until: time.Now().Add(-time.Hour)},
	} {
		if _, err := e.ops.RetryDead(ctx, f, approve); !errors.Is(err, ops.ErrInvalidArgument) {
			t.Errorf("filter %+v: err %v, want ErrInvalidArgument", f, err)
		}
	}
}
