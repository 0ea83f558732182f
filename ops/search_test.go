package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/ops"
)

// SearchOutbox pages by key through every criterion, on both dialects:
// every matching row once, in the search's order, none that does not match.
func TestSearchOutbox(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		var evs []ferry.Event
		for i := range 30 {
			ev := event(fmt.Sprintf("o-%d", i%3), "order.updated")
			if i%2 == 1 {
				ev.TenantID = "globex"
			}
			evs = append(evs, ev)
		}
		got := e.insert(t, evs...)
		markDead(t, e, got[4].ID.String(), got[5].ID.String(), got[6].ID.String())
		markSent(t, e, time.Now(), got[0].ID.String(), got[1].ID.String())
		if _, err := e.ops.DiscardDead(ctx, ops.Filter{EventIDs: []string{got[6].ID.String()}}, approve); err != nil {
			t.Fatal(err)
		}

		all := func(q ops.OutboxQuery) []ops.OutboxMessage {
			t.Helper()
			var out []ops.OutboxMessage
			for pages := 0; ; pages++ {
				if pages > 40 {
					t.Fatal("no end of pages")
				}
				p, err := e.ops.SearchOutbox(ctx, q)
				if err != nil {
					t.Fatalf("search %+v: %v", q, err)
				}
				if len(p.Rows) > max(q.Limit, 1) {
					t.Fatalf("page of %d rows, limit %d", len(p.Rows), q.Limit)
				}
				out = append(out, p.Rows...)
				if p.NextCursor == "" {
					return out
				}
				q.After = p.NextCursor
			}
		}
		// Everything, newest first, 7 a page.
		rows := all(ops.OutboxQuery{Limit: 7})
		if len(rows) != 30 {
			t.Fatalf("got %d rows, want 30", len(rows))
		}
		for i := 1; i < len(rows); i++ {
			if rows[i].ID >= rows[i-1].ID {
				t.Fatalf("not newest first at %d: %d after %d", i, rows[i].ID, rows[i-1].ID)
			}
		}
		// An aggregate: its sequence in order.
		agg := all(ops.OutboxQuery{AggregateType: "order", AggregateID: "o-1", TenantID: "acme", Limit: 2})
		if len(agg) != 5 {
			t.Fatalf("aggregate rows %d, want 5", len(agg))
		}
		for i, m := range agg {
			if m.AggregateSeq != int64(i+1) || m.AggregateID != "o-1" || m.TenantID != "acme" {
				t.Fatalf("aggregate row %d: seq %d %s/%s", i, m.AggregateSeq, m.TenantID, m.AggregateID)
			}
		}
		if n := len(all(ops.OutboxQuery{TenantID: "globex", Limit: 4})); n != 15 {
			t.Fatalf("tenant globex: %d rows, want 15", n)
		}
		if r := all(ops.OutboxQuery{CorrelationID: "corr-o-2", Limit: 3}); len(r) != 10 || r[0].CorrelationID != "corr-o-2" {
			t.Fatalf("correlation: %d rows", len(r))
		}
		if r := all(ops.OutboxQuery{EventID: strings.ToUpper(got[3].ID.String())}); len(r) != 1 || r[0].EventID != got[3].ID.String() {
			t.Fatalf("event id: %+v", r)
		}
		for status, want := range map[string]int{"dead": 2, "discarded": 1, "sent": 2, "pending": 25} {
			r := all(ops.OutboxQuery{Status: status, Limit: 10})
			if len(r) != want {
				t.Fatalf("status %s: %d rows, want %d", status, len(r), want)
			}
		}
		// Time range: rows created before now+1h and after now-1h: all; an
		// empty window: none.
		now := time.Now()
		if n := len(all(ops.OutboxQuery{Since: now.Add(-time.Hour), Until: now.Add(time.Hour), Limit: 100})); n != 30 {
			t.Fatalf("time range: %d", n)
		}
		// A time range alone pages by (created_at, id), newest first.
		tr := all(ops.OutboxQuery{Since: now.Add(-time.Hour), Limit: 7})
		seen := map[int64]bool{}
		for i, m := range tr {
			if seen[m.ID] {
				t.Fatalf("time range: row %d twice", m.ID)
			}
			seen[m.ID] = true
			if i > 0 && (m.CreatedAt.After(tr[i-1].CreatedAt) || (m.CreatedAt.Equal(tr[i-1].CreatedAt) && m.ID > tr[i-1].ID)) {
				t.Fatalf("time range not newest first at %d", i)
			}
		}
		if len(tr) != 30 {
			t.Fatalf("time range pages: %d rows, want 30", len(tr))
		}
		// Ties and times whose milliseconds end in 0 (SQLite keeps them as
		// text, "…00.120+00:00"): still every row once, in order.
		base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		for i, ev := range got {
			var at any = base.Add(time.Duration(i/3) * 10 * time.Millisecond).Format("2006-01-02 15:04:05.000+00:00")
			if e.dialect == driver.MySQL { // DATETIME(6) takes no zone suffix
				at = base.Add(time.Duration(i/3) * 10 * time.Millisecond)
			}
			mustExec(t, e, fmt.Sprintf(`UPDATE %s SET created_at = $1 WHERE event_id = $2`, tn("outbox")), at, ev.ID.String())
		}
		tied := all(ops.OutboxQuery{Since: base.Add(-time.Hour), Until: base.Add(time.Hour), Limit: 4})
		ids := map[int64]bool{}
		for i, m := range tied {
			if ids[m.ID] || (i > 0 && (m.CreatedAt.After(tied[i-1].CreatedAt) || (m.CreatedAt.Equal(tied[i-1].CreatedAt) && m.ID > tied[i-1].ID))) {
				t.Fatalf("tied time range: row %d at %d repeated or out of order", m.ID, i)
			}
			ids[m.ID] = true
		}
		if len(tied) != 30 {
			t.Fatalf("tied time range pages: %d rows, want 30", len(tied))
		}
		if n := len(all(ops.OutboxQuery{Since: now.Add(time.Hour)})); n != 0 {
			t.Fatalf("future window: %d", n)
		}
		// Bad input names the field.
		for field, q := range map[string]ops.OutboxQuery{
			"event_id":     {EventID: "nope"},
			"aggregate_id": {AggregateType: "order"},
			"status":       {Status: "lost"},
			"until":        {Since: now, Until: now.Add(-time.Second)},
			"limit":        {Limit: ops.MaxSearchLimit + 1},
			"after":        {After: "x"},
		} {
			_, err := e.ops.SearchOutbox(ctx, q)
			var ae *ops.ArgError
			if !errors.As(err, &ae) || ae.Field != field {
				t.Errorf("%s: got %v", field, err)
			}
		}
	})
}

