package ops

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/effect"
)

// EvidenceKind says how Evidence interprets its argument.
type EvidenceKind string

// Evidence kinds. KindAuto tries an event id (when the argument is a
// UUID), then a command key, then a correlation id.
const (
	KindAuto          EvidenceKind = ""
	KindEventID       EvidenceKind = "event_id"
	KindCorrelationID EvidenceKind = "correlation_id"
	KindCommandKey    EvidenceKind = "command_key"
)

// MaxEvidenceEvents bounds the events one evidence query returns.
const MaxEvidenceEvents = 200

// Evidence is the authoritative story of one event, correlation id or
// command key, read from the tables alone: what a row says happened, and
// nothing a process merely logged or claimed.
type Evidence struct {
	Query   string           `json:"query"`
	Kind    EvidenceKind     `json:"kind"`
	Command *CommandEvidence `json:"command,omitempty"`
	Events  []EventEvidence  `json:"events"`
	// Truncated: more events matched than MaxEvidenceEvents.
	Truncated bool `json:"truncated,omitempty"`
	// Missing names tables that are not installed, so their part of the
	// story cannot be told (not: "did not happen").
	Missing []string `json:"missing,omitempty"`
}

// CommandEvidence is the command_keys row of a command key.
type CommandEvidence struct {
	TenantID  string    `json:"tenant_id"`
	Key       string    `json:"key"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	EventIDs  []string  `json:"event_ids"`
}

// EventEvidence is everything the tables hold about one event.
type EventEvidence struct {
	EventID string `json:"event_id"`
	// Committed is the outbox row; nil when there is none (never written,
	// or deleted by cleanup — Applied may still prove it existed).
	Committed *Committed `json:"committed,omitempty"`
	// Published is the relay's record; nil while the row was never sent.
	Published *Published         `json:"published,omitempty"`
	Applied   []Applied          `json:"applied"`
	Parked    []ParkedEvidence   `json:"parked"`
	Effects   []EffectEvidence   `json:"effects"`
	Audit     []AuditEntrySketch `json:"audit"`
	// Summary is a one-line reading of the above, e.g. "committed;
	// published 2 times; applied by 1 consumer; effects: 1 succeeded".
	Summary string `json:"summary"`
}

// Committed is the producer's side: the outbox row.
type Committed struct {
	OutboxID      int64     `json:"outbox_id"`
	At            time.Time `json:"at"` // created_at: the producer transaction's time
	OccurredAt    time.Time `json:"occurred_at"`
	TenantID      string    `json:"tenant_id"`
	Principal     string    `json:"principal,omitempty"`
	Action        string    `json:"action,omitempty"`
	Target        string    `json:"target,omitempty"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	AggregateSeq  int64     `json:"aggregate_seq"`
	EventType     string    `json:"event_type"`
	SchemaVersion int       `json:"schema_version"`
	Topic         string    `json:"topic"`
	CorrelationID string    `json:"correlation_id,omitempty"`
	CausationID   string    `json:"causation_id,omitempty"`
	Traceparent   string    `json:"traceparent,omitempty"`
}

// Published is the relay's side of the outbox row, plus the audit trail
// of replays.
type Published struct {
	Status      string     `json:"status"` // pending, sent, dead
	PublishedAt *time.Time `json:"published_at,omitempty"`
	Receipt     string     `json:"broker_receipt,omitempty"` // of the last publish
	// Attempts counts failed attempts since the last reset (the relay
	// increments it on failure; retry and replay reset it).
	Attempts  int        `json:"attempts"`
	LastError string     `json:"last_error,omitempty"`
	Discarded *time.Time `json:"discarded_at,omitempty"`
	// Publications is how many times the tables show the event published:
	// the first publish plus every audited replay the relay completed
	// (replayed before the current published_at). The outbox keeps only the
	// last receipt; earlier ones are in the broker.
	Publications int `json:"publications"`
	// Broker is what the tables can say about the broker holding the
	// event: BrokerPublished (a relay recorded the broker's ack),
	// BrokerUnknown (no ack recorded, yet the broker may hold it — see
	// UnknownReason), BrokerDead (refused permanently) or BrokerDiscarded.
	// A pending row is never read as "not published": a relay marks a row
	// only after the broker acknowledged it, so between the ack and the
	// mark (an attempt in flight, a relay killed in between, a CDC relay
	// whose slot passed the row before it was marked) the broker holds an
	// event the table still calls pending. Only the broker can settle it.
	Broker string `json:"broker"`
	// UnknownReason explains a BrokerUnknown reading.
	UnknownReason string `json:"unknown_reason,omitempty"`
}

