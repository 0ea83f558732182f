package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// MySQL and MariaDB (driver/mysql): the writer sends one sequence upsert
// per aggregate of the call, in key order, and one multi-row INSERT per
// chunk of events, all under the savepoint of insertChecked.
//
// The upsert
//
//	INSERT INTO aggregate_seq … VALUES (…, LAST_INSERT_ID(n))
//	ON DUPLICATE KEY UPDATE last_seq = LAST_INSERT_ID(last_seq + n)
//
// takes the aggregate's row lock (an exclusive record lock InnoDB holds to
// commit), which serialises the writers of one aggregate: commit order =
// sequence order. Its reply carries the new last_seq as the statement's
// last insert id, so allocating costs no extra round trip (measured against
// SELECT … FOR UPDATE + UPDATE/INSERT, docs/MYSQL.md). Aggregates are
// locked in key order (binary collation: the order InnoDB's index keeps),
// so two calls over the same aggregates cannot deadlock on each other.
//
// A failed statement rolls back only itself on InnoDB, so the savepoint is
// what undoes the sequence bumps of a call that fails later (duplicate id,
// sequence conflict). A deadlock is the exception: InnoDB rolls back the
// whole transaction (the caller's business writes too) and no savepoint can
// keep it; the error wraps driver.ErrDeadlock and the caller retries the
// transaction. Nothing is lost silently: the event and the business change
// are gone together.

// mysqlChunkRows and mysqlChunkBytes bound one INSERT statement (the
// server's max_allowed_packet is 16 MiB on MariaDB, 64 MiB on MySQL 8).
const (
	mysqlChunkRows  = 500
	mysqlChunkBytes = 4 << 20
)

const mysqlCols = `(event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at,
    traceparent, correlation_id, causation_id, principal, action, target, next_attempt_at)`

func mysqlSeqSQL(t ferry.Tables) string {
	return fmt.Sprintf(`INSERT INTO %s (tenant_id, aggregate_type, aggregate_id, last_seq) VALUES ($1, $2, $3, LAST_INSERT_ID($4))
ON DUPLICATE KEY UPDATE last_seq = LAST_INSERT_ID(last_seq + $4)`, t.Name("aggregate_seq"))
}

// mysqlInsertSQL renders the INSERT of n rows (19 arguments per row,
// next_attempt_at from the database clock).
func mysqlInsertSQL(t ferry.Tables, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "INSERT INTO %s %s VALUES ", t.Name("outbox"), mysqlCols)
	for r := range n {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range 19 {
			fmt.Fprintf(&b, "$%d, ", r*19+c+1)
		}
		b.WriteString("NOW(6))")
	}
	return b.String()
}

// resultExecer is implemented by the databasesql executor.
type resultExecer interface {
	ExecResult(ctx context.Context, sql string, args ...any) (sql.Result, error)
}

// mysqlSeq runs the sequence upsert and returns the aggregate's new
// last_seq.
func (w *Writer[TTx]) mysqlSeq(ctx context.Context, exec driver.Executor, k aggKey, n int64) (int64, error) {
	args := []any{k.tenant, k.typ, k.id, n}
	if re, ok := exec.(resultExecer); ok {
		res, err := re.ExecResult(ctx, w.seq, args...)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	// An executor wrapped by the caller: ask for the value. The read never
	// waits, and is not cancelled: a cancel while its rows are open would
	// make go-sql-driver close the connection (ctx is checked after it).
	if _, err := exec.Exec(ctx, w.seq, args...); err != nil {
		return 0, err
	}
	var v int64
	if _, err := driver.QueryRow(context.WithoutCancel(ctx), exec, `SELECT LAST_INSERT_ID()`, nil, &v); err != nil {
		return 0, err
	}
	return v, nil
}

// writeMySQL runs under the savepoint of insertChecked. ctx is checked
// between statements, so a cancel between them leaves the transaction
// usable (the savepoint is rolled back); a cancel while a statement runs
// makes go-sql-driver close the connection, and the server rolls the
// transaction back, as on Postgres.
func (w *Writer[TTx]) writeMySQL(ctx context.Context, exec driver.Executor, events []ferry.Event, plan batchPlan) error {
	aggs := slices.Clone(plan.aggs)
	slices.SortFunc(aggs, func(a, b aggKey) int {
		if c := strings.Compare(a.tenant, b.tenant); c != 0 {
			return c
		}
		if c := strings.Compare(a.typ, b.typ); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	last := make(map[aggKey]int64, len(aggs))
	for _, k := range aggs {
		if err := ctx.Err(); err != nil {
			return err
		}
		v, err := w.mysqlSeq(ctx, exec, k, plan.count[k])
		if err != nil {
			return err
		}
		if v < plan.count[k] {
			return fmt.Errorf("sequence upsert returned last_seq %d for %d events", v, plan.count[k])
		}
		last[k] = v
	}
	for i := range events {
		e := &events[i]
		k := aggKey{e.TenantID, e.AggregateType, e.AggregateID}
		e.AggregateSeq = last[k] - plan.count[k] + plan.ord[i]
	}
	for start := 0; start < len(events); {
		end, size := start, 0
		for end < len(events) && end-start < mysqlChunkRows && (end == start || size+len(events[end].Payload) <= mysqlChunkBytes) {
			size += len(events[end].Payload)
			end++
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		q := w.insert
		if n := end - start; n != 1 {
			q = mysqlInsertSQL(w.cfg.tables, n)
		}
		args := make([]any, 0, (end-start)*19)
		for i := start; i < end; i++ {
			e := &events[i]
			payload := e.Payload
			if payload == nil {
				payload = []byte{}
			}
			h := e.Headers
			args = append(args, e.ID.String(), e.TenantID, e.AggregateType, e.AggregateID, e.AggregateSeq,
				e.EventType, e.SchemaVersion, e.Topic, e.Shard, w.cfg.shards, e.ContentType, payload, e.OccurredAt,
				h.Traceparent, h.CorrelationID, h.CausationID, h.Principal, h.Action, h.Target)
		}
		if _, err := exec.Exec(ctx, q, args...); err != nil {
			var uv *driver.UniqueViolationError
			if errors.As(err, &uv) && strings.Contains(uv.Constraint, "event_id") {
				return duplicateOf(events, -1, uv.Detail, err)
			}
			return err
		}
		start = end
	}
	return nil
}