func TestAuditPageAndReveal(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		got := e.insert(t, event("a", "order.created"), event("b", "order.created"))
		markDead(t, e, got[0].ID.String(), got[1].ID.String())
		bob := ops.Approval{Approve: true, Actor: "bob", Reason: "INC-7"}
		for i := range 5 {
			a := approve
			if i%2 == 0 {
				a = bob
			}
			if _, err := e.ops.RetryDead(ctx, ops.Filter{EventIDs: []string{got[0].ID.String()}}, a); err != nil {
				t.Fatal(err)
			}
			markDead(t, e, got[0].ID.String())
		}
		// Newest first, by key, total on each page.
		var seen []int64
		f := ops.AuditFilter{Limit: 2}
		for {
			p, err := e.ops.AuditPage(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if p.Total != 5 {
				t.Fatalf("total %d", p.Total)
			}
			for _, r := range p.Rows {
				seen = append(seen, r.ID)
			}
			if p.NextCursor == "" {
				break
			}
			f.After = p.NextCursor
		}
		if len(seen) != 5 || seen[0] < seen[4] {
			t.Fatalf("audit ids %v", seen)
		}
		p, err := e.ops.AuditPage(ctx, ops.AuditFilter{Actor: "bob", Action: "dlq.retry"})
		if err != nil || p.Total != 3 || len(p.Rows) != 3 || p.Rows[0].Actor != "bob" {
			t.Fatalf("bob's retries: %+v %v", p, err)
		}
		// Reveal: refused without approval or reason, audited when approved.
		if _, err := e.ops.RevealPayload(ctx, got[1].ID.String(), ops.Approval{Actor: "alice"}); err == nil {
			t.Fatal("reveal without approval")
		}
		if _, err := e.ops.RevealPayload(ctx, got[1].ID.String(), ops.Approval{Approve: true, Actor: "alice"}); !errors.Is(err, ops.ErrReasonRequired) {
			t.Fatalf("reveal without reason: %v", err)
		}
		before := count(t, e, "SELECT count(*) FROM "+tn("ops_audit"))
		r, err := e.ops.RevealPayload(ctx, got[1].ID.String(), ops.Approval{Approve: true, Actor: "alice", Reason: "customer asked (TICKET-9)"})
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Payload) != `{"n":1}` || r.AuditID == 0 {
			t.Fatalf("revealed %+v", r)
		}
		if n := count(t, e, "SELECT count(*) FROM "+tn("ops_audit")+" WHERE action = 'outbox.reveal_payload' AND actor = 'alice' AND row_count = 1"); n != 1 || before+1 != count(t, e, "SELECT count(*) FROM "+tn("ops_audit")) {
			t.Fatalf("reveal audit rows: %d", n)
		}
	})
}
