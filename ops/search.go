package ops

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/driver"
)

// Search limits.
const (
	// DefaultSearchLimit is the page size of SearchOutbox and AuditPage
	// when the query gives none.
	DefaultSearchLimit = 50
	// MaxSearchLimit bounds a search page.
	MaxSearchLimit = 1000
	// maxSearchText bounds each text criterion.
	maxSearchText = 512
)

// OutboxQuery selects outbox rows for SearchOutbox. Empty fields do not
// filter. Every single criterion is served by an index ending in id
// (migration 0007), so a page costs the same on a 1,000,000-row outbox as
// on an empty one; combined criteria filter within the index of one.
type OutboxQuery struct {
	EventID       string `json:"event_id,omitempty"`
	TenantID      string `json:"tenant_id,omitempty"`
	AggregateType string `json:"aggregate_type,omitempty"`
	AggregateID   string `json:"aggregate_id,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
	// Status is pending, sent, dead (not discarded) or discarded: the
	// row's state (OutboxMessage.Status).
	Status string `json:"status,omitempty"`
	// Since and Until bound created_at (inclusive, exclusive).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// Limit is the page size (default DefaultSearchLimit, at most
	// MaxSearchLimit).
	Limit int `json:"limit,omitempty"`
	// After is the NextCursor of the previous page.
	After string `json:"after,omitempty"`
}

// SearchPage is one page of a search: Rows in the search's order and the
// cursor of the next page (empty on the last). It has no total: counting
// every match of a broad search over a large outbox would cost more than
// the page itself.
type SearchPage[T any] struct {
	Rows       []T    `json:"rows"`
	NextCursor string `json:"next_cursor"`
	// Order is "id desc" (newest first), for an aggregate "id asc" (its
	// sequence in order: one aggregate's rows are inserted in sequence
	// order), for a time range alone "created_at desc, id desc".
	Order string `json:"order"`
}

// Search statuses.
var searchStatuses = map[string]string{
	"pending":   "status = 'pending'",
	"sent":      "status = 'sent'",
	"dead":      "status = 'dead' AND discarded_at IS NULL",
	"discarded": "status = 'dead' AND discarded_at IS NOT NULL",
}

func (q OutboxQuery) check() error {
	for _, f := range []struct{ name, v string }{
		{"tenant_id", q.TenantID}, {"aggregate_type", q.AggregateType}, {"aggregate_id", q.AggregateID}, {"correlation_id", q.CorrelationID},
	} {
		if len(f.v) > maxSearchText {
			return &ArgError{Field: f.name, Reason: fmt.Sprintf("at most %d bytes", maxSearchText)}
		}
	}
	if q.EventID != "" {
		if _, err := uuid.Parse(q.EventID); err != nil {
			return &ArgError{Field: "event_id", Reason: "not a UUID"}
		}
	}
	if (q.AggregateType == "") != (q.AggregateID == "") {
		return &ArgError{Field: "aggregate_id", Reason: "an aggregate is searched by aggregate_type and aggregate_id together"}
	}
	if _, ok := searchStatuses[q.Status]; q.Status != "" && !ok {
		return &ArgError{Field: "status", Reason: fmt.Sprintf("must be pending, sent, dead or discarded, got %q", q.Status)}
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return &ArgError{Field: "until", Reason: "must be after since"}
	}
	if q.Limit < 0 || q.Limit > MaxSearchLimit {
		return &ArgError{Field: "limit", Reason: fmt.Sprintf("must be between 1 and %d", MaxSearchLimit)}
	}
	return nil
}

func searchLimit(n int) int {
	if n == 0 {
		return DefaultSearchLimit
	}
	return n
}

// searchCursor reads After as a row id for a search page.
func searchCursor(after string) (int64, error) {
	if after == "" {
		return 0, nil
	}
	id, err := strconv.ParseInt(after, 10, 64)
	if err != nil || id <= 0 {
		return 0, &ArgError{Field: "after", Reason: fmt.Sprintf("not a cursor from an earlier page (next_cursor): %q", after)}
	}
	return id, nil
}

// SearchOutbox finds outbox rows matching q, newest first (an aggregate's
// rows oldest first, i.e. in sequence order), a page at a time by key (id
// below or above the cursor, never OFFSET). Payloads are never read; see
// RevealPayload.
func (o *Ops) SearchOutbox(ctx context.Context, q OutboxQuery) (SearchPage[OutboxMessage], error) {
	if err := q.check(); err != nil {
		return SearchPage[OutboxMessage]{}, err
	}
	wm, err := o.watermarked(ctx, o.db.Executor())
	if err != nil {
		return SearchPage[OutboxMessage]{}, err
	}
	return o.searchOutbox(ctx, q, wm)
}

// searchOutbox is SearchOutbox once q is checked; wm: rows' states are
// read through the watermark (see watermarked).
func (o *Ops) searchOutbox(ctx context.Context, q OutboxQuery, wm bool) (SearchPage[OutboxMessage], error) {
	var from int64
	if !strings.Contains(q.After, "_") {
		var err error
		if from, err = searchCursor(q.After); err != nil {
			return SearchPage[OutboxMessage]{}, err
		}
	}
	w := &where{}
	if q.EventID != "" {
		w.add("event_id = ?", uuid.MustParse(q.EventID).String())
	}
	if q.TenantID != "" {
		w.add("tenant_id = ?", q.TenantID)
	}
	if q.AggregateType != "" {
		w.add("aggregate_type = ?", q.AggregateType)
		w.add("aggregate_id = ?", q.AggregateID)
	}
	if q.CorrelationID != "" {
		w.add("correlation_id = ?", q.CorrelationID)
		w.add("correlation_id <> ''") // lets the planner use the partial index
	}
	// A watermark relay leaves sent rows 'pending' and unsent ones 'retry':
	// pending and sent are the row's state (pending: see below).
	wmPending := wm && q.Status == "pending"
	switch {
	case wmPending:
	case wm && q.Status == "sent":
		w.add(o.stateExpr() + " = 'sent'")
	case q.Status != "":
		w.add(searchStatuses[q.Status])
		if q.Status != "sent" {
			w.add("status <> 'sent'") // the partial (status, id) index
		}
	}
	if !q.Since.IsZero() {
		w.add("created_at >= ?", q.Since.UTC())
	}
	if !q.Until.IsZero() {
		w.add("created_at < ?", q.Until.UTC())
	}
	// A time range alone is read in created_at order from the
	// (created_at, id) index, keyed by both: in id order the planner would
	// walk the primary key until it reached the range.
	byTime := (!q.Since.IsZero() || !q.Until.IsZero()) && q.EventID == "" && q.TenantID == "" && q.AggregateType == "" && q.CorrelationID == "" && q.Status == ""
	asc := q.AggregateType != ""
	order := "id DESC"
	switch {
	case byTime:
		order = "created_at DESC, id DESC"
	case asc:
		order = "id ASC"
	}
	switch {
	case byTime && q.After != "":
		at, id, err := timeCursor(q.After)
		if err != nil {
			return SearchPage[OutboxMessage]{}, err
		}
		var atArg any = at
		if o.sqlite() {
			// SQLite stores created_at as text in strftime's format
			// (always three fraction digits); a time.Time argument is
			// rendered with trailing zeros trimmed (.12 for .120), which
			// compares as text out of order. Compare like with like.
			atArg = at.Format(sqliteTimeLayout)
		}
		w.add("(created_at < ? OR (created_at = ? AND id < ?))", atArg, atArg, id)
	case from > 0 && asc:
		w.add("id > ?", from)
	case from > 0:
		w.add("id < ?", from)
	}
	limit := searchLimit(q.Limit)
	cols := o.outboxCols()
	if wm {
		cols = o.outboxColsWith(o.stateExpr())
	}
	stmt := fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT %d`, cols, o.t("outbox"), w.sql(), order, limit+1)
	if wmPending {
		stmt = o.searchPendingSQL(cols, w.sql(), order, limit+1)
	}
	rows, err := o.queryOutbox(ctx, o.db.Executor(), stmt, w.args...)
	if err != nil {
		return SearchPage[OutboxMessage]{}, err
	}
	p := SearchPage[OutboxMessage]{Order: strings.ToLower(order)}
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		p.NextCursor = strconv.FormatInt(last.ID, 10)
		if byTime {
			p.NextCursor = last.CreatedAt.UTC().Format(time.RFC3339Nano) + "_" + p.NextCursor
		}
	}
	if rows == nil {
		rows = []OutboxMessage{}
	}
	p.Rows = rows
	return p, nil
}

