package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/logattr"
)

// ParkedFilter selects parked inbox messages. Empty fields do not filter;
// mutating requests refuse an empty filter unless All is set.
type ParkedFilter struct {
	Consumer      string
	Reason        string // gap, schema, unauthorized, poison, collision, undecodable
	IDs           []int64
	EventIDs      []string
	TenantID      string
	AggregateType string
	AggregateID   string
	EventType     string
	// OlderThan keeps rows first seen at least this long ago.
	OlderThan time.Duration
	// IncludeResolved lists resolved rows too (listing only; requests act
	// on open rows).
	IncludeResolved bool
	All             bool
	Limit           int
	// After is the NextCursor of the previous page (listing only).
	After string
}

var parkReasons = map[string]bool{"gap": true, "schema": true, "unauthorized": true, "poison": true, "collision": true, "undecodable": true, "decrypt": true, "claimcheck": true}

func (f ParkedFilter) empty() bool {
	return f.Consumer == "" && f.Reason == "" && len(f.IDs) == 0 && len(f.EventIDs) == 0 && f.TenantID == "" &&
		f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" && f.OlderThan == 0
}

func (f ParkedFilter) check() error {
	if f.Reason != "" && !parkReasons[f.Reason] {
		return &ArgError{Field: "filter.reason", Reason: "must be one of gap, schema, unauthorized, poison, collision, undecodable, decrypt, claimcheck"}
	}
	if len(f.IDs)+len(f.EventIDs) > MaxIDs {
		return &ArgError{Field: "filter.ids", Reason: fmt.Sprintf("at most %d ids", MaxIDs)}
	}
	for i, id := range f.EventIDs {
		if _, err := uuid.Parse(id); err != nil {
			return &ArgError{Field: fmt.Sprintf("filter.event_ids[%d]", i), Reason: "not a UUID"}
		}
	}
	if f.OlderThan < 0 {
		return &ArgError{Field: "filter.older_than", Reason: "must be >= 0"}
	}
	if f.Limit < 0 || f.Limit > MaxActionLimit {
		return &ArgError{Field: "filter.limit", Reason: fmt.Sprintf("must be between 0 and %d", MaxActionLimit)}
	}
	return nil
}

func (o *Ops) parkedWhere(w *where, f ParkedFilter, now time.Time) {
	if !f.IncludeResolved {
		w.add("resolved_at IS NULL")
	}
	if f.Consumer != "" {
		w.add("consumer = ?", f.Consumer)
	}
	if f.Reason != "" {
		w.add("reason = ?", f.Reason)
	}
	if len(f.IDs) > 0 {
		ids := make([]any, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = id
		}
		w.in("id", ids)
	}
	if len(f.EventIDs) > 0 {
		ids := make([]any, len(f.EventIDs))
		for i, id := range f.EventIDs {
			ids[i] = id
			if u, err := uuid.Parse(id); err == nil {
				ids[i] = u.String()
			}
		}
		w.in("event_id", ids)
	}
	for _, c := range []struct{ col, v string }{{"tenant_id", f.TenantID}, {"aggregate_type", f.AggregateType}, {"aggregate_id", f.AggregateID}, {"event_type", f.EventType}} {
		if c.v != "" {
			w.add(c.col+" = ?", c.v)
		}
	}
	if f.OlderThan > 0 {
		w.add("first_seen <= ?", now.Add(-f.OlderThan))
	}
}

// ParkedMessage is a parked inbox row as operators see it (payload size
// only, never the bytes).
type ParkedMessage struct {
	ID                int64      `json:"id"`
	Consumer          string     `json:"consumer"`
	Reason            string     `json:"reason"`
	Attempts          int        `json:"attempts"`
	FirstSeen         time.Time  `json:"first_seen"`
	LastSeen          time.Time  `json:"last_seen"`
	LastError         string     `json:"last_error,omitempty"`
	ResolvedAt        *time.Time `json:"resolved_at,omitempty"`
	Resolution        string     `json:"resolution,omitempty"`
	TenantID          string     `json:"tenant_id"`
	EventID           string     `json:"event_id,omitempty"`
	AggregateType     string     `json:"aggregate_type"`
	AggregateID       string     `json:"aggregate_id"`
	AggregateSeq      int64      `json:"aggregate_seq"`
	EventType         string     `json:"event_type"`
	SchemaVersion     int        `json:"schema_version"`
	Topic             string     `json:"topic,omitempty"`
	CorrelationID     string     `json:"correlation_id,omitempty"`
	Principal         string     `json:"principal,omitempty"`
	Action            string     `json:"action,omitempty"`
	Target            string     `json:"target,omitempty"`
	PayloadBytes      int64      `json:"payload_bytes"`
	ReplayRequestedAt *time.Time `json:"replay_requested_at,omitempty"`
	ReplayRequest     string     `json:"replay_request,omitempty"`
	ReplayAuditID     *int64     `json:"replay_audit_id,omitempty"`
}

