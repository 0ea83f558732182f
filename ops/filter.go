package ops

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/driver"
)

// Limits on filters, so one command cannot build an unbounded statement or
// touch an unbounded number of rows in one transaction.
const (
	// MaxIDs bounds Filter.EventIDs.
	MaxIDs = 1000
	// DefaultActionLimit is how many rows one approved action changes when
	// Filter.Limit is zero; run the command again for the rest.
	DefaultActionLimit = 1000
	// MaxActionLimit bounds Filter.Limit.
	MaxActionLimit = 10000
	// SampleSize is how many matching rows a preview shows.
	SampleSize = 20
)

// Filter selects outbox rows for the DLQ, replay and list commands. Empty
// fields do not filter. Mutating actions refuse an empty filter unless All
// is set, so "retry everything" is always a deliberate choice.
type Filter struct {
	EventIDs      []string // exact event ids (UUIDs)
	Topic         string
	TenantID      string
	AggregateType string
	AggregateID   string
	EventType     string
	// ErrorContains keeps rows whose last_error contains this text (the
	// DLQ's "reason" filter: e.g. "schema", "permission").
	ErrorContains string
	// OlderThan keeps rows created at least this long ago.
	OlderThan time.Duration
	// Since and Until bound created_at (inclusive, exclusive); zero means open.
	Since, Until time.Time
	// All allows an action with no other criterion.
	All bool
	// Limit bounds the rows listed or changed (default DefaultActionLimit,
	// at most MaxActionLimit).
	Limit int
	// After is the NextCursor of the previous page (listing only).
	After string
}

func (f Filter) empty() bool {
	return len(f.EventIDs) == 0 && f.Topic == "" && f.TenantID == "" && f.AggregateType == "" &&
		f.AggregateID == "" && f.EventType == "" && f.ErrorContains == "" && f.OlderThan == 0 && f.Since.IsZero() && f.Until.IsZero()
}

func (f Filter) check() error {
	if len(f.EventIDs) > MaxIDs {
		return &ArgError{Field: "filter.event_ids", Reason: fmt.Sprintf("at most %d ids, got %d", MaxIDs, len(f.EventIDs))}
	}
	for i, id := range f.EventIDs {
		if _, err := uuid.Parse(id); err != nil {
			return &ArgError{Field: fmt.Sprintf("filter.event_ids[%d]", i), Reason: "not a UUID"}
		}
	}
	if f.OlderThan < 0 {
		return &ArgError{Field: "filter.older_than", Reason: "must be >= 0"}
	}
	if len(f.ErrorContains) > 200 {
		return &ArgError{Field: "filter.error_contains", Reason: "at most 200 bytes"}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return &ArgError{Field: "filter.until", Reason: "must be after filter.since"}
	}
	if f.Limit < 0 || f.Limit > MaxActionLimit {
		return &ArgError{Field: "filter.limit", Reason: fmt.Sprintf("must be between 0 and %d", MaxActionLimit)}
	}
	return nil
}

func (f Filter) limit() int {
	if f.Limit == 0 {
		return DefaultActionLimit
	}
	return f.Limit
}

// where builds "AND …" conditions with $n placeholders starting after
// len(args).
type where struct {
	conds []string
	args  []any
}

func (w *where) add(cond string, args ...any) {
	for _, a := range args {
		w.args = append(w.args, a)
		cond = strings.Replace(cond, "?", fmt.Sprintf("$%d", len(w.args)), 1)
	}
	w.conds = append(w.conds, cond)
}

func (w *where) sql() string {
	if len(w.conds) == 0 {
		return "TRUE"
	}
	return strings.Join(w.conds, " AND ")
}

func (w *where) in(col string, vals []any) {
	ph := make([]string, len(vals))
	for i, v := range vals {
		w.args = append(w.args, v)
		ph[i] = fmt.Sprintf("$%d", len(w.args))
	}
	w.conds = append(w.conds, col+" IN ("+strings.Join(ph, ", ")+")")
}

// outboxWhere renders f for the outbox table.
func (o *Ops) outboxWhere(w *where, f Filter, now time.Time) {
	if len(f.EventIDs) > 0 {
		ids := make([]any, len(f.EventIDs))
		for i, id := range f.EventIDs {
			ids[i] = id
			if u, err := uuid.Parse(id); err == nil { // checked by Filter.check; normalise case
				ids[i] = u.String()
			}
		}
		w.in("event_id", ids)
	}
	if f.Topic != "" {
		w.add("topic = ?", f.Topic)
	}
	if f.TenantID != "" {
		w.add("tenant_id = ?", f.TenantID)
	}
	if f.AggregateType != "" {
		w.add("aggregate_type = ?", f.AggregateType)
	}
	if f.AggregateID != "" {
		w.add("aggregate_id = ?", f.AggregateID)
	}
	if f.EventType != "" {
		w.add("event_type = ?", f.EventType)
	}
	if f.ErrorContains != "" {
		// instr/strpos instead of LIKE: the text is matched literally, so
		// % and _ in it mean themselves.
		w.add(o.containsText("last_error"), f.ErrorContains)
	}
	if f.OlderThan > 0 {
		w.add("created_at <= ?", now.Add(-f.OlderThan))
	}
	if !f.Since.IsZero() {
		w.add("created_at >= ?", f.Since.UTC())
	}
	if !f.Until.IsZero() {
		w.add("created_at < ?", f.Until.UTC())
	}
}

// updateIDs runs UPDATE table SET set WHERE id IN (ids) AND guard inside tx
// and fails unless exactly len(ids) rows changed: a row changed between the
// action's read and its write makes the whole action roll back. set may hold
// ? placeholders for setArgs.
func (o *Ops) updateIDs(ctx context.Context, tx driver.Executor, action, table, set string, setArgs []any, ids []any, guard string) error {
	u := &where{}
	u.add(set, setArgs...)
	setSQL := u.conds[0]
	u.conds = nil
	u.in("id", ids)
	u.add(guard)
	n, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET %s WHERE %s`, o.t(table), setSQL, strings.Join(u.conds, " AND ")), u.args...)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", action, err)
	}
	if n != int64(len(ids)) {
		return fmt.Errorf("ops: %s: changed %d rows, expected %d (rows changed concurrently); nothing was committed, run it again", action, n, len(ids))
	}
	return nil
}

// batch cuts rows read with LIMIT limit+1 to limit and returns them, whether
// more rows matched, and the preview sample.
func batch[T any](rows []T, limit int) (_ []T, more bool, sample []T) {
	if len(rows) > limit {
		rows, more = rows[:limit], true
	}
	return rows, more, rows[:min(len(rows), SampleSize)]
}
