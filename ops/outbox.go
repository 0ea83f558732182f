package ops

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/driver"
)

// OutboxMessage is one outbox row as operators see it: everything except
// the payload bytes (only their size), which may hold personal data.
// Status is the row's state, pending, sent or dead: under a watermark
// relay (relay.WithSentWatermark) a sent row's status column may still be
// 'pending' and an unsent one's 'retry'.
type OutboxMessage struct {
	ID            int64      `json:"id"`
	EventID       string     `json:"event_id"`
	TenantID      string     `json:"tenant_id"`
	AggregateType string     `json:"aggregate_type"`
	AggregateID   string     `json:"aggregate_id"`
	AggregateSeq  int64      `json:"aggregate_seq"`
	EventType     string     `json:"event_type"`
	SchemaVersion int        `json:"schema_version"`
	Topic         string     `json:"topic"`
	Shard         int        `json:"shard"`
	PayloadBytes  int64      `json:"payload_bytes"`
	OccurredAt    time.Time  `json:"occurred_at"`
	CreatedAt     time.Time  `json:"created_at"`
	Traceparent   string     `json:"traceparent,omitempty"`
	CorrelationID string     `json:"correlation_id,omitempty"`
	CausationID   string     `json:"causation_id,omitempty"`
	Principal     string     `json:"principal,omitempty"`
	Action        string     `json:"action,omitempty"`
	Target        string     `json:"target,omitempty"`
	Status        string     `json:"status"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt time.Time  `json:"next_attempt_at"`
	LastError     string     `json:"last_error,omitempty"`
	PublishedAt   *time.Time `json:"published_at,omitempty"`
	BrokerReceipt string     `json:"broker_receipt,omitempty"`
	DiscardedAt   *time.Time `json:"discarded_at,omitempty"`
}

func (o *Ops) outboxCols() string { return o.outboxColsWith("status") }

// outboxReadCols are outboxCols for a read shown to an operator: status is
// the row's state, which under a watermark relay is not its status column
// (see watermarked). One primary-key lookup of the shard's lease per
// 'pending' row.
func (o *Ops) outboxReadCols(ctx context.Context, exec driver.Executor) (string, error) {
	wm, err := o.watermarked(ctx, exec)
	if err != nil || !wm {
		return o.outboxCols(), err
	}
	return o.outboxColsWith(o.stateExpr()), nil
}

func (o *Ops) outboxColsWith(status string) string {
	size := o.payloadSize()
	return "id, " + o.uuidText("event_id") + `, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
		topic, shard, ` + size + `, occurred_at, created_at, traceparent, correlation_id, causation_id, principal, action, target,
		` + status + `, attempts, next_attempt_at, last_error, published_at, broker_receipt, discarded_at`
}

func scanOutbox(rows driver.Rows) (OutboxMessage, error) {
	var m OutboxMessage
	err := rows.Scan(&m.ID, &m.EventID, &m.TenantID, &m.AggregateType, &m.AggregateID, &m.AggregateSeq, &m.EventType, &m.SchemaVersion,
		&m.Topic, &m.Shard, &m.PayloadBytes, &m.OccurredAt, &m.CreatedAt, &m.Traceparent, &m.CorrelationID, &m.CausationID,
		&m.Principal, &m.Action, &m.Target, &m.Status, &m.Attempts, &m.NextAttemptAt, &m.LastError, &m.PublishedAt,
		&m.BrokerReceipt, &m.DiscardedAt)
	m.OccurredAt, m.CreatedAt, m.NextAttemptAt = m.OccurredAt.UTC(), m.CreatedAt.UTC(), m.NextAttemptAt.UTC()
	m.PublishedAt, m.DiscardedAt = utcPtr(m.PublishedAt), utcPtr(m.DiscardedAt)
	return m, err
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func (o *Ops) queryOutbox(ctx context.Context, exec driver.Executor, q string, args ...any) ([]OutboxMessage, error) {
	rows, err := exec.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("ops: read outbox: %w", err)
	}
	defer rows.Close()
	var out []OutboxMessage
	for rows.Next() {
		m, err := scanOutbox(rows)
		if err != nil {
			return nil, fmt.Errorf("ops: read outbox: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ops: read outbox: %w", err)
	}
	return out, nil
}

// outboxSet is the fixed condition of one kind of outbox row.
type outboxSet string

const (
	setDead       outboxSet = "status = 'dead' AND discarded_at IS NULL"
	setDeadAll    outboxSet = "status = 'dead'"
	setSent       outboxSet = "status = 'sent'"
	setDiscarded  outboxSet = "status = 'dead' AND discarded_at IS NOT NULL"
	setAnyOutbox  outboxSet = "TRUE"
	outboxOrderBy           = " ORDER BY id"
)

// ListDead lists dead letters (dead, not discarded) matching f, oldest
// first, at most f.Limit (default DefaultActionLimit). IncludeDiscarded
// also lists discarded ones.
func (o *Ops) ListDead(ctx context.Context, f Filter, includeDiscarded bool) ([]OutboxMessage, error) {
	p, err := o.ListDeadPage(ctx, f, includeDiscarded)
	return p.Rows, err
}

// ListDeadPage lists one page (f.Limit rows, default DefaultActionLimit)
// of the dead letters matching f after f.After, in id order, with the
// cursor of the next page and the total.
func (o *Ops) ListDeadPage(ctx context.Context, f Filter, includeDiscarded bool) (Page[OutboxMessage], error) {
	set := setDead
	if includeDiscarded {
		set = setDeadAll
	}
	return o.listOutbox(ctx, set, f)
}

// ListSent lists sent rows matching f (what Replay would select).
func (o *Ops) ListSent(ctx context.Context, f Filter) ([]OutboxMessage, error) {
	p, err := o.listOutbox(ctx, setSent, f)
	return p.Rows, err
}

func (o *Ops) listOutbox(ctx context.Context, set outboxSet, f Filter) (Page[OutboxMessage], error) {
	if err := f.check(); err != nil {
		return Page[OutboxMessage]{}, err
	}
	w := &where{}
	cond, err := o.outboxSetSQL(ctx, o.db.Executor(), set)
	if err != nil {
		return Page[OutboxMessage]{}, fmt.Errorf("ops: %w", err)
	}
	w.add(cond)
	o.outboxWhere(w, f, o.now())
	cols, err := o.outboxReadCols(ctx, o.db.Executor())
	if err != nil {
		return Page[OutboxMessage]{}, err
	}
	return listPage(ctx, o, "outbox", w, f.After, f.limit(),
		func(exec driver.Executor, q string, args ...any) ([]OutboxMessage, error) {
			return o.queryOutbox(ctx, exec, q, args...)
		}, cols, func(m OutboxMessage) int64 { return m.ID })
}

// Message returns the outbox row of one event id.
func (o *Ops) Message(ctx context.Context, eventID string) (OutboxMessage, error) {
	u, err := uuid.Parse(eventID)
	if err != nil {
		return OutboxMessage{}, &ArgError{Field: "event_id", Reason: "not a UUID"}
	}
	exec := o.db.Executor()
	cols, err := o.outboxReadCols(ctx, exec)
	if err != nil {
		return OutboxMessage{}, err
	}
	ms, err := o.queryOutbox(ctx, exec, fmt.Sprintf(`SELECT %s FROM %s WHERE event_id = $1`, cols, o.t("outbox")), u.String())
	if err != nil {
		return OutboxMessage{}, err
	}
	if len(ms) == 0 {
		return OutboxMessage{}, fmt.Errorf("%w: outbox event %s", ErrNotFound, u)
	}
	return ms[0], nil
}

// ActionResult reports what an action did or, on a dry run, would do, with
// a sample of the rows of type T it matched.
type ActionResult[T any] struct {
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	// Rows is how many rows match (dry run) or were changed (approved).
	Rows int64 `json:"rows"`
	// More is true when more rows match than the action's limit: run it
	// again after this batch.
	More bool `json:"more"`
	// Sample shows up to SampleSize of the rows, oldest first.
	Sample []T `json:"sample,omitempty"`
	// AuditID is the audit row written by an approved action.
	AuditID int64 `json:"audit_id,omitempty"`
}

// Result is the result of an action on outbox rows (and of settings).
type Result = ActionResult[OutboxMessage]

// outboxAction is one mutation of matching outbox rows.
type outboxAction struct {
	name string
	set  outboxSet
	// update renders "SET …" for the ids placeholder list; args follow ids.
	update func(now time.Time, auditID int64) (string, []any)
	// needsAuditID: the update references the audit row (discard).
	needsAuditID bool
}

// RetryDead puts dead letters matching f back to pending with attempts
// reset and next_attempt_at now, so the relay that owns the shard publishes
// them under its own lease and fence. Ops never publishes itself: the only
// write is the row, guarded by status = 'dead', so a row the relay changed
// meanwhile is left alone.
func (o *Ops) RetryDead(ctx context.Context, f Filter, a Approval) (Result, error) {
	return o.runOutboxAction(ctx, f, a, outboxAction{
		name: "dlq.retry",
		set:  setDead,
		update: func(now time.Time, _ int64) (string, []any) {
			return "status = {{requeue}}, attempts = 0, next_attempt_at = ?", []any{now}
		},
	})
}

// DiscardDead marks dead letters matching f discarded: the row stays (with
// status 'dead', discarded_at and the audit id) as evidence, leaves the DLQ
// listing and the dead-letter gauge, and becomes eligible for cleanup with
// CleanupOptions.IncludeDead.
func (o *Ops) DiscardDead(ctx context.Context, f Filter, a Approval) (Result, error) {
	return o.runOutboxAction(ctx, f, a, outboxAction{
		name:         "dlq.discard",
		set:          setDead,
		needsAuditID: true,
		update: func(now time.Time, auditID int64) (string, []any) {
			return "discarded_at = ?, discard_audit_id = ?", []any{now, auditID}
		},
	})
}

// Replay re-publishes sent events matching f with their original event
// ids: it sets the rows back to pending (attempts 0, next_attempt_at now)
// and the relay publishes them again. Consumers see a redelivery of the
// same event id; an inbox absorbs it as a duplicate unless its inbox row
// was cleaned up, and a consumer without an inbox repeats its effect.
func (o *Ops) Replay(ctx context.Context, f Filter, a Approval) (Result, error) {
	return o.runOutboxAction(ctx, f, a, outboxAction{
		name: "outbox.replay",
		set:  setSent,
		update: func(now time.Time, _ int64) (string, []any) {
			return "status = {{requeue}}, attempts = 0, next_attempt_at = ?", []any{now}
		},
	})
}

func (o *Ops) runOutboxAction(ctx context.Context, f Filter, a Approval, act outboxAction) (Result, error) {
	if err := f.check(); err != nil {
		return Result{}, err
	}
	if err := refuseCursor(f.After); err != nil {
		return Result{}, err
	}
	if f.empty() && !f.All {
		return Result{}, fmt.Errorf("%w: give ids or a filter (topic, tenant, aggregate, type, age, time range), or All to act on every row", ErrEmptyFilter)
	}
	if err := a.check(); err != nil {
		return Result{}, err
	}
	now := o.now()
	res := Result{Action: act.name, DryRun: !a.Approve}
	// The watermark design (relay.WithSentWatermark): "sent" includes rows
	// at or below their shard's watermark, and a row put back for the
	// relay there becomes 'retry' ({{requeue}}).
	cond, err := o.outboxSetSQL(ctx, o.db.Executor(), act.set)
	if err != nil {
		return Result{}, fmt.Errorf("ops: %s: %w", act.name, err)
	}
	requeue, err := o.requeueStatus(ctx, o.db.Executor())
	if err != nil {
		return Result{}, fmt.Errorf("ops: %s: %w", act.name, err)
	}
	w := &where{}
	w.add(cond)
	o.outboxWhere(w, f, now)
	limit := f.limit()
	err = o.inTx(ctx, func(tx driver.Tx) error {
		lock := ""
		if o.rowLocks() && a.Approve {
			// Lock the rows so the relay cannot change them between our read
			// and our write; SQLite's write lock (BEGIN IMMEDIATE) does the same.
			lock = " FOR UPDATE"
		}
		// limit+1 tells whether more rows match than this batch takes.
		ms, err := o.queryOutbox(ctx, tx, fmt.Sprintf(`SELECT %s FROM %s WHERE %s%s LIMIT %d%s`,
			o.outboxCols(), o.t("outbox"), w.sql(), outboxOrderBy, limit+1, lock), w.args...)
		if err != nil {
			return err
		}
		ms, res.More, res.Sample = batch(ms, limit)
		res.Rows = int64(len(ms))
		if !a.Approve {
			return nil // dry run: read only, rolled back
		}
		ids := make([]string, len(ms))
		rowIDs := make([]any, len(ms))
		for i, m := range ms {
			ids[i] = m.EventID
			rowIDs[i] = m.ID
		}
		auditID, err := o.writeAudit(ctx, tx, act.name, a, f, ids, res.Rows)
		if err != nil {
			return err
		}
		res.AuditID = auditID
		if len(ms) == 0 {
			return nil
		}
		set, setArgs := act.update(now, auditID)
		set = strings.ReplaceAll(set, "{{requeue}}", requeue)
		if err := o.updateIDs(ctx, tx, act.name, "outbox", set, setArgs, rowIDs, cond); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}