// searchPendingSQL is a page of the rows in state pending matching cond,
// under a watermark relay. Their status is 'pending' only above their
// shard's watermark, and every sent row's status is 'pending' too, so
// "status = 'pending' in id order" would walk the sent rows, the bulk,
// whenever fewer rows than a page are pending. The page is read as two
// index-bounded pages instead: the 'retry' rows, and the 'pending' rows
// above the lowest watermark (floor: the lowest sent_up_to of shards 0 to
// the highest shard with a pending row, 0 unless each has a lease row),
// each then checked against its own shard's watermark.
func (o *Ops) searchPendingSQL(cols, cond, order string, n int) string {
	t, leases := o.t("outbox"), o.t("relay_leases")
	floor := fmt.Sprintf(`COALESCE((SELECT CASE WHEN count(*) = m.mx + 1 THEN min(l.sent_up_to) ELSE 0 END
    FROM (SELECT max(shard) AS mx FROM %s WHERE status = 'pending') m JOIN %s l ON l.shard <= m.mx GROUP BY m.mx), 0)`, t, leases)
	return fmt.Sprintf(`SELECT * FROM (
    (SELECT %[1]s FROM %[2]s WHERE status = 'retry' AND %[3]s ORDER BY %[4]s LIMIT %[5]d)
  UNION ALL
    (SELECT %[1]s FROM %[2]s WHERE status = 'pending' AND id > %[6]s AND %[7]s = 'pending' AND %[3]s ORDER BY %[4]s LIMIT %[5]d)
) p ORDER BY %[4]s LIMIT %[5]d`, cols, t, cond, order, n, floor, o.stateExpr())
}

