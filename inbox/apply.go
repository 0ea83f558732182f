package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/sanitize"
)

// errNeedSavepoints: the optimistic pass of a batch hit a message that
// must be undone alone.
var errNeedSavepoints = errors.New("inbox: batch needs savepoints")

// txTally counts what a transaction did beyond its own messages (gap
// successors applied from the parking lot); it is added to the metrics only
// after the commit.
type txTally struct {
	successorsApplied, successorsResolved int
}

// process runs msgs through the inbox in one transaction — a savepoint per
// message when there is more than one — commits, and only then acks.
// Messages that must be retried are nacked with backoff. It returns a
// *FaultError when a fault hook simulated a crash (nothing was acked).
func (ib *Inbox[TTx]) process(ctx context.Context, msgs []*message) error {
	tally, err := ib.applyTx(ctx, msgs, ib.cfg.alwaysSavepoints)
	if errors.Is(err, errNeedSavepoints) {
		// A message of the batch failed: nothing was committed; run the
		// batch again with a savepoint per message so the failure is
		// undone alone and its neighbours commit.
		for _, m := range msgs {
			m.outcome, m.reason, m.errText, m.delay = "", "", "", 0
		}
		tally, err = ib.applyTx(ctx, msgs, true)
	}
	var fe *FaultError
	if errors.As(err, &fe) {
		return err
	}
	if err != nil && ctx.Err() != nil {
		// Stopping (fault elsewhere, drain timeout): leave every message
		// to the broker's redelivery, as a crash would.
		return nil
	}
	if err != nil {
		for _, m := range msgs {
			if m.outcome != OutcomeRetry {
				m.outcome, m.errText, m.delay = OutcomeRetry, err.Error(), ib.retryDelay(m, false)
			}
		}
		ib.log.WarnContext(ctx, "inbox transaction failed; messages will be redelivered", "messages", len(msgs), slog.String(logattr.ErrKey, sanitize.Error(err)))
	}
	if err == nil {
		ib.count(msgs, tally)
	}
	// A message whose effect had to be undone is finished alone: parked
	// (unauthorized, poison) in a transaction of its own, or retried.
	for _, m := range msgs {
		if m.outcome == OutcomeRetry {
			ib.stats.retries.Add(1)
			ib.m.retries.Inc()
		}
	}
	if ib.cfg.faults.AfterCommitBeforeAck != nil && err == nil {
		for _, m := range msgs {
			if ferr := ib.cfg.faults.AfterCommitBeforeAck(m.ev); ferr != nil {
				return &FaultError{Point: "after_commit_before_ack", Err: ferr}
			}
		}
	}
	ib.settleAll(ctx, msgs)
	return nil
}

// settleAll acks/nacks a batch. Broker acks are round trips of their own
// (JetStream double acks wait for the server), so a batch's acks run
// concurrently, a few at a time; order does not matter once committed.
func (ib *Inbox[TTx]) settleAll(ctx context.Context, msgs []*message) {
	if len(msgs) <= 2 {
		for _, m := range msgs {
			ib.settle(ctx, m)
		}
		return
	}
	const parallel = 16
	var wg sync.WaitGroup
	next := make(chan *message)
	for range min(parallel, len(msgs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range next {
				ib.settle(ctx, m)
			}
		}()
	}
	for _, m := range msgs {
		next <- m
	}
	close(next)
	wg.Wait()
}

// settle acks or nacks a live message according to its outcome.
func (ib *Inbox[TTx]) settle(ctx context.Context, m *message) {
	if m.d == nil {
		return
	}
	if m.outcome == OutcomeRetry {
		if m.d.Nack != nil {
			if err := m.d.Nack(ctx, m.delay); err != nil {
				ib.log.WarnContext(ctx, "nack failed; the broker will redeliver after its ack wait", "event_id", m.ev.ID, logattr.Err(err))
			}
		}
		return
	}
	if m.invalid == nil {
		ib.attempts.forget(m.key())
	}
	if m.d.Ack != nil {
		if err := m.d.Ack(ctx); err != nil {
			ib.m.ackErrors.Inc()
			ib.log.WarnContext(ctx, "ack failed after commit; the redelivery will be absorbed as a duplicate", "event_id", m.ev.ID, logattr.Err(err))
		}
	}
}

