package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// SQLite has no data-modifying CTEs, so the writer sends one upsert per
// aggregate and one insert per event. Round trips are function calls there,
// and the database write lock (taken at BEGIN IMMEDIATE or at the first
// write) already serialises writers, so commit order = sequence order.
func sqliteInsertSQL(t ferry.Tables) string {
	return fmt.Sprintf(`INSERT INTO %s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)`, t.Name("outbox"))
}

func sqliteSeqSQL(t ferry.Tables) string {
	return fmt.Sprintf(`INSERT INTO %[1]s (tenant_id, aggregate_type, aggregate_id, last_seq) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant_id, aggregate_type, aggregate_id) DO UPDATE SET last_seq = %[1]s.last_seq + excluded.last_seq
RETURNING last_seq`, t.Name("aggregate_seq"))
}

// writeSQLite runs under the savepoint of insertChecked. Its statements run
// with a context that is never cancelled, and ctx is checked between them:
// SQLite answers an interrupted write inside a transaction by rolling back
// the whole transaction (the caller's business writes too, and the
// savepoint with them), after which database/sql would run the caller's
// next statements outside any transaction. Checking between statements
// keeps a cancelled call to "nothing written, transaction usable"; each
// statement is a single-row write, so a cancel takes effect within one.
func (w *Writer[TTx]) writeSQLite(ctx context.Context, exec driver.Executor, events []ferry.Event, plan batchPlan) error {
	stmtCtx := context.WithoutCancel(ctx)
	last := make(map[aggKey]int64, len(plan.aggs))
	for _, k := range plan.aggs {
		if err := ctx.Err(); err != nil {
			return err
		}
		var v int64
		if _, err := driver.QueryRow(stmtCtx, exec, w.seq, []any{k.tenant, k.typ, k.id, plan.count[k]}, &v); err != nil {
			return err
		}
		last[k] = v
	}
	now := w.cfg.now().UTC()
	for i := range events {
		if err := ctx.Err(); err != nil {
			return err
		}
		e := &events[i]
		k := aggKey{e.TenantID, e.AggregateType, e.AggregateID}
		e.AggregateSeq = last[k] - plan.count[k] + plan.ord[i]
		payload := e.Payload
		if payload == nil {
			payload = []byte{}
		}
		h := e.Headers
		if _, err := exec.Exec(stmtCtx, w.insert, e.ID.String(), e.TenantID, e.AggregateType, e.AggregateID, e.AggregateSeq,
			e.EventType, e.SchemaVersion, e.Topic, e.Shard, w.cfg.shards, e.ContentType, payload, e.OccurredAt,
			h.Traceparent, h.CorrelationID, h.CausationID, h.Principal, h.Action, h.Target, now); err != nil {
			var uv *driver.UniqueViolationError
			if errors.As(err, &uv) && strings.Contains(uv.Constraint, "event_id") {
				return duplicateOf(events, i, "", err)
			}
			return err
		}
	}
	return nil
}
