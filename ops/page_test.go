package ops_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/ops"
)

const pageRows = 2500

// seedParked inserts n open parked rows for consumer billing (and one for
// another consumer, which filters must leave out).
func seedParked(t *testing.T, e *env, n int) {
	t.Helper()
	now := time.Now().UTC()
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, first_seen, last_seen, tenant_id, aggregate_type, aggregate_id, aggregate_seq)
%s
SELECT 'billing', 'gap', %s, $1, $1, 'acme', 'order', %s, i FROM n`, tn("inbox_parked"), seqCTE(n), cat(e, "'k'", "i"), cat(e, "'a'", "i")), now)
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, first_seen, last_seen) VALUES ('shipping', 'gap', 'other', $1, $1)`, tn("inbox_parked")), now)
}

// seedFailedEffects inserts n failed effect intents of consumer billing.
func seedFailedEffects(t *testing.T, e *env, n int) {
	t.Helper()
	id := "gen_random_uuid()"
	switch e.dialect {
	case driver.SQLite:
		id = "lower(hex(randomblob(16)))"
	case driver.MySQL:
		id = "UUID()"
	}
	old := time.Now().Add(-time.Hour).UTC()
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (idem_key, consumer, event_id, step, target, operation, request, request_sha, state,
    next_attempt_at, created_at, updated_at, completed_at, last_error)
%s
SELECT %s, 'billing', %s, 'charge', 'psp', 'charge', $1, $1, 'failed', $2, $2, $2, $2, 'refused' FROM n`, tn("effects"), seqCTE(n), cat(e, "'fx_'", "i"), id), []byte("x"), old)
}

// seedDead inserts n outbox rows and marks them dead.
func seedDead(t *testing.T, e *env, n int) {
	t.Helper()
	for start := 0; start < n; start += 500 {
		evs := make([]ferry.Event, 0, 500)
		for i := start; i < min(n, start+500); i++ {
			evs = append(evs, event(fmt.Sprint("d", i), "order.created"))
		}
		e.insert(t, evs...)
	}
	mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'dead', attempts = 5, last_error = 'rejected'`, tn("outbox")))
}

// walk reads every page through list, checking each row is seen once, the
// total on every page and the number of pages.
func walk[T any](t *testing.T, what string, total, limit int, id func(T) int64,
	list func(after string) (ops.Page[T], error)) {
	t.Helper()
	seen := map[int64]bool{}
	after, pages := "", 0
	last := int64(0)
	for {
		p, err := list(after)
		if err != nil {
			t.Fatalf("%s page %d: %v", what, pages+1, err)
		}
		pages++
		if p.Total != int64(total) {
			t.Fatalf("%s page %d: total %d, want %d", what, pages, p.Total, total)
		}
		if len(p.Rows) > limit {
			t.Fatalf("%s page %d: %d rows > limit %d", what, pages, len(p.Rows), limit)
		}
		for _, r := range p.Rows {
			k := id(r)
			if seen[k] {
				t.Fatalf("%s: row %d seen twice", what, k)
			}
			if k <= last {
				t.Fatalf("%s: row %d after %d: not in id order", what, k, last)
			}
			seen[k], last = true, k
		}
		if p.NextCursor == "" {
			break
		}
		if pages > total/limit+2 {
			t.Fatalf("%s: more than %d pages", what, pages)
		}
		after = p.NextCursor
	}
	if len(seen) != total {
		t.Fatalf("%s: saw %d rows over %d pages, want %d", what, len(seen), pages, total)
	}
	if want := (total + limit - 1) / limit; pages != want {
		t.Fatalf("%s: %d pages, want %d", what, pages, want)
	}
}

// TestListPaging: 2,500 parked messages, dead letters and failed effects
// listed 1,000 at a time come in 3 pages by cursor, every row once, in id
// order, with the right total on each page; filters apply to rows and
// total alike; a cursor that is not one is refused naming the field, and
// actions refuse a cursor.
func TestListPaging(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		seedParked(t, e, pageRows)
		seedFailedEffects(t, e, pageRows)
		seedDead(t, e, pageRows)
		walk(t, "parked", pageRows, 1000, func(p ops.ParkedMessage) int64 { return p.ID }, func(after string) (ops.Page[ops.ParkedMessage], error) {
			return e.ops.ListParkedPage(ctx, ops.ParkedFilter{Consumer: "billing", Limit: 1000, After: after})
		})
		walk(t, "parked (all consumers)", pageRows+1, 1000, func(p ops.ParkedMessage) int64 { return p.ID }, func(after string) (ops.Page[ops.ParkedMessage], error) {
			return e.ops.ListParkedPage(ctx, ops.ParkedFilter{Limit: 1000, After: after})
		})
		walk(t, "effects", pageRows, 1000, func(f ops.FailedEffect) int64 { return f.ID }, func(after string) (ops.Page[ops.FailedEffect], error) {
			return e.ops.ListFailedEffectsPage(ctx, ops.EffectFilter{Consumer: "billing", Limit: 1000, After: after})
		})
		walk(t, "dlq", pageRows, 1000, func(m ops.OutboxMessage) int64 { return m.ID }, func(after string) (ops.Page[ops.OutboxMessage], error) {
			return e.ops.ListDeadPage(ctx, ops.Filter{Limit: 1000, After: after}, false)
		})
		// The default page is DefaultActionLimit rows.
		p, err := e.ops.ListDeadPage(ctx, ops.Filter{}, false)
		if err != nil || len(p.Rows) != ops.DefaultActionLimit || p.NextCursor == "" || p.Total != pageRows {
			t.Fatalf("default page: %d rows, cursor %q, total %d, %v", len(p.Rows), p.NextCursor, p.Total, err)
		}
		// A filter narrows the total too.
		p2, err := e.ops.ListParkedPage(ctx, ops.ParkedFilter{AggregateID: "a7"})
		if err != nil || len(p2.Rows) != 1 || p2.Total != 1 || p2.NextCursor != "" {
			t.Fatalf("filtered page: %d rows, total %d, cursor %q, %v", len(p2.Rows), p2.Total, p2.NextCursor, err)
		}
		var ae *ops.ArgError
		if _, err := e.ops.ListParkedPage(ctx, ops.ParkedFilter{After: "x1"}); !errors.As(err, &ae) || ae.Field != "filter.after" {
			t.Fatalf("bad cursor: %v", err)
		}
		if _, err := e.ops.RetryDead(ctx, ops.Filter{All: true, After: p.NextCursor}, ops.Approval{}); !errors.As(err, &ae) || ae.Field != "filter.after" {
			t.Fatalf("action with a cursor: %v", err)
		}
	})
}