// SearchOutboxSQL returns the statement and arguments SearchOutbox runs
// for q (for EXPLAIN in tests and benchmarks).
func (o *Ops) SearchOutboxSQL(q OutboxQuery) (string, []any, error) {
	var sqlText string
	var args []any
	if err := q.check(); err != nil {
		return "", nil, err
	}
	ctx := context.Background()
	wm, err := o.watermarked(ctx, o.db.Executor())
	if err != nil {
		return "", nil, err
	}
	rec := &recordingExec{fn: func(q string, a []any) { sqlText, args = q, a }}
	oo := &Ops{db: recordingDB{o.db, rec}, cfg: o.cfg}
	if _, err := oo.searchOutbox(ctx, q, wm); err != nil && sqlText == "" {
		return "", nil, err
	}
	return sqlText, args, nil
}

// sqliteTimeLayout is how SQLite's created_at default (strftime
// '%Y-%m-%d %H:%M:%f+00:00') writes a time.
const sqliteTimeLayout = "2006-01-02 15:04:05.000+00:00"

// timeCursor reads the "<created_at>_<id>" cursor of a time-range page.
func timeCursor(after string) (time.Time, int64, error) {
	ts, idText, _ := strings.Cut(after, "_")
	at, err1 := time.Parse(time.RFC3339Nano, ts)
	id, err2 := strconv.ParseInt(idText, 10, 64)
	if err1 != nil || err2 != nil || id <= 0 {
		return time.Time{}, 0, &ArgError{Field: "after", Reason: fmt.Sprintf("not a cursor from an earlier page (next_cursor): %q", after)}
	}
	return at.UTC(), id, nil
}

// AuditFilter selects audit rows for AuditPage. Empty fields do not filter.
type AuditFilter struct {
	Actor  string `json:"actor,omitempty"`
	Action string `json:"action,omitempty"`
	// Since and Until bound at (inclusive, exclusive).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	Limit int       `json:"limit,omitempty"`
	After string    `json:"after,omitempty"`
}