func (o *Ops) parkedCols() string {
	size, ev := o.payloadSize(), o.uuidText("event_id")
	return `id, consumer, reason, attempts, first_seen, last_seen, last_error, resolved_at, resolution, tenant_id, ` + ev + `,
		aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version, topic, correlation_id, principal, action, target, ` + size + `,
		replay_requested_at, replay_request, replay_audit_id`
}

func (o *Ops) queryParked(ctx context.Context, exec driver.Executor, q string, args ...any) ([]ParkedMessage, error) {
	rows, err := exec.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("ops: read parked: %w", err)
	}
	defer rows.Close()
	var out []ParkedMessage
	for rows.Next() {
		var p ParkedMessage
		var first, last, resolved, requested nullTime
		var eventID *string
		if err := rows.Scan(&p.ID, &p.Consumer, &p.Reason, &p.Attempts, &first, &last, &p.LastError, &resolved, &p.Resolution,
			&p.TenantID, &eventID, &p.AggregateType, &p.AggregateID, &p.AggregateSeq, &p.EventType, &p.SchemaVersion, &p.Topic,
			&p.CorrelationID, &p.Principal, &p.Action, &p.Target, &p.PayloadBytes, &requested, &p.ReplayRequest, &p.ReplayAuditID); err != nil {
			return nil, fmt.Errorf("ops: read parked: %w", err)
		}
		p.FirstSeen, p.LastSeen, p.ResolvedAt, p.ReplayRequestedAt = first.Time, last.Time, resolved.ptr(), requested.ptr()
		if eventID != nil {
			p.EventID = *eventID
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ops: read parked: %w", err)
	}
	return out, nil
}

func (o *Ops) requireInbox(ctx context.Context) error {
	ok, err := o.tableExists(ctx, o.db.Executor(), "inbox_parked")
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: the inbox tables are not installed (ferry migrate up)", ErrUnsupported)
	}
	return nil
}

// ListParked lists parked messages matching f, oldest id first: one page
// of ListParkedPage.
func (o *Ops) ListParked(ctx context.Context, f ParkedFilter) ([]ParkedMessage, error) {
	p, err := o.ListParkedPage(ctx, f)
	return p.Rows, err
}

// ListParkedPage lists one page (f.Limit rows, default
// DefaultActionLimit) of the parked messages matching f after f.After, in
// id order, with the cursor of the next page and the total.
func (o *Ops) ListParkedPage(ctx context.Context, f ParkedFilter) (Page[ParkedMessage], error) {
	if err := f.check(); err != nil {
		return Page[ParkedMessage]{}, err
	}
	if err := o.requireInbox(ctx); err != nil {
		return Page[ParkedMessage]{}, err
	}
	w := &where{}
	o.parkedWhere(w, f, o.now())
	return listPage(ctx, o, "inbox_parked", w, f.After, Filter{Limit: f.Limit}.limit(),
		func(exec driver.Executor, q string, args ...any) ([]ParkedMessage, error) {
			return o.queryParked(ctx, exec, q, args...)
		}, o.parkedCols(), func(p ParkedMessage) int64 { return p.ID })
}

// Parked returns one parked message by id.
func (o *Ops) Parked(ctx context.Context, id int64) (ParkedMessage, error) {
	ps, err := o.ListParked(ctx, ParkedFilter{IDs: []int64{id}, IncludeResolved: true})
	if err != nil {
		return ParkedMessage{}, err
	}
	if len(ps) == 0 {
		return ParkedMessage{}, fmt.Errorf("%w: parked message %d", ErrNotFound, id)
	}
	return ps[0], nil
}

// ParkedResult reports what a parked-message request did or would do.
type ParkedResult = ActionResult[ParkedMessage]

// Replay request kinds stored in inbox_parked.replay_request.
const (
	RequestReplay     = "replay"
	RequestReleaseGap = "release_gap"
)

