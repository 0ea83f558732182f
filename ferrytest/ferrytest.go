// Package ferrytest helps users test code that writes to Ferry's outbox:
// read back what a transaction wrote and assert on it, against a real
// database (Postgres or SQLite), the same way river's rivertest does.
//
//	func TestPlaceOrder(t *testing.T) {
//		// ... run the code under test, which calls writer.InsertTx ...
//		ferrytest.RequireInserted(t, drv.Executor(), ferry.Tables{},
//			ferrytest.Want{EventType: "order.created", AggregateID: "o-1"})
//	}
package ferrytest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// Outbox returns every event in the outbox (any status), in insertion order.
func Outbox(tb testing.TB, exec driver.Executor, tables ferry.Tables) []ferry.Event {
	tb.Helper()
	events, err := ReadOutbox(context.Background(), exec, tables)
	if err != nil {
		tb.Fatalf("ferrytest: %v", err)
	}
	return events
}

// ReadOutbox is Outbox without a testing.TB.
func ReadOutbox(ctx context.Context, exec driver.Executor, tables ferry.Tables) ([]ferry.Event, error) {
	if err := tables.Check(); err != nil {
		return nil, err
	}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT CAST(event_id AS text), tenant_id, aggregate_type, aggregate_id, aggregate_seq,
		event_type, schema_version, content_type, payload, occurred_at, topic, shard,
		traceparent, correlation_id, causation_id, principal, action, target
		FROM %s ORDER BY id`, tables.Name("outbox")))
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	defer rows.Close()
	var out []ferry.Event
	for rows.Next() {
		var e ferry.Event
		var id string
		var occurred time.Time
		h := &e.Headers
		if err := rows.Scan(&id, &e.TenantID, &e.AggregateType, &e.AggregateID, &e.AggregateSeq, &e.EventType, &e.SchemaVersion,
			&e.ContentType, &e.Payload, &occurred, &e.Topic, &e.Shard,
			&h.Traceparent, &h.CorrelationID, &h.CausationID, &h.Principal, &h.Action, &h.Target); err != nil {
			return nil, fmt.Errorf("read outbox: %w", err)
		}
		if e.ID, err = uuid.Parse(id); err != nil {
			return nil, fmt.Errorf("read outbox: event_id %q: %w", id, err)
		}
		e.OccurredAt = occurred.UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// Want describes an expected event; empty fields match anything.
type Want struct {
	TenantID, AggregateType, AggregateID, EventType string
	AggregateSeq                                    int64
}

func (w Want) matches(e ferry.Event) bool {
	return (w.TenantID == "" || w.TenantID == e.TenantID) &&
		(w.AggregateType == "" || w.AggregateType == e.AggregateType) &&
		(w.AggregateID == "" || w.AggregateID == e.AggregateID) &&
		(w.EventType == "" || w.EventType == e.EventType) &&
		(w.AggregateSeq == 0 || w.AggregateSeq == e.AggregateSeq)
}

func (w Want) String() string {
	return fmt.Sprintf("{tenant=%q aggregate=%s/%s seq=%d type=%q}", w.TenantID, w.AggregateType, w.AggregateID, w.AggregateSeq, w.EventType)
}

// RequireInserted fails tb unless the outbox holds exactly len(want)
// events and the i-th matches want[i]. It returns the events.
func RequireInserted(tb testing.TB, exec driver.Executor, tables ferry.Tables, want ...Want) []ferry.Event {
	tb.Helper()
	got := Outbox(tb, exec, tables)
	if msg := diff(got, want); msg != "" {
		tb.Fatalf("ferrytest: outbox mismatch:\n%s", msg)
	}
	return got
}

func diff(got []ferry.Event, want []Want) string {
	var b strings.Builder
	if len(got) != len(want) {
		fmt.Fprintf(&b, "  have %d events, want %d\n", len(got), len(want))
	}
	for i := range max(len(got), len(want)) {
		switch {
		case i >= len(got):
			fmt.Fprintf(&b, "  [%d] missing, want %s\n", i, want[i])
		case i >= len(want):
			fmt.Fprintf(&b, "  [%d] unexpected %s/%s/%s seq %d %s\n", i, got[i].TenantID, got[i].AggregateType, got[i].AggregateID, got[i].AggregateSeq, got[i].EventType)
		case !want[i].matches(got[i]):
			fmt.Fprintf(&b, "  [%d] have %s/%s/%s seq %d %s, want %s\n", i, got[i].TenantID, got[i].AggregateType, got[i].AggregateID, got[i].AggregateSeq, got[i].EventType, want[i])
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return b.String()
}
