package opsmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/ops"
)

// Verdicts of a stage. Unknown is the answer wherever the tables cannot
// tell; no verdict is inferred from the absence of a row the tables would
// not hold anyway.
const (
	VerdictCommitted    = "committed"
	VerdictNotCommitted = "not_committed"
	VerdictPublished    = "published"
	VerdictDead         = "dead"
	VerdictDiscarded    = "discarded"
	VerdictApplied      = "applied"
	VerdictParked       = "parked"
	VerdictSucceeded    = "succeeded"
	VerdictFailed       = "failed"
	VerdictInProgress   = "in_progress"
	VerdictOutcomeUnkn  = "outcome_unknown"
	VerdictUnknown      = "unknown"
)

// EvidenceIn selects what to prove: exactly one of event_id,
// correlation_id, command_key, or aggregate_type with aggregate_id.
type EvidenceIn struct {
	EventID       string `json:"event_id,omitempty" jsonschema:"an event id (UUID)"`
	CorrelationID string `json:"correlation_id,omitempty" jsonschema:"every event of a correlation id (at most 200)"`
	CommandKey    string `json:"command_key,omitempty" jsonschema:"a command's idempotency key: the command and the events it wrote"`
	AggregateType string `json:"aggregate_type,omitempty" jsonschema:"with aggregate_id: the aggregate's events in sequence order (at most 50)"`
	AggregateID   string `json:"aggregate_id,omitempty"`
}

// Fact is one thing a table says, and where it says it.
type Fact struct {
	Fact string `json:"fact"`
	// Source names the table and key (e.g. "ferry_outbox id=12"), the
	// broker receipt, or the guarantee the reading rests on.
	Source string `json:"source"`
}

// Stage is the verdict on one stage of an event's path and the facts it
// rests on.
type Stage struct {
	Verdict string `json:"verdict" jsonschema:"committed/not_committed; published/dead/discarded; applied/parked; succeeded/failed/in_progress/outcome_unknown; or unknown where the tables cannot say"`
	// Count is what the tables prove at least: publications, consumers
	// that applied, effects that succeeded.
	Count int    `json:"count" jsonschema:"at least this many: publishes (published), consumers (applied_by), succeeded effects (effects)"`
	Facts []Fact `json:"facts"`
}

// EventReport is the evidence of one event.
type EventReport struct {
	EventID   string `json:"event_id"`
	Committed Stage  `json:"committed"`
	Published Stage  `json:"published"`
	AppliedBy Stage  `json:"applied_by"`
	Effects   Stage  `json:"effects"`
	Summary   string `json:"summary"`
}

// CommandReport is the evidence of a command key.
type CommandReport struct {
	Key      string   `json:"key"`
	Verdict  string   `json:"verdict" jsonschema:"committed or not_committed"`
	EventIDs []string `json:"event_ids"`
	Facts    []Fact   `json:"facts"`
}

// EvidenceOut is the answer of the evidence tool.
type EvidenceOut struct {
	Query   string         `json:"query"`
	Kind    string         `json:"kind" jsonschema:"event_id, correlation_id, command_key or aggregate"`
	Found   bool           `json:"found" jsonschema:"false when no table mentions the query"`
	Command *CommandReport `json:"command,omitempty"`
	Events  []EventReport  `json:"events"`
	// Missing tables: their stages are unknown, not "did not happen".
	Missing   []string `json:"missing,omitempty"`
	Truncated bool     `json:"truncated,omitempty"`
}

const maxAggregateEvents = 50