// RequestReplay marks open parked messages matching f for replay. It does
// not replay them itself: the operator's process has neither the
// consumer's handler nor its authorization code. The consumer process,
// running ServeReplayRequests around its inbox, picks the marks up and
// replays each row through inbox.Replay — the live path, with the
// consumer's current schema, authorization, dedup and cursor checks — so a
// message whose authorization is still denied stays parked. Preview and
// audit as for every action.
func (o *Ops) RequestReplay(ctx context.Context, f ParkedFilter, a Approval) (ParkedResult, error) {
	return o.requestParked(ctx, f, a, RequestReplay)
}

// RequestReleaseGap marks open gap messages matching f for
// inbox.ReleaseGap: the consumer stops waiting for the missing earlier
// events of the aggregate, moves its cursor to just before the parked
// message and replays it (every check still runs). The skipped sequences
// are treated as stale if they ever arrive. Only rows parked as gap match.
func (o *Ops) RequestReleaseGap(ctx context.Context, f ParkedFilter, a Approval) (ParkedResult, error) {
	if f.Reason != "" && f.Reason != "gap" {
		return ParkedResult{}, &ArgError{Field: "filter.reason", Reason: "release-gap applies to gap messages only"}
	}
	f.Reason = "gap"
	return o.requestParked(ctx, f, a, RequestReleaseGap)
}

