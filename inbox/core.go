package inbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/sanitize"
	"github.com/ferryhq/ferry/otelferry"
)

// message is one unit of inbox work: a live delivery, or a parked row
// being replayed.
type message struct {
	ev       ferry.Event
	fp       [32]byte
	d        *broker.Delivery // nil for replays
	invalid  error            // decode or validation failure: park undecodable
	attempt  int              // attempts so far including this one
	parkedID int64            // replays: the row being replayed
	gated    bool             // entered in Run's idGate; left after processing
	gateKey  string           // the key it entered under

	// set by applyBatch
	outcome Outcome
	reason  Reason
	errText string
	delay   time.Duration // retry: nack delay
}

func (m *message) key() string {
	return m.ev.TenantID + "\x00" + m.ev.ID.String()
}

// newMessage turns a delivery into work, validating the decoded event: a
// message that would break the inbox's own writes (empty keys, invalid
// UTF-8, NUL bytes) is parked as undecodable instead of failing forever.
func newMessage(d *broker.Delivery) *message {
	m := &message{d: d, ev: d.Event}
	if d.DecodeErr != nil {
		m.invalid = d.DecodeErr
		return m
	}
	if err := validateEvent(&m.ev); err != nil {
		m.invalid = err
		return m
	}
	m.fp = Fingerprint(m.ev)
	return m
}

// admit is newMessage under the consumer's limits ([WithLimits]): a
// decoded event its producer would have refused (payload too large,
// content type not accepted, over-long names or headers) is invalid and
// parks as undecodable with the validation error, which names the field
// and the limit.
func (ib *Inbox[TTx]) admit(d *broker.Delivery) *message {
	m := newMessage(d)
	if m.invalid == nil {
		m.invalid = ib.checkLimits(m.ev)
	}
	return m
}

// checkLimits runs the producer's validation (ferry.Limits.Validate, the
// one validator) on a delivered event. The topic is left out: it is the
// broker's destination, which the delivery already reached.
func (ib *Inbox[TTx]) checkLimits(ev ferry.Event) error {
	ev.Topic = ""
	if err := ib.cfg.limits.Validate(0, &ev); err != nil {
		return fmt.Errorf("inbox: event outside the consumer's limits (inbox.WithLimits): %w", err)
	}
	return nil
}

func validateEvent(ev *ferry.Event) error {
	bad := func(field, reason string) error {
		return &ferry.ValidationError{Field: field, Reason: reason}
	}
	if ev.ID == uuid.Nil {
		return bad("event_id", "must not be empty")
	}
	for _, f := range []struct {
		name, v  string
		required bool
	}{
		{"tenant_id", ev.TenantID, true}, {"aggregate_type", ev.AggregateType, true}, {"aggregate_id", ev.AggregateID, true},
		{"event_type", ev.EventType, true}, {"content_type", ev.ContentType, false}, {"topic", ev.Topic, false},
		{"headers.traceparent", ev.Headers.Traceparent, false}, {"headers.correlation_id", ev.Headers.CorrelationID, false},
		{"headers.causation_id", ev.Headers.CausationID, false}, {"headers.principal", ev.Headers.Principal, false},
		{"headers.action", ev.Headers.Action, false}, {"headers.target", ev.Headers.Target, false},
	} {
		switch {
		case f.required && f.v == "":
			return bad(f.name, "must not be empty")
		case len(f.v) > 4096:
			return bad(f.name, fmt.Sprintf("%d bytes exceeds the limit of 4096 bytes", len(f.v)))
		case !utf8.ValidString(f.v) || strings.IndexByte(f.v, 0) >= 0:
			return bad(f.name, "must be valid UTF-8 without NUL bytes")
		}
	}
	if ev.AggregateSeq < 1 {
		return bad("aggregate_seq", fmt.Sprintf("must be >= 1, got %d", ev.AggregateSeq))
	}
	if ev.SchemaVersion < 1 || ev.SchemaVersion > 1<<30 {
		return bad("schema_version", fmt.Sprintf("must be in 1..2^30, got %d", ev.SchemaVersion))
	}
	if !ev.OccurredAt.IsZero() && (ev.OccurredAt.Year() < 1 || ev.OccurredAt.Year() > 9999) {
		return bad("occurred_at", "year outside 1..9999")
	}
	return nil
}

