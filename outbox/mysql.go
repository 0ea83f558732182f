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
// last_seq and whether the upsert created its row.
func (w *Writer[TTx]) mysqlSeq(ctx context.Context, exec driver.Executor, k aggKey, n int64) (last int64, created bool, err error) {
	args := []any{k.tenant, k.typ, k.id, n}
	if re, ok := exec.(resultExecer); ok {
		res, err := re.ExecResult(ctx, w.seq, args...)
		if err != nil {
			return 0, false, err
		}
		affected, err := res.RowsAffected()
		if err != nil {
			return 0, false, err
		}
		last, err = res.LastInsertId()
		// ON DUPLICATE KEY UPDATE reports 1 for an insert, 2 for an update.
		return last, affected == 1, err
	}
	// An executor wrapped by the caller: ask for the value. The read never
	// waits, and is not cancelled: a cancel while its rows are open would
	// make go-sql-driver close the connection (ctx is checked after it).
	affected, err := exec.Exec(ctx, w.seq, args...)
	if err != nil {
		return 0, false, err
	}
	if _, err := driver.QueryRow(context.WithoutCancel(ctx), exec, `SELECT LAST_INSERT_ID()`, nil, &last); err != nil {
		return 0, false, err
	}
	return last, affected == 1, nil
}

// writeMySQL runs under the savepoint of insertChecked. ctx is checked
// between statements, so a cancel between them leaves the transaction
// usable (the savepoint is rolled back); a cancel while a statement runs
// makes go-sql-driver close the connection, and the server rolls the
// transaction back, as on Postgres.
func (w *Writer[TTx]) writeMySQL(ctx context.Context, exec driver.Executor, events []ferry.Event, plan batchPlan, undo *[]seqUndo) error {
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
		v, created, err := w.mysqlSeq(ctx, exec, k, plan.count[k])
		if err != nil {
			return err
		}
		if undo != nil {
			*undo = append(*undo, seqUndo{k: k, n: plan.count[k], created: created})
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

// seqUndo is what one sequence upsert of a call did.
type seqUndo struct {
	k       aggKey
	n       int64
	created bool
}

// mysqlOneChunk reports whether a call's events fit one INSERT.
func mysqlOneChunk(events []ferry.Event) bool {
	if len(events) > mysqlChunkRows {
		return false
	}
	size := 0
	for i := range events {
		size += len(events[i].Payload)
	}
	return len(events) == 1 || size <= mysqlChunkBytes
}

// insertMySQLFast writes a call without caller-supplied versions that fits
// one INSERT, without a savepoint: two round trips fewer than
// insertChecked, which is most of the producer's cost next to a
// hand-written insert (docs/PERFORMANCE.md). A failed statement rolls back
// only itself on InnoDB, so a call that fails after its sequence upserts
// (a duplicate id, a cancel between statements) undoes them itself while
// it still holds their row locks: a row it created is deleted, a bump is
// subtracted. The transaction is then usable with nothing of the call in
// it, as with the savepoint.
//
// It does not undo after an error that may have ended the transaction on
// the server (a deadlock, a lock wait timeout — innodb_rollback_on_timeout
// ends it — or a lost connection): the undo would then run outside the
// transaction. Those errors say to roll the transaction back.
func (w *Writer[TTx]) insertMySQLFast(ctx context.Context, exec driver.Executor, events []ferry.Event, plan batchPlan) ([]ferry.Event, error) {
	undo := make([]seqUndo, 0, len(plan.aggs))
	err := w.mapWriteErr(w.writeMySQL(ctx, exec, events, plan, &undo), events)
	if err == nil {
		return events, nil
	}
	if len(undo) == 0 {
		return nil, err
	}
	var de *ferry.DuplicateEventIDError
	if !errors.As(err, &de) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, errors.Join(err, errors.New("outbox: the call's sequence upserts may remain: roll the transaction back"))
	}
	// A cancel that reached a statement in flight closed the connection:
	// the undo below then fails and says so.
	undoCtx := context.WithoutCancel(ctx)
	for i := len(undo) - 1; i >= 0; i-- {
		u := undo[i]
		q, args := w.seqUndoUpdate, []any{u.k.tenant, u.k.typ, u.k.id, u.n}
		if u.created {
			q, args = w.seqUndoDelete, args[:3]
		}
		if _, uerr := exec.Exec(undoCtx, q, args...); uerr != nil {
			return nil, errors.Join(err, fmt.Errorf("outbox: undo sequence (roll the transaction back): %w", uerr))
		}
	}
	return nil, err
}

func mysqlSeqUndoSQL(t ferry.Tables) (update, del string) {
	where := `WHERE tenant_id = $1 AND aggregate_type = $2 AND aggregate_id = $3`
	return fmt.Sprintf(`UPDATE %s SET last_seq = last_seq - $4 %s`, t.Name("aggregate_seq"), where),
		fmt.Sprintf(`DELETE FROM %s %s`, t.Name("aggregate_seq"), where)
}
