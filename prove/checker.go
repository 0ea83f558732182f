package prove

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// Figures are one scenario's measurements, every one computed from ground
// truth: the business and outbox tables (what committed), the broker's
// stream (what was published, and when), the consumer's applied log and
// parked table (what took effect), the fake provider's own books (what
// money moved), and prove's counting wrappers around the real broker
// client (how many calls were made).
type Figures struct {
	// Planned is the number of events the workload tried to write.
	Planned int `json:"planned"`
	// Committed events: rows in the business table (their transaction committed).
	Committed int `json:"committed"`
	// RolledBack events: planned in a transaction that rolled back.
	RolledBack int `json:"rolled_back"`
	// Published is the number of distinct event ids in the broker's stream;
	// StreamMessages counts stored copies (duplicates the broker kept).
	Published      int `json:"published"`
	StreamMessages int `json:"stream_messages"`

	// Lost: committed, meant to be applied, never applied nor parked, and
	// nothing can still deliver it: the broker never got it or no longer
	// holds it, or the consumer acknowledged it without applying it.
	Lost int `json:"lost"`
	// Undelivered: committed, not applied nor parked when the settle budget
	// (WithDuration) ran out, but still held by the broker for the consumer
	// (not yet acknowledged) or unsent in the outbox with a relay that will
	// send it: a pipeline too slow for the budget, not a loss. A violation
	// of its own.
	Undelivered int `json:"undelivered"`
	// Phantom: in the stream or applied, but its transaction rolled back
	// (or never happened); or committed though the client was told its
	// transaction failed.
	Phantom int `json:"phantom"`
	// Unknown: events whose transaction's COMMIT got no answer — the
	// connection died during it (db-crash) — so the client cannot tell
	// whether it committed. Each must resolve to exactly one of
	// UnknownCommitted (in the business table and applied exactly once,
	// or parked as planned) or UnknownAbsent (not committed, and in no
	// table, stream, applied log nor provider book); anything else is a
	// violation. Lost also counts events the client saw commit that the
	// database does not have.
	Unknown          int `json:"unknown"`
	UnknownCommitted int `json:"unknown_committed"`
	UnknownAbsent    int `json:"unknown_absent"`
	// StateMismatch: committed events on which the outbox table's record
	// of the publication (status, receipt), the broker's stream and ops
	// evidence disagree after settling (agreement.go). Must be 0.
	StateMismatch int `json:"state_mismatch"`
	// DuplicatePublishes: publish calls beyond the first per event
	// (absorbed by broker dedup or by the inbox).
	DuplicatePublishes int `json:"duplicate_publishes"`
	// DuplicateDeliveries: deliveries to the consumer beyond the first per
	// event (absorbed by the inbox).
	DuplicateDeliveries int `json:"duplicate_deliveries"`
	// DuplicateApplies: applied-log rows beyond the first per event.
	DuplicateApplies int `json:"duplicate_applies"`
	// DuplicateEffects: provider charges beyond one per paid event. Must be 0.
	DuplicateEffects int `json:"duplicate_effects"`
	// MissingEffects: paid orders the consumer applied whose charge never
	// reached the provider — an effect given up (the ledger's failed) or
	// still open when the settle budget ran out. Must be 0: the fake
	// provider never refuses a charge.
	MissingEffects int `json:"missing_effects"`
	// OrderViolations: an aggregate's events applied out of sequence order.
	OrderViolations int `json:"order_violations"`
	// SequenceErrors: an aggregate's committed sequence numbers are not 1..n.
	SequenceErrors int `json:"sequence_errors"`
	// GapsFound: events parked because an earlier one of their aggregate
	// had not been applied; GapsHealed: of those, applied once it had.
	GapsFound  int `json:"gaps_found"`
	GapsHealed int `json:"gaps_healed"`

	// Relay lag: occurred_at (outbox) to the broker's stored timestamp of
	// the first copy. Timing-dependent.
	LagP50 time.Duration `json:"lag_p50_ns"`
	LagP99 time.Duration `json:"lag_p99_ns"`
	LagMax time.Duration `json:"lag_max_ns"`

	// DeadLetters: outbox rows marked dead plus messages parked as poison.
	DeadLetters int `json:"dead_letters"`
	// Parked: messages held unhealed (by reason in ParkedByReason);
	// ParkedMaxAge is the oldest one's age at the end of the run.
	Parked         int            `json:"parked"`
	ParkedByReason map[string]int `json:"parked_by_reason,omitempty"`
	ParkedMaxAge   time.Duration  `json:"parked_max_age_ns"`
	// Reconciliations: status queries the provider answered (unknown
	// outcomes resolved without a blind retry).
	Reconciliations int `json:"reconciliations"`
	// ChargesResponseLost: charges the provider applied whose response no
	// worker read — the worker was killed between the provider's success
	// and the ledger's record (effect-worker-sigkill; from the provider).
	// ReconciledFound: intents a status query found already charged.
	ChargesResponseLost int `json:"charges_response_lost,omitempty"`
	ReconciledFound     int `json:"reconciled_found,omitempty"`

	// Amplification: broker publish calls and provider charge calls, in
	// total and per committed event / per paid event.
	BrokerCalls            int     `json:"broker_calls"`
	BrokerCallsPerEvent    float64 `json:"broker_calls_per_event"`
	ProviderCalls          int     `json:"provider_calls"`
	ProviderCallsPerEffect float64 `json:"provider_calls_per_effect"`

	// FaultsInjected: planned faults that fired.
	FaultsInjected int `json:"faults_injected"`
	// FencedWrites: relay marks rejected by the lease fence.
	FencedWrites int `json:"fenced_writes"`
	// Leaks: canary strings found in logs, errors or metric labels.
	Leaks int `json:"leaks"`

	// Classes counts events per Jepsen-style class: ok, recovered (ok
	// after a fault touched it), duplicated, lost, undelivered (still held
	// by the broker or the relay when the budget ran out), unknown (held, not
	// applied, for no planned reason) and unexpected (applied though it
	// must not be: rolled back, unauthorised, wrong schema, poison).
	Classes map[string]int `json:"classes"`
}