func (o *Ops) requestParked(ctx context.Context, f ParkedFilter, a Approval, kind string) (ParkedResult, error) {
	if err := f.check(); err != nil {
		return ParkedResult{}, err
	}
	if err := refuseCursor(f.After); err != nil {
		return ParkedResult{}, err
	}
	if f.empty() && !f.All {
		return ParkedResult{}, fmt.Errorf("%w: give ids or a filter (consumer, reason, tenant, aggregate, type, age), or All", ErrEmptyFilter)
	}
	if err := a.check(); err != nil {
		return ParkedResult{}, err
	}
	if err := o.requireInbox(ctx); err != nil {
		return ParkedResult{}, err
	}
	f.IncludeResolved = false
	now := o.now()
	action := "parked." + strings.ReplaceAll(kind, "_", "-")
	res := ParkedResult{Action: action, DryRun: !a.Approve}
	w := &where{}
	o.parkedWhere(w, f, now)
	if kind == RequestReplay {
		w.add("reason <> 'undecodable'") // nothing to replay; see inbox.ErrNotReplayable
	}
	limit := Filter{Limit: f.Limit}.limit()
	err := o.inTx(ctx, func(tx driver.Tx) error {
		lock := ""
		if o.rowLocks() && a.Approve {
			lock = " FOR UPDATE"
		}
		ps, err := o.queryParked(ctx, tx, fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY id LIMIT %d%s`,
			o.parkedCols(), o.t("inbox_parked"), w.sql(), limit+1, lock), w.args...)
		if err != nil {
			return err
		}
		ps, res.More, res.Sample = batch(ps, limit)
		res.Rows = int64(len(ps))
		if !a.Approve {
			return nil
		}
		// The audit names each row as parked:<id> and by its event id, so
		// evidence for the event finds the request.
		ids := make([]string, 0, 2*len(ps))
		keys := make([]any, len(ps))
		for i, p := range ps {
			keys[i] = p.ID
			ids = append(ids, fmt.Sprintf("parked:%d", p.ID))
			if p.EventID != "" {
				ids = append(ids, p.EventID)
			}
		}
		auditID, err := o.writeAudit(ctx, tx, action, a, f, ids, res.Rows)
		if err != nil {
			return err
		}
		res.AuditID = auditID
		if len(ps) == 0 {
			return nil
		}
		if err := o.updateIDs(ctx, tx, action, "inbox_parked", "replay_requested_at = ?, replay_request = ?, replay_audit_id = ?",
			[]any{now, kind, auditID}, keys, "resolved_at IS NULL"); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return ParkedResult{}, err
	}
	return res, nil
}

// Replayer is what ServeReplayRequests needs from a consumer's inbox;
// *inbox.Inbox[TTx] satisfies it for any TTx.
type Replayer interface {
	Name() string
	Replay(ctx context.Context, ids ...int64) ([]inbox.ReplayResult, error)
	ReleaseGap(ctx context.Context, id int64) (inbox.ReleaseResult, error)
}

var _ Replayer = (*inbox.Inbox[any])(nil)

// ProcessedRequest is the outcome of one replay request.
type ProcessedRequest struct {
	ParkedID int64  `json:"parked_id"`
	Request  string `json:"request"`
	AuditID  int64  `json:"audit_id"`
	Outcome  string `json:"outcome"`          // applied, duplicate, stale, parked, retry, or not_parked / not_replayable
	Reason   string `json:"reason,omitempty"` // the park reason when parked again
	Error    string `json:"error,omitempty"`
}

// MaxRequestsPerPass bounds one ProcessReplayRequests pass.
const MaxRequestsPerPass = 100

// ProcessReplayRequests runs, once, the replay requests operators left for
// r's consumer: each marked row goes through r.Replay or r.ReleaseGap, the
// mark is cleared and one audit row per request records the outcomes (actor
// "consumer/<name>"). A row whose replay hit an infrastructure error keeps
// its mark and is tried on the next pass.
func (o *Ops) ProcessReplayRequests(ctx context.Context, r Replayer) ([]ProcessedRequest, error) {
	if r == nil {
		return nil, &ArgError{Field: "replayer", Reason: "must not be nil"}
	}
	if err := o.requireInbox(ctx); err != nil {
		return nil, err
	}
	exec := o.db.Executor()
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT id, replay_request, replay_audit_id, COALESCE(%s, '') FROM %s
WHERE consumer = $1 AND replay_requested_at IS NOT NULL ORDER BY id LIMIT %d`, o.uuidText("event_id"), o.t("inbox_parked"), MaxRequestsPerPass), r.Name())
	if err != nil {
		return nil, fmt.Errorf("ops: read replay requests: %w", err)
	}
	type req struct {
		id, audit     int64
		kind, eventID string
	}
	var reqs []req
	for rows.Next() {
		var q req
		var audit *int64
		if err := rows.Scan(&q.id, &q.kind, &audit, &q.eventID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("ops: read replay requests: %w", err)
		}
		if audit != nil {
			q.audit = *audit
		}
		reqs = append(reqs, q)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ops: read replay requests: %w", err)
	}
	var out []ProcessedRequest
	var firstErr error
	for _, q := range reqs {
		pr := ProcessedRequest{ParkedID: q.id, Request: q.kind, AuditID: q.audit}
		var res inbox.ReplayResult
		switch q.kind {
		case RequestReleaseGap:
			rr, err := r.ReleaseGap(ctx, q.id)
			res = rr.ReplayResult
			if err != nil && res.Err == nil {
				res.Err = err
			}
		default:
			rs, err := r.Replay(ctx, q.id)
			if err != nil {
				res.Err = err
			} else if len(rs) == 1 {
				res = rs[0]
			}
		}
		switch {
		case res.Err == nil:
			pr.Outcome, pr.Reason, pr.Error = string(res.Outcome), string(res.Reason), res.Error
		case errors.Is(res.Err, inbox.ErrNotParked), errors.Is(res.Err, inbox.ErrNotFound):
			pr.Outcome = "not_parked"
		case errors.Is(res.Err, inbox.ErrNotReplayable):
			pr.Outcome = "not_replayable"
		case errors.Is(res.Err, inbox.ErrNotGap):
			pr.Outcome, pr.Error = "not_gap", "the message is no longer parked as a gap"
		default:
			// Infrastructure: keep the mark, try again next pass.
			if firstErr == nil {
				firstErr = fmt.Errorf("ops: replay parked %d: %w", q.id, res.Err)
			}
			continue
		}
		err := o.inTx(ctx, func(tx driver.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET replay_requested_at = NULL, replay_request = '' WHERE id = $1 AND replay_audit_id = $2`,
				o.t("inbox_parked")), q.id, q.audit); err != nil {
				return fmt.Errorf("ops: clear replay request: %w", err)
			}
			ids := []string{fmt.Sprintf("parked:%d", q.id)}
			if q.eventID != "" {
				ids = append(ids, q.eventID)
			}
			_, err := o.writeAudit(ctx, tx, "parked."+strings.ReplaceAll(q.kind, "_", "-")+".done",
				Approval{Actor: "consumer/" + r.Name(), Reason: fmt.Sprintf("operator request, audit #%d", q.audit)}, pr, ids, 1)
			return err
		})
		if err != nil {
			return out, err
		}
		out = append(out, pr)
	}
	return out, firstErr
}

// ServeReplayRequests runs ProcessReplayRequests every interval until ctx
// ends. Run it in the consumer process, next to inbox.Run, so that
// `ferry parked replay --approve` takes effect within one interval.
func (o *Ops) ServeReplayRequests(ctx context.Context, r Replayer, every time.Duration) error {
	if every <= 0 {
		return &ArgError{Field: "every", Reason: "must be > 0"}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := o.ProcessReplayRequests(ctx, r); err != nil && ctx.Err() == nil {
			o.cfg.log.WarnContext(ctx, "ferry replay requests", "consumer", r.Name(), logattr.Err(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