// claimResult is what the claim statement found and did.
type claimResult struct {
	decision     string // apply, duplicate, collision, stale, gap
	prevFP       []byte
	lastSeq      int64 // -1: no cursor
	claimed      bool
	advanced     bool
	hasSuccessor bool
}

// claim runs the dedup + cursor check and, when the event is to be
// applied, writes the claim and advances the cursor — one round trip on
// Postgres.
func (ib *Inbox[TTx]) claim(ctx context.Context, exec driver.Executor, m *message, now time.Time) (claimResult, error) {
	ev := &m.ev
	anyStart := ib.cfg.start == StartAtFirstSeen
	if ib.q.dialect == driver.Postgres {
		rows, err := exec.Query(ctx, ib.q.claimPG, ib.name, ev.TenantID, ev.ID.String(), ev.AggregateType, ev.AggregateID,
			ev.AggregateSeq, m.fp[:], ib.cfg.ordering, anyStart, ev.EventType, now)
		if err != nil {
			return claimResult{}, fmt.Errorf("inbox: claim: %w", err)
		}
		defer rows.Close()
		var r claimResult
		var claimed, advanced int64
		if !rows.Next() {
			if err := rows.Err(); err != nil {
				return claimResult{}, fmt.Errorf("inbox: claim: %w", err)
			}
			return claimResult{}, errors.New("inbox: claim returned no row")
		}
		if err := rows.Scan(&r.decision, &r.prevFP, &r.lastSeq, &claimed, &advanced, &r.hasSuccessor); err != nil {
			return claimResult{}, fmt.Errorf("inbox: claim: %w", err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return claimResult{}, fmt.Errorf("inbox: claim: %w", err)
		}
		r.claimed, r.advanced = claimed > 0, advanced > 0
		return r, nil
	}
	return ib.claimSQLite(ctx, exec, m, now)
}

func (ib *Inbox[TTx]) claimSQLite(ctx context.Context, exec driver.Executor, m *message, now time.Time) (claimResult, error) {
	ev := &m.ev
	r := claimResult{lastSeq: -1}
	var hasPrev bool
	// The cursor first: on MySQL its FOR UPDATE waits for a concurrent
	// applier of the same aggregate to commit, and the dedup read after it
	// (a new READ COMMITTED snapshot) then sees that applier's claim, so a
	// redelivery is a duplicate, not stale. SQLite serialises anyway.
	if ib.cfg.ordering {
		var found bool
		if err := queryRow(ctx, exec, ib.q.sqliteCursor, []any{ib.name, ev.TenantID, ev.AggregateType, ev.AggregateID}, &found, &r.lastSeq); err != nil {
			return r, fmt.Errorf("inbox: claim: %w", err)
		}
		if !found {
			r.lastSeq = -1
		}
	}
	if err := queryRow(ctx, exec, ib.q.sqlitePrev, []any{ib.name, ev.TenantID, ev.ID.String()}, &hasPrev, &r.prevFP); err != nil {
		return r, fmt.Errorf("inbox: claim: %w", err)
	}
	r.decision = decide(hasPrev, r.prevFP, m.fp[:], ib.cfg.ordering, ib.cfg.start == StartAtFirstSeen, r.lastSeq, ev.AggregateSeq)
	if r.decision != "apply" {
		return r, nil
	}
	n, err := exec.Exec(ctx, ib.q.sqliteInsertClaim, ib.name, ev.TenantID, ev.ID.String(), m.fp[:], ev.AggregateType, ev.AggregateID,
		ev.AggregateSeq, ev.EventType, now)
	if err != nil {
		return r, fmt.Errorf("inbox: claim: %w", err)
	}
	r.claimed = n > 0
	if !r.claimed || !ib.cfg.ordering {
		return r, nil
	}
	n, err = exec.Exec(ctx, ib.q.sqliteAdvance, ib.name, ev.TenantID, ev.AggregateType, ev.AggregateID, ev.AggregateSeq, now)
	if err != nil {
		return r, fmt.Errorf("inbox: advance cursor: %w", err)
	}
	r.advanced = n > 0
	if err := queryRow(ctx, exec, ib.q.sqliteHasSucc, []any{ib.name, ev.TenantID, ev.AggregateType, ev.AggregateID, ev.AggregateSeq + 1}, nil, &r.hasSuccessor); err != nil {
		return r, fmt.Errorf("inbox: claim: %w", err)
	}
	return r, nil
}

// decide is the claim decision; the Postgres statement computes the same
// in SQL.
func decide(hasPrev bool, prevFP, fp []byte, ordering, anyStart bool, last, seq int64) string {
	switch {
	case hasPrev && bytes.Equal(prevFP, fp):
		return "duplicate"
	case hasPrev:
		return "collision"
	case !ordering:
		return "apply"
	case last < 0 && (seq == 1 || anyStart):
		return "apply"
	case last < 0:
		return "gap"
	case seq <= last:
		return "stale"
	case seq == last+1:
		return "apply"
	}
	return "gap"
}

// gapError is the reason of a gap park. last is the aggregate's cursor, -1
// when the consumer has never applied an event of it: then the next
// expected sequence is 1 (a gap is only ever decided for an unseen
// aggregate under StartStrict).
func gapError(last, seq int64) error {
	next := last + 1
	if last < 0 {
		next = 1
	}
	return fmt.Errorf("expected sequence %d, got %d", next, seq)
}

// queryRow scans the first row of a query into dest; found (if not nil)
// says whether there was one.
func queryRow(ctx context.Context, exec driver.Executor, sql string, args []any, found *bool, dest ...any) error {
	ok, err := driver.QueryRow(ctx, exec, sql, args, dest...)
	if found != nil && ok {
		*found = true
	}
	return err
}

// stepKind is the result of running the inbox over one message inside a
// transaction, before the caller decides how to finish it.
type stepKind int

const (
	stepApplied      stepKind = iota + 1
	stepDuplicate             // nothing written
	stepStale                 // nothing written
	stepGap                   // nothing written; park
	stepCollision             // nothing written; park with prevFP
	stepSchema                // nothing written; park
	stepUnauthorized          // claim written: undo, then park
	stepFailed                // claim written and handler failed: undo, then retry or park poison
	stepDecrypt               // claim written and payload does not decrypt (WithDecryption): undo, then park
	stepClaimCheck            // claim written and the offloaded payload is missing or fails its digest (WithClaimCheck): undo, then park
)

type stepResult struct {
	kind         stepKind
	err          error // unauthorized / failed: the reason
	prevFP       []byte
	hasSuccessor bool
}

func (k stepKind) needsUndo() bool {
	return k == stepUnauthorized || k == stepFailed || k == stepDecrypt || k == stepClaimCheck
}

// step runs every check and the handler for one valid message inside tx.
// It never commits. An error return is an infrastructure failure: the
// transaction (or savepoint) must be rolled back and the message retried.
// With dryRun the handler is not called.
func (ib *Inbox[TTx]) step(ctx context.Context, tx TTx, exec driver.Executor, m *message, dryRun, claimOnly bool) (stepResult, error) {
	ev := m.ev
	if ib.cfg.schemas != nil && !ib.cfg.schemas[SchemaKey{ev.EventType, ev.SchemaVersion}] {
		return stepResult{kind: stepSchema, err: fmt.Errorf("event type %q schema version %d is not supported by this consumer", sanitize.Text(ev.EventType, 128), ev.SchemaVersion)}, nil
	}
	// A payload that does not decrypt still goes through the claim, so a
	// redelivered duplicate (or stale event) of an erased subject is
	// absorbed as before; only one that would apply is undone and parked.
	ev, openKind, decryptErr := ib.open(ctx, ev)
	if decryptErr == nil {
		if err := ib.contractErr(ev); err != nil {
			return stepResult{kind: stepSchema, err: err}, nil
		}
	}
	c, err := ib.claim(ctx, exec, m, ib.cfg.now().UTC())
	if err != nil {
		return stepResult{}, err
	}
	switch c.decision {
	case "duplicate":
		return stepResult{kind: stepDuplicate}, nil
	case "collision":
		return stepResult{kind: stepCollision, prevFP: c.prevFP}, nil
	case "stale":
		return stepResult{kind: stepStale}, nil
	case "gap":
		return stepResult{kind: stepGap, err: gapError(c.lastSeq, ev.AggregateSeq)}, nil
	case "apply":
	default:
		return stepResult{}, fmt.Errorf("inbox: unknown claim decision %q", c.decision)
	}
	if !c.claimed || (ib.cfg.ordering && !c.advanced) {
		return stepResult{}, errConcurrent
	}
	if decryptErr != nil {
		return stepResult{kind: openKind, err: decryptErr}, nil
	}
	if ib.authorize != nil {
		if err := ib.authorize(ctx, tx, ev); err != nil {
			return stepResult{kind: stepUnauthorized, err: err}, nil
		}
	}
	if !dryRun && !claimOnly {
		start := time.Now()
		dest := ev.Topic
		if m.d != nil && m.d.Raw.Destination != "" {
			dest = m.d.Raw.Destination
		}
		hctx, span := ib.cfg.tracer.Start(otelferry.ContextFromTraceparent(ctx, ev.Headers.Traceparent), otelferry.SpanName(otelferry.OperationProcess, dest),
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(otelferry.ProcessAttributes(ib.brokerName(), dest, ev.ID.String(), ib.name)...),
			trace.WithAttributes(attribute.String("ferry.event_type", ev.EventType), attribute.Int64("ferry.aggregate_seq", ev.AggregateSeq)))
		err := ib.handler(hctx, tx, ev)
		if err != nil {
			span.SetStatus(codes.Error, "handler failed")
		}
		span.End()
		ib.m.handlerSeconds.Observe(time.Since(start).Seconds())
		if err != nil {
			return stepResult{kind: stepFailed, err: err}, nil
		}
	}
	return stepResult{kind: stepApplied, hasSuccessor: c.hasSuccessor}, nil
}

// park writes (or updates) the open parked row of m: one row per distinct
// message, whatever the reason, so a redelivery or replay bumps attempts.
func (ib *Inbox[TTx]) park(ctx context.Context, exec driver.Executor, m *message, reason Reason, errText string, otherFP []byte) (int64, error) {
	now := ib.cfg.now().UTC()
	ev := m.ev
	var key string
	var eventID any
	var rawDest, rawKey, rawHeaders string
	var rawBody []byte
	var fp []byte
	if m.invalid != nil {
		ev = sanitizeEvent(ev)
		var note string
		rawDest, rawKey, rawHeaders, rawBody, note = ib.rawForPark(m.d)
		if note != "" {
			errText += " (" + note + ")"
		}
		sum := sha256.Sum256([]byte(rawDest + "\x00" + rawKey + "\x00" + rawHeaders + "\x00" + string(rawBody)))
		key = "raw:" + hex.EncodeToString(sum[:])
	} else {
		fp = m.fp[:]
		key = ev.TenantID + "/" + ev.ID.String() + "/" + hex.EncodeToString(fp)
		if m.d != nil {
			rawDest, rawKey = sanitize.Text(m.d.Raw.Destination, 1024), sanitize.Text(m.d.Raw.Key, 1024)
		}
	}
	if ev.ID != uuid.Nil {
		eventID = ev.ID.String()
	}
	var occurred any
	if !ev.OccurredAt.IsZero() {
		occurred = ev.OccurredAt.UTC()
	}
	payload := ev.Payload
	if payload == nil {
		payload = []byte{}
	}
	if rawBody == nil {
		rawBody = []byte{}
	}
	if fp == nil {
		fp = []byte{}
	}
	if otherFP == nil {
		otherFP = []byte{}
	}
	attempts := max(m.attempt, 1)
	h := ev.Headers
	var id int64
	query := ib.q.park
	if ib.q.parkReadBack != "" {
		// MySQL: the upsert, then the open row's id (no RETURNING).
		query = ib.q.parkReadBack
		if _, err := exec.Exec(ctx, ib.q.park, ib.name, string(reason), key, attempts, now, sanitize.Text(errText, sanitize.MaxErrorBytes),
			ev.TenantID, eventID, ev.AggregateType, ev.AggregateID, ev.AggregateSeq, ev.EventType, ev.SchemaVersion, ev.ContentType, payload,
			occurred, ev.Topic, h.Traceparent, h.CorrelationID, h.CausationID, h.Principal, h.Action, h.Target,
			fp, otherFP, rawDest, rawKey, rawHeaders, rawBody); err != nil {
			return 0, fmt.Errorf("inbox: park %s: %w", reason, err)
		}
	}
	err := queryRow(ctx, exec, query, []any{ib.name, string(reason), key, attempts, now, sanitize.Text(errText, sanitize.MaxErrorBytes),
		ev.TenantID, eventID, ev.AggregateType, ev.AggregateID, ev.AggregateSeq, ev.EventType, ev.SchemaVersion, ev.ContentType, payload,
		occurred, ev.Topic, h.Traceparent, h.CorrelationID, h.CausationID, h.Principal, h.Action, h.Target,
		fp, otherFP, rawDest, rawKey, rawHeaders, rawBody}, nil, &id)
	if err != nil {
		return 0, fmt.Errorf("inbox: park %s: %w", reason, err)
	}
	return id, nil
}

// sanitizeEvent makes the text fields of an invalid event storable.
func sanitizeEvent(ev ferry.Event) ferry.Event {
	const n = 1024
	ev.TenantID, ev.AggregateType, ev.AggregateID = sanitize.Text(ev.TenantID, n), sanitize.Text(ev.AggregateType, n), sanitize.Text(ev.AggregateID, n)
	ev.EventType, ev.ContentType, ev.Topic = sanitize.Text(ev.EventType, n), sanitize.Text(ev.ContentType, n), sanitize.Text(ev.Topic, n)
	h := &ev.Headers
	h.Traceparent, h.CorrelationID, h.CausationID = sanitize.Text(h.Traceparent, n), sanitize.Text(h.CorrelationID, n), sanitize.Text(h.CausationID, n)
	h.Principal, h.Action, h.Target = sanitize.Text(h.Principal, n), sanitize.Text(h.Action, n), sanitize.Text(h.Target, n)
	if ev.SchemaVersion < 0 || ev.SchemaVersion > 1<<30 {
		ev.SchemaVersion = 0
	}
	if !ev.OccurredAt.IsZero() && (ev.OccurredAt.Year() < 1 || ev.OccurredAt.Year() > 9999) {
		ev.OccurredAt = time.Time{}
	}
	ev.Payload = nil // an undecodable message keeps its raw body instead
	return ev
}

// rawForPark bounds and encodes the raw message of an undecodable delivery.
func (ib *Inbox[TTx]) rawForPark(d *broker.Delivery) (dest, key, headers string, body []byte, note string) {
	if d == nil {
		return "", "", "", nil, ""
	}
	limit := ib.cfg.maxRawBytes
	dest, key = sanitize.Text(d.Raw.Destination, 1024), sanitize.Text(d.Raw.Key, 1024)
	// JSON escapes invalid UTF-8 and control bytes, so any header map is storable.
	hm := make(map[string]string, len(d.Raw.Headers))
	for _, k := range slices.Sorted(maps.Keys(d.Raw.Headers)) {
		hm[strings.ToValidUTF8(k, "\uFFFD")] = strings.ToValidUTF8(d.Raw.Headers[k], "\uFFFD")
	}
	hb, _ := json.Marshal(hm)
	var notes []string
	if len(hb) > limit {
		hb = []byte(strings.ToValidUTF8(string(hb[:limit]), ""))
		notes = append(notes, fmt.Sprintf("raw headers cut to %d bytes", limit))
	}
	body = d.Raw.Body
	if len(body) > limit {
		body = body[:limit]
		notes = append(notes, fmt.Sprintf("raw body cut to %d of %d bytes", limit, len(d.Raw.Body)))
	}
	return dest, key, string(hb), body, strings.Join(notes, "; ")
}

// brokerName is the running consumer's broker ("nats", "kafka",
// "rabbitmq") for messaging.system, "" when it does not say (a replay, or
// a Consumer without Name).
func (ib *Inbox[TTx]) brokerName() string {
	if c := ib.running.Load(); c != nil {
		if n, ok := (*c).(interface{ Name() string }); ok {
			return n.Name()
		}
	}
	return ""
}