// Deterministic returns the figures a fixed seed must reproduce exactly.
// Timing-dependent ones (lag, duplicate publishes and deliveries, calls,
// reconciliations, ages, the ok/recovered split) are left out. For a
// negative control only the workload figures are: how many events a broken
// pipeline loses depends on where batch boundaries fell.
func (f Figures) Deterministic(control bool) map[string]int {
	if control {
		return map[string]int{"planned": f.Planned, "committed": f.Committed, "rolled_back": f.RolledBack}
	}
	return map[string]int{
		"planned": f.Planned, "committed": f.Committed, "rolled_back": f.RolledBack,
		"lost": f.Lost, "phantom": f.Phantom, "duplicate_effects": f.DuplicateEffects, "missing_effects": f.MissingEffects,
		"order_violations": f.OrderViolations, "sequence_errors": f.SequenceErrors,
		"faults_injected": f.FaultsInjected, "parked": f.Parked, "dead_letters": f.DeadLetters,
		"duplicate_applies": f.DuplicateApplies, "state_mismatch": f.StateMismatch,
	}
}

type appliedRow struct {
	id                 int64
	eventID            string
	tenant, typ, aggID string
	seq                int64
}

type parkedRow struct {
	eventID, reason string
	healed          bool
	firstSeen       int64
}

// truth is everything the checker reads.
type truth struct {
	business map[string]bool
	outbox   map[string]outboxTruth
	applied  []appliedRow
	parked   []parkedRow
	deadRows int
	// sentByWatermark, sentByStatus: the outbox's sent rows, read as sent
	// through their shard's watermark (never written) and through their
	// status column (agreement.go).
	sentByWatermark, sentByStatus int
	stream                        []streamMsg
	effects                       []ledgerEffect // package effect's ledger (real inbox only)

	// What can still arrive (settle.go): outbox rows still pending, whether
	// a relay will still send them, and what the broker holds unacked.
	unsent     map[string]bool
	unsentOwed bool
	owed       owedSet

	// mismatch: one line per committed event on which the table, the
	// broker and ops evidence disagree (agreement.go).
	mismatch []string
}

