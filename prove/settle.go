package prove

import (
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// owedSet is what the broker still holds for the consumer: messages it
// will deliver (again) because the consumer has not acknowledged them.
// Kafka and JetStream name them (ids); a RabbitMQ queue only says how many
// messages are ready (count), not which.
type owedSet struct {
	ids   map[string]bool
	count int
}

// settle waits until every committed event is accounted for — applied or
// parked, every ledger row settled, every outbox row sent — or the
// scenario's budget (cfg.duration) is spent. When the pipeline stops
// moving it asks the broker whether anything can still arrive: only when
// no event that is missing is still held for the consumer (nor owed by a
// relay) does it stop early, because then the missing events are lost and
// waiting changes nothing. A consumer that is merely slow — a restarted
// Kafka member waiting for the dead one's session to expire, a JetStream
// ack wait — is waited for until the budget runs out, and what it still
// had not received by then is reported as undelivered, not lost.
func settle(ctx context.Context, e *env, cfg *config) {
	deadline := time.Now().Add(cfg.duration)
	stall := max(1500*time.Millisecond, 2*cfg.ackWait)
	if e.sc.cdc {
		e.settleWAL = currentWAL(ctx, e)
	}
	var lastState string
	lastChange := time.Now()
	unsureRounds := 0
	for ctx.Err() == nil && time.Now().Before(deadline) {
		state, done, err := progressState(ctx, e)
		if err != nil {
			e.rec.err(err)
		}
		e.prog.update("settling: %s", state)
		if done {
			// Let in-flight acks land so the stream's state is final.
			sleepCtx(ctx, 100*time.Millisecond)
			return
		}
		if state != lastState {
			lastState, lastChange = state, time.Now()
		} else if time.Since(lastChange) > stall {
			owed, unsure, err := stillOwed(ctx, e)
			switch {
			case err != nil:
				e.rec.err(err)
			case owed == 0 && unsure == 0:
				return // nothing missing can still arrive
			case owed == 0 && unsureRounds >= maxUnsureRounds:
				return // a queue that stays empty holds nothing unacked for ever
			case owed == 0:
				unsureRounds++
				owed = unsure
			}
			e.prog.update("settling: %s; %d still held by the broker or the relay", state, owed)
			lastChange = time.Now() // ask again after another stall period
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

func progressState(ctx context.Context, e *env) (string, bool, error) {
	ex := e.db.drv.Executor()
	var committed, handled, ledgerOpen, pending int64
	if err := countInto(ctx, ex, `SELECT COUNT(*) FROM prove_business`, &committed); err != nil {
		return "", false, err
	}
	if err := countInto(ctx, ex, `SELECT COUNT(*) FROM prove_business b WHERE EXISTS (SELECT 1 FROM prove_applied a WHERE a.event_id = b.event_id)
 OR `+e.openParkedSQL(), &handled); err != nil {
		return "", false, err
	}
	if err := countInto(ctx, ex, e.openEffectsSQL(), &ledgerOpen); err != nil {
		return "", false, err
	}
	// Unsent outbox rows mean a relay still owes a (re)publish: a crash
	// after publish leaves rows the consumer already applied.
	if err := countInto(ctx, ex, `SELECT COUNT(*) FROM ferry_outbox o WHERE `+e.outboxStatus("o")+` = 'pending'`, &pending); err != nil {
		return "", false, err
	}
	state := fmt.Sprintf("%d/%d committed events handled, %d unsent, %d effects open, %d faults fired", handled, committed, pending, ledgerOpen, e.faults.Load())
	return state, handled == committed && ledgerOpen == 0 && pending == 0, nil
}

func countInto(ctx context.Context, ex driver.Executor, q string, dst *int64, args ...any) error {
	rows, err := ex.Query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if rows.Next() {
		return rows.Scan(dst)
	}
	return rows.Err()
}

// maxUnsureRounds bounds how many stall periods settle waits for events a
// RabbitMQ queue may hold unacked (see stillOwed).
const maxUnsureRounds = 4

// stillOwed counts the committed events not yet handled that the pipeline
// can still deliver: held by the broker for the consumer, or unsent in the
// outbox while a relay will still send them; the pending outbox rows of
// events already handled while a relay will still mark them; and the
// effect intents not yet ended. unsure counts, where the
// broker gives only a ready count (RabbitMQ), the missing events it stored
// beyond that count: they may sit unacked with a live consumer (a queue
// cannot say; they return to ready when its channel closes) or have been
// acked without being applied.
func stillOwed(ctx context.Context, e *env) (owed, unsure int, err error) {
	missing := map[string]bool{}
	if err := scanRows(ctx, e.db.drv.Executor(), `SELECT b.event_id FROM prove_business b WHERE NOT EXISTS (SELECT 1 FROM prove_applied a WHERE a.event_id = b.event_id)
 AND NOT `+e.openParkedSQL(), func(s func(...any) error) error {
		var id string
		if err := s(&id); err != nil {
			return err
		}
		missing[id] = true
		return nil
	}); err != nil {
		return 0, 0, err
	}
	unsent, err := unsentIDs(ctx, e)
	if err != nil {
		return 0, 0, err
	}
	owedUnsent, err := e.unsentOwed(ctx)
	if err != nil {
		return 0, 0, err
	}
	if owedUnsent {
		// A pending row of an event the consumer already handled (a relay
		// crashed or was fenced after the broker's ack) is still owed too:
		// a live relay republishes and marks it, and until it has, the table
		// disagrees with the broker (the state_mismatch check). Giving up on
		// it at a stall judged a relay mid-takeover as broken.
		for id := range unsent {
			if !missing[id] {
				owed++
			}
		}
	}
	// An open intent is owed too: the effect worker still executes it. A
	// breaker pause or a lease expiry is a stall of the pipeline, not a
	// sign that nothing more can happen (checker: missing effects).
	var openEffects int64
	if err := countInto(ctx, e.db.drv.Executor(), e.openEffectsSQL(), &openEffects); err != nil {
		return 0, 0, err
	}
	owed += int(openEffects)
	if len(missing) == 0 {
		return owed, 0, nil
	}
	msgs, err := e.tr.readAll(ctx)
	if err != nil {
		return 0, 0, err
	}
	held, err := e.tr.owed(ctx, "prove", msgs)
	if err != nil {
		return 0, 0, err
	}
	t := &truth{unsent: unsent, unsentOwed: owedUnsent, owed: held}
	stored := map[string]bool{}
	for _, m := range msgs {
		stored[m.EventID] = true
	}
	for id := range missing {
		switch {
		case t.stillOwed(id):
			owed++
		case held.ids == nil && stored[id] && !unsent[id]:
			unsure++
		}
	}
	return owed, unsure, nil
}

// stillOwed reports whether a committed event that was neither applied nor
// parked can still arrive: the broker holds it for the consumer, or it is
// unsent and a relay will still send it. Otherwise it is lost: the broker
// never got it (or no longer holds it), or the consumer acknowledged it
// without applying it. Where the broker gives only a count (RabbitMQ), the
// first count events asked about are owed.
func (t *truth) stillOwed(id string) bool {
	if t.unsent[id] {
		return t.unsentOwed
	}
	if t.owed.ids != nil {
		return t.owed.ids[id]
	}
	if t.owed.count > 0 {
		t.owed.count--
		return true
	}
	return false
}

// unsentIDs are the outbox rows still pending.
func unsentIDs(ctx context.Context, e *env) (map[string]bool, error) {
	out := map[string]bool{}
	err := scanRows(ctx, e.db.drv.Executor(), `SELECT event_id FROM ferry_outbox o WHERE `+e.outboxStatus("o")+` = 'pending'`, func(s func(...any) error) error {
		var id string
		if err := s(&id); err != nil {
			return err
		}
		out[id] = true
		return nil
	})
	return out, err
}

// unsentOwed says whether pending outbox rows will still be sent. A polling
// relay sends every pending row eventually, and so does the real CDC relay:
// the relay that creates its slot catches the table's pending rows up, and
// its reconciler re-publishes rows left pending behind the slot's
// confirmed position (a row not yet visible when it was marked). Only the
// CDC controls' broken builds run without the reconciler: for them, once
// the slot confirmed past the WAL position settling began at, a row still
// pending was skipped and nothing will ever send it. A slot that does not
// exist yet confirms nothing: the relay that creates it catches up first.
//
// (Until 2026-12-07 a missing slot, and a slot past that position under
// the real relay, both counted pending rows as not owed; CI 21, six prove
// columns at once on two cores, then judged 139 events of cdc-restart
// lost as soon as settling stalled, while a relay still had them to send.)
func (e *env) unsentOwed(ctx context.Context) (bool, error) {
	if !e.sc.cdc || e.settleWAL == "" || e.cdcBuild() == "" {
		return true, nil
	}
	caughtUp := int64(0) // no slot yet
	err := countInto(ctx, e.db.drv.Executor(), `SELECT CASE WHEN confirmed_flush_lsn >= CAST($1 AS pg_lsn) THEN 1 ELSE 0 END FROM pg_replication_slots WHERE slot_name = $2`,
		&caughtUp, e.settleWAL, e.db.schema)
	if err != nil {
		return false, fmt.Errorf("prove: slot position: %w", err)
	}
	return caughtUp == 0, nil
}

func currentWAL(ctx context.Context, e *env) string {
	s, err := queryString(ctx, e.db.drv.Executor(), `SELECT CAST(pg_current_wal_lsn() AS TEXT)`)
	if err != nil {
		e.rec.err(err)
	}
	return s
}