func (ib *Inbox[TTx]) count(msgs []*message, t txTally) {
	for _, m := range msgs {
		switch m.outcome {
		case OutcomeApplied:
			ib.stats.applied.Add(1)
			ib.m.applied.Inc()
		case OutcomeDuplicate:
			ib.stats.duplicates.Add(1)
			ib.m.duplicates.Inc()
		case OutcomeStale:
			ib.stats.stale.Add(1)
			ib.m.stale.Inc()
		case OutcomeParked:
			if i := reasonIndex(m.reason); i >= 0 {
				ib.stats.parked[i].Add(1)
			}
			ib.m.parked.WithLabelValues(string(m.reason)).Inc()
			if m.reason == ReasonCollision {
				ib.stats.collisions.Add(1)
				ib.m.collisions.Inc()
			}
		}
	}
	ib.stats.applied.Add(int64(t.successorsApplied))
	ib.m.applied.Add(float64(t.successorsApplied))
}

// applyTx is the transaction of process. On an error return nothing was
// committed.
//
// A batch (more than one message) first runs optimistically, without
// savepoints: each costs a round trip and a subtransaction, and almost
// every batch needs none. If any message must be undone (handler error,
// denial, lost race) the optimistic pass returns errNeedSavepoints having
// committed nothing, and process re-runs the batch with withSP, a
// savepoint per message.
func (ib *Inbox[TTx]) applyTx(ctx context.Context, msgs []*message, withSP bool) (txTally, error) {
	var tally txTally
	txv, tx, err := ib.drv.BeginTx(ctx)
	if err != nil {
		return tally, fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	useSP := len(msgs) > 1 && withSP
	optimistic := len(msgs) > 1 && !withSP
	spTaken := false // a savepoint exists to release before taking the next
	bulk := optimistic && ib.q.dialect == driver.Postgres && !ib.cfg.nonAtomicTest
	if bulk {
		if err := ib.bulkPass(ctx, txv, tx, msgs, &tally); err != nil {
			return tally, err
		}
	}
	for _, m := range msgs {
		if bulk {
			break
		}
		if m.invalid != nil {
			if err := ib.parkLive(ctx, tx, m, ReasonUndecodable, m.invalid.Error(), nil); err != nil {
				return tally, err
			}
			continue
		}
		if useSP {
			if err := savepoint(ctx, tx, "ferry_inbox_msg", spTaken); err != nil {
				return tally, err
			}
			spTaken = true
		}
		res, err := ib.step(ctx, txv, tx, m, false, ib.cfg.nonAtomicTest)
		if optimistic && (err != nil || res.kind.needsUndo()) {
			return tally, errNeedSavepoints
		}
		if err != nil {
			if !useSP {
				m.outcome, m.errText, m.delay = OutcomeRetry, err.Error(), ib.retryDelay(m, errors.Is(err, errConcurrent))
				return tally, err
			}
			if rbErr := rollbackTo(ctx, tx, "ferry_inbox_msg"); rbErr != nil {
				return tally, errors.Join(err, rbErr)
			}
			m.outcome, m.errText, m.delay = OutcomeRetry, err.Error(), ib.retryDelay(m, errors.Is(err, errConcurrent))
			continue
		}
		if res.kind.needsUndo() {
			if !useSP {
				// Undo by rolling back the whole (one-message) transaction,
				// then finish the message in a transaction of its own.
				_ = tx.Rollback(ctx)
				return tally, ib.finishUndone(ctx, m, res)
			}
			if err := rollbackTo(ctx, tx, "ferry_inbox_msg"); err != nil {
				return tally, err
			}
			if err := ib.finishFailure(ctx, tx, m, res); err != nil {
				return tally, err
			}
			continue
		}
		if err := ib.finishStep(ctx, txv, tx, m, res, &tally); err != nil {
			return tally, err
		}
	}
	if ib.cfg.faults.BeforeCommit != nil {
		for _, m := range msgs {
			if ferr := ib.cfg.faults.BeforeCommit(m.ev); ferr != nil {
				return tally, &FaultError{Point: "before_commit", Err: ferr}
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return tally, fmt.Errorf("inbox: commit: %w", err)
	}
	if ib.cfg.nonAtomicTest {
		// Negative control only: the claim committed above; the effect
		// now runs in a second transaction, which a crash can lose.
		return tally, ib.nonAtomicEffects(ctx, msgs)
	}
	return tally, nil
}

// finishStep records the outcome of a step that needs no undo, parking in
// the same transaction where the outcome says so.
func (ib *Inbox[TTx]) finishStep(ctx context.Context, txv TTx, tx driver.Tx, m *message, res stepResult, tally *txTally) error {
	switch res.kind {
	case stepApplied:
		m.outcome = OutcomeApplied
		if res.hasSuccessor {
			if err := ib.applySuccessors(ctx, txv, tx, m.ev, tally); err != nil {
				return err
			}
		}
	case stepDuplicate:
		m.outcome = OutcomeDuplicate
	case stepStale:
		m.outcome = OutcomeStale
	case stepGap:
		return ib.parkLive(ctx, tx, m, ReasonGap, res.err.Error(), nil)
	case stepCollision:
		ib.log.ErrorContext(ctx, "event id collision: same tenant and event id, different content; parked, original effect untouched",
			"tenant_id", m.ev.TenantID, "event_id", m.ev.ID, "aggregate_type", m.ev.AggregateType, "aggregate_id", m.ev.AggregateID)
		return ib.parkLive(ctx, tx, m, ReasonCollision, "fingerprint differs from the applied event with this tenant and event id", res.prevFP)
	case stepSchema:
		return ib.parkLive(ctx, tx, m, ReasonSchema, res.err.Error(), nil)
	default:
		return fmt.Errorf("inbox: unexpected step result %d", res.kind)
	}
	return nil
}

// finishFailure decides what an undone message becomes (the caller already
// rolled its effect back): unauthorized or not decryptable → parked; handler error → parked
// as poison when permanent or out of attempts, else retried.
func (ib *Inbox[TTx]) finishFailure(ctx context.Context, exec driver.Executor, m *message, res stepResult) error {
	if res.kind == stepDecrypt {
		return ib.parkLive(ctx, exec, m, ReasonDecrypt, res.err.Error(), nil)
	}
	if res.kind == stepClaimCheck {
		return ib.parkLive(ctx, exec, m, ReasonClaimCheck, res.err.Error(), nil)
	}
	if res.kind == stepUnauthorized {
		ib.log.WarnContext(ctx, "authorization denied; parked", "event_id", m.ev.ID, "tenant_id", m.ev.TenantID,
			"principal", sanitize.Text(m.ev.Headers.Principal, 128), "action", sanitize.Text(m.ev.Headers.Action, 128))
		return ib.parkLive(ctx, exec, m, ReasonUnauthorized, res.err.Error(), nil)
	}
	attempt := ib.attempts.inc(m.key())
	if m.d != nil {
		attempt = max(attempt, m.d.Attempt)
	}
	m.attempt = attempt
	if errors.Is(res.err, ErrPermanent) || attempt >= ib.cfg.maxAttempts {
		ib.log.WarnContext(ctx, "handler failed; parked as poison", "event_id", m.ev.ID, "attempts", attempt,
			"permanent", errors.Is(res.err, ErrPermanent), slog.String(logattr.ErrKey, sanitize.Error(res.err)))
		return ib.parkLive(ctx, exec, m, ReasonPoison, res.err.Error(), nil)
	}
	m.outcome, m.errText, m.delay = OutcomeRetry, res.err.Error(), ib.retryDelay(m, false)
	ib.log.InfoContext(ctx, "handler failed; will be redelivered", "event_id", m.ev.ID, "attempt", attempt, "delay", m.delay,
		slog.String(logattr.ErrKey, sanitize.Error(res.err)))
	return nil
}

// finishUndone finishes a one-message transaction that was rolled back to
// undo the claim: park in a new transaction, or leave for retry.
func (ib *Inbox[TTx]) finishUndone(ctx context.Context, m *message, res stepResult) error {
	tx, err := ib.drv.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := ib.finishFailure(ctx, tx, m, res); err != nil {
		return err
	}
	if m.outcome == OutcomeRetry {
		return nil
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: commit park: %w", err)
	}
	return nil
}

func (ib *Inbox[TTx]) parkLive(ctx context.Context, exec driver.Executor, m *message, reason Reason, errText string, otherFP []byte) error {
	if _, err := ib.park(ctx, exec, m, reason, errText, otherFP); err != nil {
		return err
	}
	m.outcome, m.reason, m.errText = OutcomeParked, reason, errText
	return nil
}

// applySuccessors applies the parked gap successors of after's aggregate
// that have become next in line, in order, each under a savepoint so a
// failing successor stays parked without undoing after.
func (ib *Inbox[TTx]) applySuccessors(ctx context.Context, txv TTx, tx driver.Tx, after ferry.Event, tally *txTally) error {
	seq := after.AggregateSeq
	for range maxSuccessorsPerTx {
		p, found, err := ib.loadParked(ctx, tx, ib.q.nextGap, ib.name, after.TenantID, after.AggregateType, after.AggregateID)
		if err != nil || !found || p.Event.AggregateSeq > seq+1 {
			return err
		}
		done, next, err := ib.replayParked(ctx, txv, tx, p, tally)
		if err != nil || !done {
			return err
		}
		seq = max(seq, next)
	}
	return nil
}

// maxSuccessorsPerTx bounds how many parked successors one transaction
// applies; the heal sweep continues where it stopped.
const maxSuccessorsPerTx = 1000

func savepoint(ctx context.Context, tx driver.Tx, name string, release bool) error {
	var err error
	switch {
	case release && tx.Dialect() == driver.Postgres:
		// One round trip: pgx sends argument-less statements by the
		// simple protocol, which takes several.
		_, err = tx.Exec(ctx, "RELEASE SAVEPOINT "+name+"; SAVEPOINT "+name)
	case release:
		if _, err = tx.Exec(ctx, "RELEASE SAVEPOINT "+name); err == nil {
			_, err = tx.Exec(ctx, "SAVEPOINT "+name)
		}
	default:
		_, err = tx.Exec(ctx, "SAVEPOINT "+name)
	}
	if err != nil {
		return fmt.Errorf("inbox: savepoint: %w", err)
	}
	return nil
}

func releaseSavepoint(ctx context.Context, tx driver.Tx, name string) error {
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+name); err != nil {
		return fmt.Errorf("inbox: release savepoint: %w", err)
	}
	return nil
}

func rollbackTo(ctx context.Context, tx driver.Tx, name string) error {
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+name); err != nil {
		return fmt.Errorf("inbox: rollback to savepoint: %w", err)
	}
	return nil
}

// retryDelay is the nack delay: base × 2^(attempt-1), full jitter, capped.
// A lost race with another instance retries almost at once.
func (ib *Inbox[TTx]) retryDelay(m *message, race bool) time.Duration {
	if race {
		return backoff.Uniform(0, 20*time.Millisecond)
	}
	return backoff.Full(ib.cfg.backoffBase, ib.cfg.backoffMax, m.attempt)
}

// nonAtomicEffects is the negative control's second transaction.
func (ib *Inbox[TTx]) nonAtomicEffects(ctx context.Context, msgs []*message) error {
	txv, tx, err := ib.drv.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, m := range msgs {
		if m.outcome != OutcomeApplied {
			continue
		}
		if err := ib.handler(ctx, txv, m.ev); err != nil {
			return err
		}
	}
	if ib.cfg.faults.AfterCommitBeforeAck != nil {
		// In the control, the "claim committed, effect not yet" window is
		// where the crash lands.
		for _, m := range msgs {
			if ferr := ib.cfg.faults.AfterCommitBeforeAck(m.ev); ferr != nil {
				return &FaultError{Point: "after_commit_before_ack", Err: ferr}
			}
		}
	}
	return tx.Commit(ctx)
}