type outboxTruth struct {
	tenant, typ, agg string
	seq              int64
	occurred         time.Time
}

func collect(ctx context.Context, e *env) (*truth, error) {
	ex := e.db.drv.Executor()
	t := &truth{business: map[string]bool{}, outbox: map[string]outboxTruth{}, unsent: map[string]bool{}}
	if err := scanRows(ctx, ex, `SELECT event_id FROM prove_business`, func(s func(...any) error) error {
		var id string
		if err := s(&id); err != nil {
			return err
		}
		t.business[id] = true
		return nil
	}); err != nil {
		return nil, err
	}
	if err := scanRows(ctx, ex, `SELECT event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, occurred_at, `+e.outboxStatus("o")+` FROM ferry_outbox o`, func(s func(...any) error) error {
		var id, status string
		var o outboxTruth
		if err := s(&id, &o.tenant, &o.typ, &o.agg, &o.seq, &o.occurred, &status); err != nil {
			return err
		}
		t.outbox[id] = o
		if status == "pending" {
			t.unsent[id] = true
		}
		if status == "dead" {
			t.deadRows++
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := scanRows(ctx, ex, `SELECT id, event_id, tenant_id, aggregate_type, aggregate_id, seq FROM prove_applied ORDER BY id`, func(s func(...any) error) error {
		var a appliedRow
		if err := s(&a.id, &a.eventID, &a.tenant, &a.typ, &a.aggID, &a.seq); err != nil {
			return err
		}
		t.applied = append(t.applied, a)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := scanRows(ctx, ex, e.parkedQuery(), func(s func(...any) error) error {
		var p parkedRow
		var healed int64
		var first any
		if err := s(&p.eventID, &p.reason, &healed, &first); err != nil {
			return err
		}
		p.healed = healed != 0
		switch v := first.(type) {
		case int64:
			p.firstSeen = v
		case time.Time:
			p.firstSeen = v.UnixNano()
		case string:
			if ts, err := time.Parse("2006-01-02 15:04:05.999999999-07:00", v); err == nil {
				p.firstSeen = ts.UnixNano()
			}
		}
		t.parked = append(t.parked, p)
		return nil
	}); err != nil {
		return nil, err
	}
	if e.realInbox {
		if err := scanRows(ctx, ex, sqlFor(ex.Dialect(), `SELECT idem_key, CAST(event_id AS TEXT), state, reconciliations FROM ferry_effects`), func(s func(...any) error) error {
			var r ledgerEffect
			if err := s(&r.key, &r.eventID, &r.state, &r.reconciliations); err != nil {
				return err
			}
			t.effects = append(t.effects, r)
			return nil
		}); err != nil {
			return nil, err
		}
	}
	for id, o := range e.outboxSnap {
		if _, ok := t.outbox[id]; !ok {
			t.outbox[id] = o // deleted by a cleanup after the snapshot
		}
	}
	var err error
	if t.stream, err = e.tr.readAll(ctx); err != nil {
		return nil, err
	}
	if t.owed, err = e.tr.owed(ctx, "prove", t.stream); err != nil {
		return nil, err
	}
	if t.unsentOwed, err = e.unsentOwed(ctx); err != nil {
		return nil, err
	}
	if t.mismatch, err = e.stateMismatches(ctx, t); err != nil {
		return nil, err
	}
	return t, nil
}

func scanRows(ctx context.Context, ex driver.Executor, q string, each func(func(...any) error) error) error {
	rows, err := ex.Query(ctx, q)
	if err != nil {
		return fmt.Errorf("prove: checker: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return fmt.Errorf("prove: checker: %w", err)
		}
	}
	return rows.Err()
}

// check computes the figures and the list of violations.
func check(e *env, t *truth) (Figures, []string) {
	var f Figures
	var v, perEvent []string
	viol := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	// eventViol records a violation about one event; they are listed after
	// the totals, at most maxEventViolations of them.
	eventViol := func(format string, args ...any) { perEvent = append(perEvent, fmt.Sprintf(format, args...)) }
	f.Classes = map[string]int{}
	f.Planned = len(e.plan.events)
	f.Committed = len(t.business)

	applied := map[string]int{}
	for _, a := range t.applied {
		applied[a.eventID]++
	}
	parked := map[string]parkedRow{}
	f.ParkedByReason = map[string]int{}
	var oldest int64
	for _, p := range t.parked {
		parked[p.eventID] = p
		if p.reason == "gap" {
			f.GapsFound++
			if p.healed {
				f.GapsHealed++
			}
		}
		if p.reason == "poison" {
			f.DeadLetters++
		}
		if !p.healed {
			f.Parked++
			f.ParkedByReason[p.reason]++
			if oldest == 0 || p.firstSeen < oldest {
				oldest = p.firstSeen
			}
		}
	}
	if oldest != 0 {
		f.ParkedMaxAge = time.Since(time.Unix(0, oldest))
	}
	f.DeadLetters += t.deadRows

	inStream := map[string]int{}
	firstSeen := map[string]time.Time{}
	e.rec.mu.Lock()
	for _, m := range t.stream {
		if m.EventID == "" {
			continue // not a Ferry event (the forged junk message)
		}
		inStream[m.EventID]++
		if _, ok := firstSeen[m.EventID]; !ok {
			ts := m.Time
			if ts.IsZero() {
				ts = e.rec.firstAck[m.EventID] // the broker keeps no arrival time
			}
			if !ts.IsZero() {
				firstSeen[m.EventID] = ts
			}
		}
	}
	e.rec.mu.Unlock()
	f.Published = len(inStream)
	f.StreamMessages = len(t.stream)

	e.rec.mu.Lock()
	for _, n := range e.rec.pubCalls {
		f.DuplicatePublishes += max(0, n-1)
	}
	f.BrokerCalls = e.rec.pubTotal
	deliveries := map[string]int{}
	for id, n := range e.rec.deliveries {
		deliveries[id] = n
		f.DuplicateDeliveries += max(0, n-1)
	}
	pubCalls := map[string]int{}
	for id, n := range e.rec.pubCalls {
		pubCalls[id] = n
	}
	e.rec.mu.Unlock()

	e.provider.mu.Lock()
	paid := 0
	for _, ev := range e.plan.events {
		if ev.kind == "order.paid" && t.business[ev.id] && ev.special == specialNone {
			paid++
		}
	}
	for id, n := range e.provider.charges {
		if t.business[id] {
			f.DuplicateEffects += max(0, n-1)
		} else {
			f.DuplicateEffects += n // money moved for something that never committed
		}
	}
	for _, ev := range e.plan.events {
		if ev.kind == "order.paid" && ev.special == specialNone && t.business[ev.id] && applied[ev.id] > 0 && e.provider.charges[ev.id] == 0 {
			f.MissingEffects++
			eventViol("event %s: applied, its charge never reached the provider (ledger: %s)", ev.id, ledgerStateOf(t, ev.id))
		}
	}
	f.ProviderCalls = e.provider.calls
	f.Reconciliations = e.provider.statusCalls
	e.provider.mu.Unlock()
	if f.Committed > 0 {
		f.BrokerCallsPerEvent = float64(f.BrokerCalls) / float64(f.Committed)
	}
	if paid > 0 {
		f.ProviderCallsPerEffect = float64(f.ProviderCalls) / float64(paid)
	}

	// Per-event classification.
	expectedPark := map[int]string{specialPoison: "poison", specialSchema: "schema", specialUnauthorized: "unauthorized"}
	for id, ev := range e.plan.events {
		committed := t.business[id]
		n := applied[id]
		if n > 1 {
			f.DuplicateApplies += n - 1
		}
		if !committed {
			f.RolledBack++
			if inStream[id] > 0 || n > 0 {
				f.Phantom++
				f.Classes["unexpected"]++
			}
			continue
		}
		p, isParked := parked[id]
		held := isParked && !p.healed
		switch {
		case ev.special != specialNone && n > 0:
			f.Classes["unexpected"]++
			eventViol("event %s (%s) was applied but must be parked as %s", id, ev.kind, expectedPark[ev.special])
		case ev.special != specialNone && held && p.reason == expectedPark[ev.special]:
			f.Classes["ok"]++
		case ev.special != specialNone && held:
			f.Classes["unknown"]++
			eventViol("event %s parked as %s, expected %s", id, p.reason, expectedPark[ev.special])
		case n > 1:
			f.Classes["duplicated"]++
		case n == 1:
			touched := pubCalls[id] > 1 || deliveries[id] > 1 || inStream[id] > 1 || isParked || ev.faults != 0
			if touched {
				f.Classes["recovered"]++
			} else {
				f.Classes["ok"]++
			}
		case held:
			f.Classes["unknown"]++
			eventViol("event %s held as %s, never applied", id, p.reason)
		default:
			if t.stillOwed(id) {
				f.Classes["undelivered"]++
				f.Undelivered++
				continue
			}
			f.Classes["lost"]++
			f.Lost++
		}
	}
	checkOutcomes(e, t, &f, applied, inStream, parked, eventViol)
	// Anything applied that the workload never committed nor planned.
	for id := range applied {
		if _, ok := e.plan.events[id]; !ok {
			f.Phantom++
			f.Classes["unexpected"]++
		}
	}

	// Order: per aggregate, applied sequences strictly increase.
	lastSeq := map[string]int64{}
	for _, a := range t.applied {
		k := a.tenant + "\x00" + a.typ + "\x00" + a.aggID
		if a.seq <= lastSeq[k] {
			f.OrderViolations++
		}
		lastSeq[k] = a.seq
		if o, ok := t.outbox[a.eventID]; ok && o.seq != a.seq {
			f.OrderViolations++ // applied under another sequence than committed
		}
	}
	// Producer: committed sequences are 1..n per aggregate.
	seqs := map[string][]int64{}
	for _, o := range t.outbox {
		k := o.tenant + "\x00" + o.typ + "\x00" + o.agg
		seqs[k] = append(seqs[k], o.seq)
	}
	for _, s := range seqs {
		slices.Sort(s)
		for i, x := range s {
			if x != int64(i+1) {
				f.SequenceErrors++
				break
			}
		}
	}
	// G1: outbox rows exist iff the business transaction committed.
	if len(t.outbox) > 0 {
		for id := range t.outbox {
			if !t.business[id] {
				viol("outbox row %s without its business row (G1)", id)
			}
		}
	}

	var lags []time.Duration
	for id, ts := range firstSeen {
		if o, ok := t.outbox[id]; ok {
			lags = append(lags, max(0, ts.Sub(o.occurred)))
		}
	}
	if len(lags) > 0 {
		sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
		f.LagP50 = lags[len(lags)*50/100]
		f.LagP99 = lags[min(len(lags)-1, len(lags)*99/100)]
		f.LagMax = lags[len(lags)-1]
	}
	f.FaultsInjected = int(e.faults.Load())
	f.FencedWrites = int(e.rec.fencedMarks.Load())
	f.StateMismatch = len(t.mismatch)
	for _, m := range t.mismatch {
		eventViol("%s", m)
	}

	if f.StateMismatch > 0 {
		viol("%d committed events where the outbox table, the broker and ferry evidence disagree (state_mismatch)", f.StateMismatch)
	}
	if f.Lost > 0 {
		viol("%d committed events lost", f.Lost)
	}
	if f.Undelivered > 0 {
		viol("%d committed events undelivered when the settle budget (%s) ran out: the broker still holds them for the consumer, or the relay has not sent them yet — not lost, but the pipeline did not deliver them in time (raise --duration if it is merely slow)", f.Undelivered, e.cfg.duration)
	}
	if f.Phantom > 0 {
		viol("%d phantom events (published or applied without a committed transaction)", f.Phantom)
	}
	if f.DuplicateApplies > 0 {
		viol("%d duplicate applies", f.DuplicateApplies)
	}
	if f.DuplicateEffects > 0 {
		viol("%d duplicate external effects", f.DuplicateEffects)
	}
	if f.MissingEffects > 0 {
		viol("%d paid orders applied without their charge (effects given up or still open)", f.MissingEffects)
	}
	if f.OrderViolations > 0 {
		viol("%d order violations", f.OrderViolations)
	}
	if f.SequenceErrors > 0 {
		viol("%d aggregates with non-contiguous sequences", f.SequenceErrors)
	}
	if open := f.Unknown - f.UnknownCommitted - f.UnknownAbsent; open > 0 {
		viol("%d of %d events with an unknown commit outcome resolved to neither committed-and-delivered nor not-committed-and-absent", open, f.Unknown)
	}
	var unknown int
	for _, c := range []string{"unknown", "unexpected"} {
		unknown += f.Classes[c]
	}
	if unknown > 0 {
		viol("%d events held or applied against the plan (classes unknown/unexpected)", unknown)
	}
	if len(perEvent) > maxEventViolations {
		perEvent = append(perEvent[:maxEventViolations], fmt.Sprintf("… %d more", len(perEvent)-maxEventViolations))
	}
	return f, append(v, perEvent...)
}

// ledgerStateOf is the state of event id's intent in package effect's
// ledger, or "no row" (prove's reference ledger is not read).
func ledgerStateOf(t *truth, id string) string {
	for _, r := range t.effects {
		if r.eventID == id {
			return r.state
		}
	}
	return "no row"
}

// checkOutcomes holds the database to what the producer was told
// (txOutcomes): a transaction the client saw commit must be in the
// business table (else lost: the crash took an acknowledged commit), one
// it saw fail or roll back must not be (else phantom), and each event of
// a transaction with an unknown outcome must be either committed and
// delivered or not committed and absent everywhere (Unknown*).
func checkOutcomes(e *env, t *truth, f *Figures, applied, inStream map[string]int, parked map[string]parkedRow, eventViol func(string, ...any)) {
	outs := e.plan.outcomes.snapshot()
	if len(outs) == 0 {
		return
	}
	e.provider.mu.Lock()
	charged := map[string]int{}
	for id, n := range e.provider.charges {
		charged[id] = n
	}
	e.provider.mu.Unlock()
	for _, tx := range e.plan.txs {
		out, ok := outs[tx.id]
		if !ok {
			continue
		}
		for _, ev := range tx.events {
			id := ev.id
			committed := t.business[id]
			switch out {
			case outcomeCommitted:
				if !committed {
					f.Lost++
					f.Classes["lost"]++
					eventViol("event %s: the client saw its commit succeed, the database does not have it", id)
				}
			case outcomeFailed, outcomeRolledBack:
				if committed {
					f.Phantom++
					f.Classes["unexpected"]++
					eventViol("event %s: the client saw its transaction %s, yet it committed", id, strings.ReplaceAll(out, "_", " "))
				}
			case outcomeUnknown:
				f.Unknown++
				p, isParked := parked[id]
				_, inOutbox := t.outbox[id]
				switch {
				case committed && (applied[id] == 1 || ev.special != specialNone && isParked && !p.healed && applied[id] == 0):
					f.UnknownCommitted++
				case !committed && !inOutbox && inStream[id] == 0 && applied[id] == 0 && !isParked && charged[id] == 0:
					f.UnknownAbsent++
				default:
					eventViol("event %s: unknown commit outcome resolved to neither committed-and-delivered nor absent (committed %v, outbox %v, copies in stream %d, applied %d, parked %v, charged %d)",
						id, committed, inOutbox, inStream[id], applied[id], isParked, charged[id])
				}
			}
		}
	}
}

// maxEventViolations bounds the per-event lines in a result.
const maxEventViolations = 20

// snapshotOutbox remembers the outbox before a cleanup deletes sent rows,
// so sequences and lag are still checked against what was committed.
func (e *env) snapshotOutbox(ctx context.Context) error {
	e.outboxSnap = map[string]outboxTruth{}
	return scanRows(ctx, e.db.drv.Executor(), `SELECT event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, occurred_at FROM ferry_outbox`, func(s func(...any) error) error {
		var id string
		var o outboxTruth
		if err := s(&id, &o.tenant, &o.typ, &o.agg, &o.seq, &o.occurred); err != nil {
			return err
		}
		e.outboxSnap[id] = o
		return nil
	})
}
