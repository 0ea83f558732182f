package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/sanitize"
)

// Parked is a message the inbox kept instead of applying or dropping.
type Parked struct {
	ID        int64
	Consumer  string
	Reason    Reason
	Attempts  int
	FirstSeen time.Time
	LastSeen  time.Time
	// LastError is the sanitised reason text (validation error, handler
	// error, authorization denial). Ferry never writes payload bytes into
	// it; handler errors are stored as the handler wrote them.
	LastError string
	// ResolvedAt is set once the row is done with (Resolution says how:
	// applied, duplicate, stale, released); nil while open.
	ResolvedAt *time.Time
	Resolution string
	// Event is the envelope and payload, enough to replay. For undecodable
	// messages only what could be read is set, and Raw holds the message.
	Event ferry.Event
	// Fingerprint of Event; for a collision OtherFingerprint is the one of
	// the event already applied under the same (tenant, event id).
	Fingerprint, OtherFingerprint []byte
	Raw                           RawParked
}

// RawParked is the bounded raw form of an undecodable message.
type RawParked struct {
	Destination, Key string
	Headers          string // JSON object, possibly cut (LastError says so)
	Body             []byte
}

// ParkedFilter selects parked messages for ListParked.
type ParkedFilter struct {
	Reason          Reason // empty: any
	TenantID        string // empty: any
	IncludeResolved bool   // default: open rows only
	AfterID         int64  // keyset pagination: rows with id > AfterID
	Limit           int    // 1..1000, default 100

	consumer string
}

// MaxListLimit bounds one ListParked page.
const MaxListLimit = 1000