func (s *Server) evidence(ctx context.Context, in EvidenceIn) (EvidenceOut, error) {
	o := s.cfg.Ops
	n := 0
	for _, set := range []bool{in.EventID != "", in.CorrelationID != "", in.CommandKey != "", in.AggregateType != "" || in.AggregateID != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return EvidenceOut{}, &ops.ArgError{Field: "event_id", Reason: "give exactly one of event_id, correlation_id, command_key, or aggregate_type with aggregate_id"}
	}
	out := EvidenceOut{Events: []EventReport{}}
	var evs []ops.EventEvidence
	switch {
	case in.AggregateType != "" || in.AggregateID != "":
		if in.AggregateType == "" || in.AggregateID == "" {
			return out, &ops.ArgError{Field: "aggregate_id", Reason: "an aggregate is named by aggregate_type and aggregate_id together"}
		}
		out.Query, out.Kind = in.AggregateType+"/"+in.AggregateID, "aggregate"
		page, err := o.SearchOutbox(ctx, ops.OutboxQuery{AggregateType: in.AggregateType, AggregateID: in.AggregateID, Limit: maxAggregateEvents})
		if err != nil {
			return out, err
		}
		out.Truncated = page.NextCursor != ""
		for _, m := range page.Rows {
			ev, err := o.Evidence(ctx, m.EventID, ops.KindEventID)
			if err != nil {
				return out, err
			}
			evs = append(evs, ev.Events...)
			out.Missing = ev.Missing
		}
		out.Found = len(evs) > 0
	default:
		q, kind := in.EventID, ops.KindEventID
		if in.CorrelationID != "" {
			q, kind = in.CorrelationID, ops.KindCorrelationID
		} else if in.CommandKey != "" {
			q, kind = in.CommandKey, ops.KindCommandKey
		}
		out.Query, out.Kind = q, string(kind)
		ev, err := o.Evidence(ctx, q, kind)
		if errors.Is(err, ops.ErrNotFound) {
			s.notFound(&out, kind, q, ev.Missing)
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out.Found, out.Missing, out.Truncated, evs = true, ev.Missing, ev.Truncated, ev.Events
		if c := ev.Command; c != nil {
			out.Command = &CommandReport{Key: c.Key, Verdict: VerdictCommitted, EventIDs: c.EventIDs, Facts: []Fact{{
				Fact: fmt.Sprintf("the command's key row was committed at %s (tenant %q), with the ids of the %d event(s) the command wrote; "+
					"it commits in the same transaction as the command's business rows and events", ts(c.CreatedAt), c.TenantID, len(c.EventIDs)),
				Source: fmt.Sprintf("%s (tenant_id=%q, idem_key=%q)", tname(s.cfg.Tables, "command_keys"), c.TenantID, c.Key)}}}
		}
	}
	if out.Missing == nil {
		out.Missing = []string{}
	}
	for _, e := range evs {
		out.Events = append(out.Events, s.report(e, out.Missing))
	}
	return out, nil
}

func (s *Server) notFound(out *EvidenceOut, kind ops.EvidenceKind, q string, missing []string) {
	out.Missing = missing
	if out.Missing == nil {
		out.Missing = []string{}
	}
	t := s.cfg.Tables
	switch kind {
	case ops.KindCommandKey:
		if slices.Contains(missing, "command_keys") {
			out.Command = &CommandReport{Key: q, Verdict: VerdictUnknown, EventIDs: []string{}, Facts: []Fact{{
				Fact: "the command_keys table is not installed here, so the tables cannot say whether a command with this key committed", Source: tname(t, "command_keys") + ": not installed"}}}
			return
		}
		out.Command = &CommandReport{Key: q, Verdict: VerdictNotCommitted, EventIDs: []string{}, Facts: []Fact{
			{Fact: "no key row for this idempotency key: a command's key row commits in the same transaction as its business rows and " +
				"its events, so a command run with this key did not commit (it rolled back, failed, or never ran) — unless the key expired " +
				"and was cleaned up (keys are kept for the runner's expiry, 48h by default)", Source: fmt.Sprintf("%s idem_key=%q: no row", tname(t, "command_keys"), q)},
			{Fact: "no outbox row mentions the key's events either", Source: tname(t, "outbox") + ": no row"},
		}}
	case ops.KindEventID:
		out.Events = append(out.Events, EventReport{EventID: q,
			Committed: Stage{Verdict: VerdictNotCommitted, Facts: []Fact{{
				Fact: "no outbox, inbox, parked or effect row has this event id: an outbox row exists iff its business transaction committed " +
					"(G1), so it was not committed here — unless cleanup deleted a sent row past the retention (ferry cleanup writes audit rows)",
				Source: fmt.Sprintf("%s event_id=%s: no row; guarantee G1", tname(t, "outbox"), q)}}},
			Published: Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "no outbox row to read", Source: tname(t, "outbox") + ": no row"}}},
			AppliedBy: Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "no inbox row on this database", Source: tname(t, "inbox") + ": no row"}}},
			Effects:   Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "no effect-ledger row on this database", Source: tname(t, "effects") + ": no row"}}},
			Summary:   "not committed (no row in any table)"})
	}
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func (s *Server) report(e ops.EventEvidence, missing []string) EventReport {
	t := s.cfg.Tables
	r := EventReport{EventID: e.EventID}
	outboxSrc := fmt.Sprintf("%s event_id=%s", tname(t, "outbox"), e.EventID)
	// committed
	switch {
	case e.Committed != nil:
		c := e.Committed
		outboxSrc = fmt.Sprintf("%s id=%d (event_id=%s)", tname(t, "outbox"), c.OutboxID, e.EventID)
		r.Committed = Stage{Verdict: VerdictCommitted, Count: 1, Facts: []Fact{{
			Fact: fmt.Sprintf("outbox row committed at %s: tenant %q, %s/%s seq %d, %s v%d on topic %q, principal %q action %q",
				ts(c.At), c.TenantID, c.AggregateType, c.AggregateID, c.AggregateSeq, c.EventType, c.SchemaVersion, c.Topic, c.Principal, c.Action),
			Source: outboxSrc}, {Fact: "the outbox row is written in the business transaction: it exists iff that transaction committed", Source: "guarantee G1"}}}
	case len(e.Applied) > 0:
		r.Committed = Stage{Verdict: VerdictCommitted, Count: 1, Facts: []Fact{{
			Fact:   "no outbox row (deleted by cleanup), but a consumer applied the event, which it can only have received from a committed row",
			Source: fmt.Sprintf("%s (consumer=%q, event_id=%s)", tname(t, "inbox"), e.Applied[0].Consumer, e.EventID)}}}
	default:
		r.Committed = Stage{Verdict: VerdictUnknown, Facts: []Fact{{
			Fact:   "no outbox row, though another table names the event: it may have been deleted by cleanup, or the event came from another database",
			Source: outboxSrc + ": no row"}}}
	}
	// published
	p := e.Published
	switch {
	case p == nil:
		r.Published = Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "no outbox row to read the relay's record from", Source: outboxSrc + ": no row"}}}
	case p.Broker == ops.BrokerPublished:
		st := Stage{Verdict: VerdictPublished, Count: max(1, p.Publications)}
		st.Facts = append(st.Facts, Fact{Fact: fmt.Sprintf("a relay recorded the broker's acknowledgement at %s (status %s); it marks a row only after the ack",
			ts(deref(p.PublishedAt)), p.Status), Source: outboxSrc + " status, published_at"})
		if p.Receipt != "" {
			var rc struct {
				Broker      string `json:"broker"`
				Destination string `json:"destination"`
				Offset      int64  `json:"offset"`
				Duplicate   bool   `json:"duplicate"`
			}
			_ = json.Unmarshal([]byte(p.Receipt), &rc)
			st.Facts = append(st.Facts, Fact{Fact: fmt.Sprintf("broker receipt: %s %s offset %d", rc.Broker, rc.Destination, rc.Offset), Source: "broker receipt " + p.Receipt})
			if rc.Duplicate {
				st.Count = max(st.Count+1, 2)
				st.Facts = append(st.Facts, Fact{Fact: "the broker acknowledged the recorded publish as a DUPLICATE of a copy it already stored under this event id: " +
					"an earlier publish reached the broker without being marked (a relay stopped between the ack and its mark, or a timed-out " +
					"attempt) — published at least twice, stored once by the broker's dedup", Source: "broker receipt " + p.Receipt + " (duplicate=true)"})
			}
		}
		for _, a := range e.Audit {
			if a.Action == "outbox.replay" {
				st.Facts = append(st.Facts, Fact{Fact: fmt.Sprintf("replayed by %s at %s: %s", a.Actor, ts(a.At), a.Reason),
					Source: fmt.Sprintf("%s id=%d", tname(t, "ops_audit"), a.ID)})
			}
		}
		r.Published = st
	case p.Broker == ops.BrokerDead:
		r.Published = Stage{Verdict: VerdictDead, Facts: []Fact{{Fact: fmt.Sprintf("dead letter: the relay stopped after %d attempt(s); last error %q", p.Attempts, p.LastError),
			Source: outboxSrc + " status=dead"}}}
	case p.Broker == ops.BrokerDiscarded:
		r.Published = Stage{Verdict: VerdictDiscarded, Facts: []Fact{{Fact: fmt.Sprintf("dead letter discarded at %s by an operator", ts(deref(p.Discarded))),
			Source: outboxSrc + " discarded_at"}}}
	default:
		r.Published = Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: p.UnknownReason, Source: outboxSrc + " status=pending"}}}
	}
	// applied_by
	consumers := map[string]bool{}
	switch {
	case slices.Contains(missing, "inbox"):
		r.AppliedBy = Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "the inbox tables are not installed here", Source: tname(t, "inbox") + ": not installed"}}}
	case len(e.Applied) > 0:
		st := Stage{Verdict: VerdictApplied}
		for _, a := range e.Applied {
			consumers[a.Consumer] = true
			st.Facts = append(st.Facts, Fact{Fact: fmt.Sprintf("applied once by consumer %q (tenant %q) at %s: the inbox row is unique per (consumer, tenant, event id) "+
				"and commits with the consumer's effect, so redeliveries are absorbed (G4)", a.Consumer, a.TenantID, ts(a.AppliedAt)),
				Source: fmt.Sprintf("%s (consumer=%q, tenant_id=%q, event_id=%s)", tname(t, "inbox"), a.Consumer, a.TenantID, e.EventID)})
		}
		st.Count = len(consumers)
		st.Facts = append(st.Facts, parkedFacts(e, tname(t, "inbox_parked"))...)
		r.AppliedBy = st
	default:
		st := Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "no inbox row on this database: no consumer keeping its Ferry inbox here has applied it (yet); " +
			"consumers with their inbox in another database, or without one, are not visible from these tables", Source: fmt.Sprintf("%s event_id=%s: no row", tname(t, "inbox"), e.EventID)}}}
		if pf := parkedFacts(e, tname(t, "inbox_parked")); len(pf) > 0 {
			st.Verdict, st.Facts = VerdictParked, append(pf, st.Facts...)
		}
		r.AppliedBy = st
	}
	// effects
	switch {
	case slices.Contains(missing, "effects"):
		r.Effects = Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "the effect ledger is not installed here", Source: tname(t, "effects") + ": not installed"}}}
	case len(e.Effects) == 0:
		r.Effects = Stage{Verdict: VerdictUnknown, Facts: []Fact{{Fact: "no effect-ledger row: either no consumer records an external effect for this event " +
			"or none has yet; calls made outside the ledger are invisible here", Source: fmt.Sprintf("%s event_id=%s: no row", tname(t, "effects"), e.EventID)}}}
	default:
		st := Stage{}
		states := map[string]int{}
		for _, x := range e.Effects {
			states[x.State]++
			st.Facts = append(st.Facts, Fact{Fact: fmt.Sprintf("%s/%s: %s %s is %s (provider operation id %q, %d attempt(s), %d reconciliation(s)); one intent "+
				"per (consumer, event, step), always called with this idempotency key (G5)", x.Consumer, x.Step, x.Target, x.Operation, x.State, x.OperationID, x.Attempts, x.Reconciliations),
				Source: fmt.Sprintf("%s idem_key=%q", tname(t, "effects"), x.Key)})
		}
		st.Count = states["succeeded"]
		switch {
		case states["unknown"] > 0:
			st.Verdict = VerdictOutcomeUnkn
		case states["failed"] > 0:
			st.Verdict = VerdictFailed
		case states["succeeded"] == len(e.Effects):
			st.Verdict = VerdictSucceeded
		default:
			st.Verdict = VerdictInProgress
		}
		r.Effects = st
	}
	r.Summary = summary(r)
	return r
}

// summary reads the four verdicts in one line.
func summary(r EventReport) string {
	part := func(name string, s Stage, counted string) string {
		if s.Count > 0 && counted != "" {
			return fmt.Sprintf("%s: %s (%s %d)", name, s.Verdict, counted, s.Count)
		}
		return name + ": " + s.Verdict
	}
	return strings.Join([]string{part("committed", r.Committed, ""), part("published", r.Published, "at least"),
		part("applied_by", r.AppliedBy, "consumers"), part("effects", r.Effects, "succeeded")}, "; ")
}

func parkedFacts(e ops.EventEvidence, table string) []Fact {
	var out []Fact
	for _, p := range e.Parked {
		state := "open"
		if p.ResolvedAt != nil {
			state = "resolved (" + p.Resolution + ")"
		}
		out = append(out, Fact{Fact: fmt.Sprintf("parked by consumer %q as %s, %d attempt(s), %s", p.Consumer, p.Reason, p.Attempts, state),
			Source: fmt.Sprintf("%s id=%d", table, p.ID)})
	}
	return out
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// tname is a table's name as sources show it: schema-qualified when a
// schema is set, without SQL quoting.
func tname(t ferry.Tables, base string) string { return strings.ReplaceAll(t.Name(base), `"`, "") }