// Readings of Published.Broker.
const (
	BrokerPublished = "published"
	BrokerUnknown   = "unknown"
	BrokerDead      = "dead"
	BrokerDiscarded = "discarded"
)

// Applied is one consumer's inbox claim: the effect committed once.
type Applied struct {
	Consumer    string    `json:"consumer"`
	TenantID    string    `json:"tenant_id"`
	AppliedAt   time.Time `json:"applied_at"`
	Fingerprint string    `json:"fingerprint"`
}

// ParkedEvidence is a parked inbox row of the event (open or resolved).
type ParkedEvidence struct {
	ID         int64      `json:"id"`
	Consumer   string     `json:"consumer"`
	Reason     string     `json:"reason"`
	Attempts   int        `json:"attempts"`
	FirstSeen  time.Time  `json:"first_seen"`
	LastSeen   time.Time  `json:"last_seen"`
	LastError  string     `json:"last_error,omitempty"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	Resolution string     `json:"resolution,omitempty"`
}

// EffectEvidence is an effect-ledger row caused by the event.
type EffectEvidence struct {
	Consumer        string     `json:"consumer"`
	Step            string     `json:"step"`
	Key             string     `json:"idempotency_key"`
	Target          string     `json:"target"`
	Operation       string     `json:"operation"`
	State           string     `json:"state"`
	OperationID     string     `json:"provider_operation_id,omitempty"`
	Attempts        int        `json:"attempts"`
	Reconciliations int        `json:"reconciliations"`
	ResponseSummary string     `json:"response_summary,omitempty"`
	LastError       string     `json:"last_error,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	UnknownSince    *time.Time `json:"unknown_since,omitempty"`
	CompletedAt     *time.Time `json:"completed_at,omitempty"`
}

// AuditEntrySketch is an audit row that named the event.
type AuditEntrySketch struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Reason string    `json:"reason"`
}

// Evidence answers "did it really happen?" for q, an event id, a
// correlation id or a command key (kind KindAuto guesses in that order).
// ErrNotFound when no table mentions q.
func (o *Ops) Evidence(ctx context.Context, q string, kind EvidenceKind) (Evidence, error) {
	q = strings.TrimSpace(q)
	if q == "" || len(q) > 512 {
		return Evidence{}, &ArgError{Field: "query", Reason: "must be 1..512 bytes"}
	}
	ev := Evidence{Query: q, Kind: kind}
	// An event's inbox claims, read once when the lookup by event id
	// needed them to find the event and reused for its evidence.
	claims := map[string][]Applied{}
	var ids []string
	var err error
	try := func(k EvidenceKind) (bool, error) {
		switch k {
		case KindEventID:
			u, perr := uuid.Parse(q)
			if perr != nil {
				if kind == KindEventID {
					return false, &ArgError{Field: "event_id", Reason: "not a UUID"}
				}
				return false, nil
			}
			found, err := o.eventMentioned(ctx, u.String(), claims)
			if err != nil || !found {
				return false, err
			}
			ids = []string{u.String()}
		case KindCommandKey:
			ok, err := o.tableExists(ctx, o.db.Executor(), "command_keys")
			if err != nil {
				return false, err
			}
			if !ok {
				ev.Missing = append(ev.Missing, "command_keys")
				return false, nil
			}
			cmd, err := o.commandKey(ctx, q)
			if err != nil || cmd == nil {
				return false, err
			}
			ev.Command = cmd
			ids = cmd.EventIDs
		case KindCorrelationID:
			ids, err = o.correlated(ctx, q)
			if err != nil || len(ids) == 0 {
				return false, err
			}
			if len(ids) > MaxEvidenceEvents {
				ids, ev.Truncated = ids[:MaxEvidenceEvents], true
			}
		}
		ev.Kind = k
		return true, nil
	}
	order := []EvidenceKind{kind}
	if kind == KindAuto {
		order = []EvidenceKind{KindEventID, KindCommandKey, KindCorrelationID}
	} else if kind != KindEventID && kind != KindCommandKey && kind != KindCorrelationID {
		return Evidence{}, &ArgError{Field: "kind", Reason: "must be event_id, correlation_id or command_key"}
	}
	found := false
	for _, k := range order {
		ok, err := try(k)
		if err != nil {
			return Evidence{}, err
		}
		if ok {
			found = true
			break
		}
	}
	if !found {
		return ev, fmt.Errorf("%w: no table mentions %q", ErrNotFound, q)
	}
	missing := map[string]bool{}
	for _, id := range ids {
		e, err := o.eventEvidence(ctx, id, missing, claims)
		if err != nil {
			return ev, err
		}
		ev.Events = append(ev.Events, e)
	}
	for m := range missing {
		ev.Missing = append(ev.Missing, m)
	}
	sort.Strings(ev.Missing)
	if ev.Events == nil {
		ev.Events = []EventEvidence{}
	}
	return ev, nil
}