// ListParked returns parked messages of this consumer in id order.
func (ib *Inbox[TTx]) ListParked(ctx context.Context, f ParkedFilter) ([]Parked, error) {
	if f.Limit == 0 {
		f.Limit = 100
	}
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return nil, &ferry.ConfigError{Field: "filter.limit", Reason: fmt.Sprintf("must be in 1..%d, got %d", MaxListLimit, f.Limit)}
	}
	if f.Reason != "" && reasonIndex(f.Reason) < 0 {
		return nil, &ferry.ConfigError{Field: "filter.reason", Reason: fmt.Sprintf("unknown reason %q", sanitize.Text(string(f.Reason), 64))}
	}
	f.consumer = ib.name
	sqlText, args := ib.q.listParked(ib.cfg.tables, f)
	rows, err := ib.drv.Executor().Query(ctx, sqlText, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: list parked: %w", err)
	}
	defer rows.Close()
	var out []Parked
	for rows.Next() {
		p, err := scanParked(rows)
		if err != nil {
			return nil, fmt.Errorf("inbox: list parked: %w", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: list parked: %w", err)
	}
	return out, nil
}

// GetParked returns one parked message (open or resolved), or ErrNotFound.
func (ib *Inbox[TTx]) GetParked(ctx context.Context, id int64) (Parked, error) {
	p, found, err := ib.loadParked(ctx, ib.drv.Executor(), ib.q.selectParked, ib.name, id)
	if err != nil {
		return Parked{}, err
	}
	if !found {
		return Parked{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	return p, nil
}

func (ib *Inbox[TTx]) loadParked(ctx context.Context, exec driver.Executor, query string, args ...any) (Parked, bool, error) {
	rows, err := exec.Query(ctx, query, args...)
	if err != nil {
		return Parked{}, false, fmt.Errorf("inbox: load parked: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		return Parked{}, false, rows.Err()
	}
	p, err := scanParked(rows)
	if err != nil {
		return Parked{}, false, fmt.Errorf("inbox: load parked: %w", err)
	}
	rows.Close()
	return p, true, rows.Err()
}

func scanParked(rows driver.Rows) (Parked, error) {
	var p Parked
	var reason string
	var resolvedAt, occurredAt sql.NullTime
	var eventID sql.NullString
	var schemaVersion int64
	e := &p.Event
	h := &e.Headers
	err := rows.Scan(&p.ID, &p.Consumer, &reason, &p.Attempts, &p.FirstSeen, &p.LastSeen, &p.LastError, &resolvedAt, &p.Resolution,
		&e.TenantID, &eventID, &e.AggregateType, &e.AggregateID, &e.AggregateSeq, &e.EventType, &schemaVersion, &e.ContentType, &e.Payload,
		&occurredAt, &e.Topic, &h.Traceparent, &h.CorrelationID, &h.CausationID, &h.Principal, &h.Action, &h.Target,
		&p.Fingerprint, &p.OtherFingerprint, &p.Raw.Destination, &p.Raw.Key, &p.Raw.Headers, &p.Raw.Body)
	if err != nil {
		return p, err
	}
	p.Reason = Reason(reason)
	e.SchemaVersion = int(schemaVersion)
	if resolvedAt.Valid {
		t := resolvedAt.Time
		p.ResolvedAt = &t
	}
	if occurredAt.Valid {
		e.OccurredAt = occurredAt.Time.UTC()
	}
	if eventID.Valid {
		id, err := uuid.Parse(eventID.String)
		if err != nil {
			return p, fmt.Errorf("parked row %d: event_id: %w", p.ID, err)
		}
		e.ID = id
	}
	return p, nil
}

// ReplayResult says what a replay (or dry run) did with one parked message.
type ReplayResult struct {
	ID      int64
	Outcome Outcome // applied, duplicate, stale, parked (again), retry
	// Reason is the parking reason when Outcome is parked.
	Reason Reason
	// Error explains a parked or failed outcome (sanitised).
	Error string
	// Successors counts parked gap successors applied after this one.
	Successors int
	// Err is ErrNotFound, ErrNotParked, ErrNotReplayable, or an
	// infrastructure error; nil when the replay ran.
	Err error
}

// ErrNotReplayable: an undecodable message has no event to replay; fix the
// producer and resolve the row, or re-publish.
var ErrNotReplayable = errors.New("inbox: undecodable message cannot be replayed")

// MaxReplayIDs bounds one Replay / DryRun call.
const MaxReplayIDs = 1000

// Replay re-runs parked messages through the live path, each in its own
// transaction: schema, authorization, dedup and cursor are checked against
// the current state, then the handler runs — never around the inbox. An
// applied message's parked gap successors follow in the same transaction.
// A message that still cannot be applied stays parked (possibly with a
// new reason, attempts + 1).
func (ib *Inbox[TTx]) Replay(ctx context.Context, ids ...int64) ([]ReplayResult, error) {
	return ib.replayIDs(ctx, ids, false)
}

// DryRun reports what Replay would do, without calling the handler and
// without writing anything (every check runs in a transaction that is
// rolled back). A dry run says "applied" when the handler would be called.
func (ib *Inbox[TTx]) DryRun(ctx context.Context, ids ...int64) ([]ReplayResult, error) {
	return ib.replayIDs(ctx, ids, true)
}

func (ib *Inbox[TTx]) replayIDs(ctx context.Context, ids []int64, dryRun bool) ([]ReplayResult, error) {
	if len(ids) == 0 || len(ids) > MaxReplayIDs {
		return nil, &ferry.ConfigError{Field: "ids", Reason: fmt.Sprintf("need 1..%d parked ids, got %d", MaxReplayIDs, len(ids))}
	}
	out := make([]ReplayResult, 0, len(ids))
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = append(out, ib.replayOne(ctx, id, dryRun, nil))
	}
	return out, nil
}

// beforeReplay runs inside the replay transaction before the replay
// itself (ReleaseGap moves the cursor there).
type beforeReplay func(ctx context.Context, tx driver.Tx, p Parked) error

func (ib *Inbox[TTx]) replayOne(ctx context.Context, id int64, dryRun bool, before beforeReplay) ReplayResult {
	res := ReplayResult{ID: id}
	txv, tx, err := ib.drv.BeginTx(ctx)
	if err != nil {
		res.Err = fmt.Errorf("inbox: begin: %w", err)
		return res
	}
	defer func() { _ = tx.Rollback(ctx) }()
	p, found, err := ib.loadParked(ctx, tx, ib.q.selectParked, ib.name, id)
	switch {
	case err != nil:
		res.Err = err
		return res
	case !found:
		res.Err = fmt.Errorf("%w: id %d", ErrNotFound, id)
		return res
	case p.ResolvedAt != nil:
		res.Err = fmt.Errorf("%w: id %d was resolved as %s", ErrNotParked, id, p.Resolution)
		return res
	case p.Reason == ReasonUndecodable:
		res.Err = fmt.Errorf("%w: id %d", ErrNotReplayable, id)
		return res
	}
	if before != nil {
		if err := before(ctx, tx, p); err != nil {
			res.Err = err
			return res
		}
	}
	if dryRun {
		m := &message{ev: p.Event, fp: Fingerprint(p.Event), parkedID: p.ID}
		sr, err := ib.step(ctx, txv, tx, m, true, false)
		if err != nil {
			res.Err = err
			return res
		}
		res.Outcome, res.Reason, res.Error = describeStep(sr, p.Reason)
		return res // rolled back by the deferred Rollback
	}
	var tally txTally
	done, _, r, err := ib.replayParkedResult(ctx, txv, tx, p, &tally)
	if err != nil {
		res.Err = err
		return res
	}
	res.Outcome, res.Reason, res.Error = r.Outcome, r.Reason, r.Error
	if done && res.Outcome == OutcomeApplied {
		before := tally.successorsApplied
		if err := ib.applySuccessors(ctx, txv, tx, p.Event, &tally); err != nil {
			res.Err = err
			return res
		}
		res.Successors = tally.successorsApplied - before
	}
	if err := tx.Commit(ctx); err != nil {
		res.Err = fmt.Errorf("inbox: commit: %w", err)
		return res
	}
	ib.stats.applied.Add(int64(tally.successorsApplied))
	ib.m.applied.Add(float64(tally.successorsApplied))
	ib.log.InfoContext(ctx, "parked message replayed", "parked_id", id, "event_id", p.Event.ID, "outcome", res.Outcome,
		"reason", res.Reason, "successors", res.Successors)
	return res
}

func describeStep(sr stepResult, current Reason) (Outcome, Reason, string) {
	errText := ""
	if sr.err != nil {
		errText = sanitize.Error(sr.err)
	}
	switch sr.kind {
	case stepApplied:
		return OutcomeApplied, "", ""
	case stepDuplicate:
		return OutcomeDuplicate, "", ""
	case stepStale:
		return OutcomeStale, "", ""
	case stepGap:
		return OutcomeParked, ReasonGap, errText
	case stepCollision:
		return OutcomeParked, ReasonCollision, "fingerprint differs from the applied event with this tenant and event id"
	case stepSchema:
		return OutcomeParked, ReasonSchema, errText
	case stepDecrypt:
		return OutcomeParked, ReasonDecrypt, errText
	case stepClaimCheck:
		return OutcomeParked, ReasonClaimCheck, errText
	case stepUnauthorized:
		return OutcomeParked, ReasonUnauthorized, errText
	case stepFailed:
		if errors.Is(sr.err, ErrPermanent) {
			return OutcomeParked, ReasonPoison, errText
		}
		return OutcomeParked, current, errText
	}
	return OutcomeRetry, "", errText
}

// replayParked runs one parked row through the live path under a
// savepoint, inside tx. done reports the row was resolved (applied,
// duplicate or stale); seq is its sequence when applied.
func (ib *Inbox[TTx]) replayParked(ctx context.Context, txv TTx, tx driver.Tx, p Parked, tally *txTally) (bool, int64, error) {
	done, seq, _, err := ib.replayParkedResult(ctx, txv, tx, p, tally)
	if err != nil {
		// Only an error the savepoint undoes is the successor's alone. A
		// MySQL deadlock rolls back the whole transaction, savepoint and
		// the outer message's effect with it: swallowing that error
		// committed nothing and acked the outer message, whose successors
		// then waited parked for ever (the chaos test, mysql/batch-64). The
		// transaction fails instead and its messages are retried.
		if rbErr := rollbackTo(ctx, tx, replaySavepoint); rbErr != nil {
			return false, 0, fmt.Errorf("inbox: parked successor %d: %w", p.ID, errors.Join(err, rbErr))
		}
		if relErr := releaseSavepoint(ctx, tx, replaySavepoint); relErr != nil {
			return false, 0, fmt.Errorf("inbox: parked successor %d: %w", p.ID, errors.Join(err, relErr))
		}
		// A successor that cannot be replayed now stays parked; the heal
		// sweep or an operator tries again. The outer message is unaffected.
		ib.log.WarnContext(ctx, "parked successor not applied", "parked_id", p.ID, "event_id", p.Event.ID, slog.String(logattr.ErrKey, sanitize.Error(err)))
		return false, 0, nil
	}
	return done, seq, nil
}

// replaySavepoint is the savepoint a parked row's replay runs under.
const replaySavepoint = "ferry_inbox_replay"

func (ib *Inbox[TTx]) replayParkedResult(ctx context.Context, txv TTx, tx driver.Tx, p Parked, tally *txTally) (bool, int64, ReplayResult, error) {
	m := &message{ev: p.Event, fp: Fingerprint(p.Event), parkedID: p.ID, attempt: p.Attempts + 1}
	// Errors after the savepoint leave it in place: replayParked rolls
	// back to it, or learns the transaction is gone (replayOne rolls the
	// whole transaction back).
	const sp = replaySavepoint
	if err := savepoint(ctx, tx, sp, false); err != nil {
		return false, 0, ReplayResult{}, err
	}
	release := func() error { return releaseSavepoint(ctx, tx, sp) }
	sr, err := ib.step(ctx, txv, tx, m, false, false)
	if err != nil {
		return false, 0, ReplayResult{}, err
	}
	outcome, reason, errText := describeStep(sr, p.Reason)
	r := ReplayResult{ID: p.ID, Outcome: outcome, Reason: reason, Error: errText}
	now := ib.cfg.now().UTC()
	switch sr.kind {
	case stepApplied, stepDuplicate, stepStale:
		if f := ib.cfg.beforeResolveParked; f != nil {
			if err := f(ctx, tx); err != nil {
				return false, 0, r, fmt.Errorf("inbox: resolve parked: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, ib.q.resolve, ib.name, p.ID, now, string(outcome)); err != nil {
			return false, 0, r, fmt.Errorf("inbox: resolve parked: %w", err)
		}
		if sr.kind == stepApplied {
			tally.successorsApplied++
		}
		return true, p.Event.AggregateSeq, r, release()
	case stepUnauthorized, stepFailed, stepDecrypt, stepClaimCheck:
		if err := rollbackTo(ctx, tx, sp); err != nil {
			return false, 0, r, err
		}
		if sr.kind == stepFailed && m.attempt >= ib.cfg.maxAttempts && reason != ReasonPoison {
			r.Reason = ReasonPoison
		}
	}
	var otherFP []byte
	if sr.kind == stepCollision {
		otherFP = sr.prevFP
	}
	// Same park key as the open row: the upsert updates it in place.
	if _, err := ib.park(ctx, tx, m, r.Reason, r.Error, otherFP); err != nil {
		return false, 0, r, err
	}
	return false, 0, r, release()
}

// ReleaseResult says what ReleaseGap did.
type ReleaseResult struct {
	ReplayResult
	// SkippedFrom..SkippedTo is the range of sequences the cursor jumped
	// over (events this consumer will treat as stale if they ever arrive).
	SkippedFrom, SkippedTo int64
}

// ReleaseGap gives up waiting for the events missing before the parked gap
// message id: it moves the aggregate's cursor to just before it, then
// replays it and its parked successors (every check still runs). Use it
// when the missing events are known to be lost or dead upstream; the
// skipped range is logged and returned.
func (ib *Inbox[TTx]) ReleaseGap(ctx context.Context, id int64) (ReleaseResult, error) {
	var rr ReleaseResult
	before := func(ctx context.Context, tx driver.Tx, p Parked) error {
		if p.Reason != ReasonGap {
			return fmt.Errorf("%w: id %d is parked as %s", ErrNotGap, id, p.Reason)
		}
		ev := p.Event
		cur := int64(0)
		var found bool
		if err := queryRow(ctx, tx, ib.q.cursorOf, []any{ib.name, ev.TenantID, ev.AggregateType, ev.AggregateID}, &found, &cur); err != nil {
			return fmt.Errorf("inbox: read cursor: %w", err)
		}
		if cur >= ev.AggregateSeq-1 {
			return nil // nothing to skip: the replay will apply or resolve it
		}
		rr.SkippedFrom, rr.SkippedTo = cur+1, ev.AggregateSeq-1
		if _, err := tx.Exec(ctx, ib.q.setCursor, ib.name, ev.TenantID, ev.AggregateType, ev.AggregateID, ev.AggregateSeq-1, ib.cfg.now().UTC()); err != nil {
			return fmt.Errorf("inbox: move cursor: %w", err)
		}
		ib.log.WarnContext(ctx, "gap released by operator: cursor moved past missing events", "parked_id", id,
			"tenant_id", ev.TenantID, "aggregate_type", ev.AggregateType, "aggregate_id", ev.AggregateID,
			"skipped_from", rr.SkippedFrom, "skipped_to", rr.SkippedTo)
		return nil
	}
	rr.ReplayResult = ib.replayOne(ctx, id, false, before)
	return rr, rr.Err
}

// HealGaps applies parked gap messages whose predecessor has been applied
// meanwhile (normally done at once by the live path; this covers a
// successor parked by another instance in the same instant). Run calls it
// every heal interval. It returns how many rows it resolved.
func (ib *Inbox[TTx]) HealGaps(ctx context.Context) (int, error) {
	rows, err := ib.drv.Executor().Query(ctx, ib.q.healIDs, ib.name, 100)
	if err != nil {
		return 0, fmt.Errorf("inbox: heal: %w", err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fmt.Errorf("inbox: heal: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("inbox: heal: %w", err)
	}
	n := 0
	for _, id := range ids {
		r := ib.replayOne(ctx, id, false, nil)
		if r.Err == nil && r.Outcome != OutcomeParked {
			n += 1 + r.Successors
		}
	}
	return n, nil
}