// AuditPage reads the audit log newest first, a page at a time by key,
// with the total matching f.
func (o *Ops) AuditPage(ctx context.Context, f AuditFilter) (Page[AuditEntry], error) {
	if len(f.Actor) > maxActorLen {
		return Page[AuditEntry]{}, &ArgError{Field: "actor", Reason: fmt.Sprintf("at most %d bytes", maxActorLen)}
	}
	if len(f.Action) > maxSearchText {
		return Page[AuditEntry]{}, &ArgError{Field: "action", Reason: fmt.Sprintf("at most %d bytes", maxSearchText)}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return Page[AuditEntry]{}, &ArgError{Field: "until", Reason: "must be after since"}
	}
	if f.Limit < 0 || f.Limit > MaxSearchLimit {
		return Page[AuditEntry]{}, &ArgError{Field: "limit", Reason: fmt.Sprintf("must be between 1 and %d", MaxSearchLimit)}
	}
	from, err := searchCursor(f.After)
	if err != nil {
		return Page[AuditEntry]{}, err
	}
	w := &where{}
	if f.Actor != "" {
		w.add("actor = ?", f.Actor)
	}
	if f.Action != "" {
		w.add("action = ?", f.Action)
	}
	if !f.Since.IsZero() {
		w.add("at >= ?", f.Since.UTC())
	}
	if !f.Until.IsZero() {
		w.add("at < ?", f.Until.UTC())
	}
	exec := o.db.Executor()
	var p Page[AuditEntry]
	if _, err := driver.QueryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s`, o.t("ops_audit"), w.sql()), w.args, &p.Total); err != nil {
		return Page[AuditEntry]{}, fmt.Errorf("ops: count audit: %w", err)
	}
	if from > 0 {
		w.add("id < ?", from)
	}
	limit := searchLimit(f.Limit)
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT id, at, actor, action, filter, row_count, reason, ids FROM %s WHERE %s ORDER BY id DESC LIMIT %d`,
		o.t("ops_audit"), w.sql(), limit+1), w.args...)
	if err != nil {
		return Page[AuditEntry]{}, fmt.Errorf("ops: read audit: %w", err)
	}
	defer rows.Close()
	p.Rows = []AuditEntry{}
	for rows.Next() {
		var e AuditEntry
		if err := rows.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Filter, &e.RowCount, &e.Reason, &e.IDs); err != nil {
			return Page[AuditEntry]{}, fmt.Errorf("ops: read audit: %w", err)
		}
		e.At = e.At.UTC()
		p.Rows = append(p.Rows, e)
	}
	if err := rows.Err(); err != nil {
		return Page[AuditEntry]{}, fmt.Errorf("ops: read audit: %w", err)
	}
	if len(p.Rows) > limit {
		p.Rows = p.Rows[:limit]
		p.NextCursor = strconv.FormatInt(p.Rows[limit-1].ID, 10)
	}
	return p, nil
}

// RevealedPayload is the payload of one outbox row, parked message or
// effect intent, read by an approved, audited request and passed through
// the field mask (WithMask): Masked and MaskedValues say what the mask
// replaced with MaskMarker; Withheld says the mask names fields for this
// payload but it is not JSON, so Payload is nil (fail closed).
type RevealedPayload struct {
	EventID        string   `json:"event_id"`
	ContentType    string   `json:"content_type"`
	Payload        []byte   `json:"payload"`
	AuditID        int64    `json:"audit_id"`
	Masked         []string `json:"masked,omitempty"`
	MaskedValues   int      `json:"masked_values,omitempty"`
	Withheld       bool     `json:"withheld,omitempty"`
	WithheldReason string   `json:"withheld_reason,omitempty"`
}

// RevealPayload reads the payload of one outbox event. Payloads may hold
// personal data, so this is an operator action like the others: it needs
// an approval with actor and reason (a dry run reveals nothing and returns
// ErrReasonRequired's sibling check), and it writes an audit row
// "outbox.reveal_payload" in the same transaction as the read. The field
// mask (WithMask) applies, keyed by the event type.
func (o *Ops) RevealPayload(ctx context.Context, eventID string, a Approval) (RevealedPayload, error) {
	u, err := uuid.Parse(eventID)
	if err != nil {
		return RevealedPayload{}, &ArgError{Field: "event_id", Reason: "not a UUID"}
	}
	key := revealKey{filter: map[string]any{"event_id": u.String()}, id: u.String(), what: "outbox event " + u.String()}
	return o.reveal(ctx, "outbox.reveal_payload", key, a, func(tx driver.Tx, out *RevealedPayload, maskKey *string) (bool, error) {
		return driver.QueryRow(ctx, tx, fmt.Sprintf(`SELECT %s, event_type, content_type, payload FROM %s WHERE event_id = $1`, o.uuidText("event_id"), o.t("outbox")),
			[]any{u.String()}, &out.EventID, maskKey, &out.ContentType, &out.Payload)
	})
}

// recordingDB captures the statement a query would run without running it.
type recordingDB struct {
	DB
	exec *recordingExec
}

func (r recordingDB) Executor() driver.Executor { return r.exec }

type recordingExec struct {
	driver.Executor
	fn func(q string, args []any)
}

func (r *recordingExec) Query(_ context.Context, q string, args ...any) (driver.Rows, error) {
	r.fn(q, args)
	return nil, errRecorded
}

var errRecorded = fmt.Errorf("ops: statement recorded, not run")