// eventMentioned reports whether the outbox or the inbox knows event id;
// the inbox claims it read go into claims.
func (o *Ops) eventMentioned(ctx context.Context, id string, claims map[string][]Applied) (bool, error) {
	exec := o.db.Executor()
	var n int64
	if err := queryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM %s WHERE event_id = $1`, o.t("outbox")), []any{id}, &n); err != nil {
		return false, fmt.Errorf("ops: evidence: %w", err)
	}
	if n > 0 {
		return true, nil
	}
	for _, tbl := range []string{"inbox", "inbox_parked", "effects"} {
		ok, err := o.tableExists(ctx, exec, tbl)
		if err != nil {
			return false, err
		}
		if !ok {
			continue
		}
		if tbl == "inbox" {
			applied, err := o.inboxClaims(ctx, exec, id)
			if err != nil {
				return false, err
			}
			claims[id] = applied
			if len(applied) > 0 {
				return true, nil
			}
			continue
		}
		if err := queryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM %s WHERE event_id = $1`, o.t(tbl)), []any{id}, &n); err != nil {
			return false, fmt.Errorf("ops: evidence: %w", err)
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

func (o *Ops) commandKey(ctx context.Context, key string) (*CommandEvidence, error) {
	rows, err := o.db.Executor().Query(ctx, fmt.Sprintf(`SELECT tenant_id, idem_key, event_ids, created_at, expires_at FROM %s WHERE idem_key = $1 ORDER BY tenant_id LIMIT 2`, o.t("command_keys")), key)
	if err != nil {
		return nil, fmt.Errorf("ops: evidence command key: %w", err)
	}
	defer rows.Close()
	var out []*CommandEvidence
	for rows.Next() {
		c := &CommandEvidence{}
		var ids string
		var created, expires nullTime
		if err := rows.Scan(&c.TenantID, &c.Key, &ids, &created, &expires); err != nil {
			return nil, fmt.Errorf("ops: evidence command key: %w", err)
		}
		c.CreatedAt, c.ExpiresAt = created.Time, expires.Time
		c.EventIDs = []string{}
		for _, id := range strings.Split(ids, ",") {
			if id = strings.TrimSpace(id); id != "" {
				c.EventIDs = append(c.EventIDs, id)
			}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) > 1 {
		return nil, &ArgError{Field: "command_key", Reason: "the key exists for several tenants; evidence by one of its event ids instead"}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out[0], nil
}

func (o *Ops) correlated(ctx context.Context, corr string) ([]string, error) {
	rows, err := o.db.Executor().Query(ctx, fmt.Sprintf(`SELECT %s FROM %s WHERE correlation_id = $1 ORDER BY id LIMIT %d`,
		o.uuidText("event_id"), o.t("outbox"), MaxEvidenceEvents+1), corr)
	if err != nil {
		return nil, fmt.Errorf("ops: evidence correlation: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func (o *Ops) eventEvidence(ctx context.Context, id string, missing map[string]bool, claims map[string][]Applied) (EventEvidence, error) {
	exec := o.db.Executor()
	e := EventEvidence{EventID: id, Applied: []Applied{}, Parked: []ParkedEvidence{}, Effects: []EffectEvidence{}, Audit: []AuditEntrySketch{}}
	cols, err := o.outboxReadCols(ctx, exec)
	if err != nil {
		return e, err
	}
	ms, err := o.queryOutbox(ctx, exec, fmt.Sprintf(`SELECT %s FROM %s WHERE event_id = $1`, cols, o.t("outbox")), id)
	if err != nil {
		return e, err
	}
	// Audit rows that named the event (replays, retries, discards).
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT id, at, actor, action, reason FROM %s WHERE ids LIKE $1 ORDER BY id`, o.t("ops_audit")), `%"`+id+`"%`)
	if err != nil {
		return e, fmt.Errorf("ops: evidence audit: %w", err)
	}
	for rows.Next() {
		var a AuditEntrySketch
		var at nullTime
		if err := rows.Scan(&a.ID, &at, &a.Actor, &a.Action, &a.Reason); err != nil {
			rows.Close()
			return e, err
		}
		a.At = at.Time
		e.Audit = append(e.Audit, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return e, err
	}
	if len(ms) == 1 {
		m := ms[0]
		e.Committed = &Committed{OutboxID: m.ID, At: m.CreatedAt, OccurredAt: m.OccurredAt, TenantID: m.TenantID, Principal: m.Principal,
			Action: m.Action, Target: m.Target, AggregateType: m.AggregateType, AggregateID: m.AggregateID, AggregateSeq: m.AggregateSeq,
			EventType: m.EventType, SchemaVersion: m.SchemaVersion, Topic: m.Topic, CorrelationID: m.CorrelationID,
			CausationID: m.CausationID, Traceparent: m.Traceparent}
		p := &Published{Status: m.Status, PublishedAt: m.PublishedAt, Receipt: m.BrokerReceipt, Attempts: m.Attempts,
			LastError: m.LastError, Discarded: m.DiscardedAt}
		if m.PublishedAt != nil {
			p.Publications = 1
			for _, a := range e.Audit {
				if a.Action == "outbox.replay" && a.At.Before(*m.PublishedAt) {
					p.Publications++
				}
			}
		}
		o.readBroker(ctx, p)
		e.Published = p
	}
	if ok, err := o.tableExists(ctx, exec, "inbox"); err != nil {
		return e, err
	} else if !ok {
		missing["inbox"] = true
	} else {
		applied, read := claims[id]
		if !read {
			var err error
			if applied, err = o.inboxClaims(ctx, exec, id); err != nil {
				return e, err
			}
		}
		e.Applied = append(e.Applied, applied...)
	}
	if ok, err := o.tableExists(ctx, exec, "inbox_parked"); err != nil {
		return e, err
	} else if ok {
		rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT id, consumer, reason, attempts, first_seen, last_seen, last_error, resolved_at, resolution
FROM %s WHERE event_id = $1 ORDER BY id`, o.t("inbox_parked")), id)
		if err != nil {
			return e, fmt.Errorf("ops: evidence parked: %w", err)
		}
		for rows.Next() {
			var p ParkedEvidence
			var first, last, resolved nullTime
			if err := rows.Scan(&p.ID, &p.Consumer, &p.Reason, &p.Attempts, &first, &last, &p.LastError, &resolved, &p.Resolution); err != nil {
				rows.Close()
				return e, err
			}
			p.FirstSeen, p.LastSeen, p.ResolvedAt = first.Time, last.Time, resolved.ptr()
			e.Parked = append(e.Parked, p)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return e, err
		}
	}
	if ok, err := o.tableExists(ctx, exec, "effects"); err != nil {
		return e, err
	} else if !ok {
		missing["effects"] = true
	} else {
		u, err := uuid.Parse(id)
		if err != nil {
			return e, fmt.Errorf("ops: evidence: stored event id %q: %w", id, err)
		}
		recs, err := effect.ByEvent(ctx, exec, o.cfg.tables, u)
		if err != nil {
			return e, fmt.Errorf("ops: evidence effects: %w", err)
		}
		for _, r := range recs {
			x := EffectEvidence{Consumer: r.Consumer, Step: r.Step, Key: r.Key, Target: r.Target, Operation: r.Operation, State: string(r.State),
				OperationID: r.OperationID, Attempts: r.Attempts, Reconciliations: r.Reconciliations, ResponseSummary: r.ResponseSummary,
				LastError: r.LastError, CreatedAt: r.CreatedAt.UTC()}
			if !r.UnknownSince.IsZero() {
				t := r.UnknownSince.UTC()
				x.UnknownSince = &t
			}
			if !r.CompletedAt.IsZero() {
				t := r.CompletedAt.UTC()
				x.CompletedAt = &t
			}
			e.Effects = append(e.Effects, x)
		}
	}
	e.Summary = summarize(e)
	return e, nil
}

func summarize(e EventEvidence) string {
	var parts []string
	switch {
	case e.Committed != nil:
		parts = append(parts, "committed")
	case len(e.Applied) > 0:
		parts = append(parts, "outbox row gone (cleaned up) but applied rows prove it was committed")
	default:
		parts = append(parts, "no outbox row")
	}
	if p := e.Published; p != nil {
		switch {
		case p.Discarded != nil:
			parts = append(parts, "dead letter, discarded")
		case p.Status == "dead":
			parts = append(parts, fmt.Sprintf("dead letter after %d attempts", p.Attempts))
		case p.Status == "sent":
			parts = append(parts, fmt.Sprintf("published %s", times(p.Publications)))
		case p.PublishedAt != nil:
			parts = append(parts, fmt.Sprintf("published %s, re-publish pending", times(p.Publications)))
		default:
			parts = append(parts, "publication unknown (pending: no broker ack recorded; the broker may hold it)")
		}
	}
	consumers := map[string]bool{}
	for _, a := range e.Applied {
		consumers[a.Consumer] = true
	}
	parts = append(parts, fmt.Sprintf("applied by %d consumer(s)", len(consumers)))
	open := 0
	for _, p := range e.Parked {
		if p.ResolvedAt == nil {
			open++
		}
	}
	if open > 0 {
		parts = append(parts, fmt.Sprintf("parked at %d consumer(s)", open))
	}
	if len(e.Effects) > 0 {
		states := map[string]int{}
		for _, x := range e.Effects {
			states[x.State]++
		}
		keys := make([]string, 0, len(states))
		for k := range states {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var s []string
		for _, k := range keys {
			s = append(s, fmt.Sprintf("%d %s", states[k], k))
		}
		parts = append(parts, "effects: "+strings.Join(s, ", "))
	}
	return strings.Join(parts, "; ")
}

// readBroker sets p.Broker and, for a pending row, why the tables cannot
// tell whether the broker holds the event.
func (o *Ops) readBroker(ctx context.Context, p *Published) {
	switch {
	case p.Discarded != nil:
		p.Broker = BrokerDiscarded
		return
	case p.Status == "dead":
		p.Broker = BrokerDead
		return
	case p.Status == "sent" || p.PublishedAt != nil:
		p.Broker = BrokerPublished // a re-publish may be pending; the first one is recorded
		return
	}
	p.Broker = BrokerUnknown
	why := "pending: no relay has recorded a broker acknowledgement, but a relay marks a row only after the broker's ack, " +
		"so a publish may be in flight, or a relay may have stopped between the ack and its mark (the next relay re-publishes the row; " +
		"broker dedup or the inbox absorbs the copy); only the broker can tell until then"
	if p.Attempts > 0 {
		why += fmt.Sprintf("; %d failed attempt(s) so far — a timed-out attempt may still have reached the broker", p.Attempts)
	}
	if slots := o.cdcSlots(ctx); len(slots) > 0 {
		why += fmt.Sprintf("; a CDC relay streams this outbox (slot %s): a row its slot has passed without a mark is re-published and marked by its reconciler (see docs/CDC.md)",
			strings.Join(slots, ", "))
	}
	p.UnknownReason = why
}

// cdcSlots names the CDC relays' slots recorded for this outbox (none when
// the bookkeeping table is not installed or cannot be read: the reason
// above then simply says less).
func (o *Ops) cdcSlots(ctx context.Context) []string {
	exec := o.db.Executor()
	if ok, err := o.tableExists(ctx, exec, "cdc_slot"); err != nil || !ok {
		return nil
	}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT slot_name FROM %s ORDER BY slot_name`, o.t("cdc_slot")))
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if rows.Scan(&s) == nil {
			out = append(out, s)
		}
	}
	return out
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}
