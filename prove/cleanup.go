package prove

import (
	"context"

	"errors"
	"fmt"
	"github.com/ferryhq/ferry/ops"
	"sync"
	"time"
)

// ErrRetentionTooShort is returned by the reference cleanup when asked to
// delete dedup state younger than the replay window: a replay would then
// re-apply events the consumer already applied.
var ErrRetentionTooShort = errors.New("prove: cleanup retention shorter than the replay window")

// replayWindow is how far back the broker can redeliver (the stream keeps
// everything for the run, so: all of it).
const replayWindow = time.Hour

// cleanupInbox deletes the inbox's dedup claims and idle aggregate cursors
// older than retention. With guard set it refuses a retention shorter than
// the replay window, as ops cleanup must.
func cleanupInbox(ctx context.Context, e *env, retention time.Duration, guard bool) (int64, error) {
	if guard && retention < replayWindow {
		return 0, fmt.Errorf("%w: retention %s < replay window %s", ErrRetentionTooShort, retention, replayWindow)
	}
	cut := time.Now().Add(-retention).UnixNano()
	ex := e.db.drv.Executor()
	if e.realInbox {
		// package inbox's tables: the dedup rows and the aggregate cursors.
		n1, err := ex.Exec(ctx, `DELETE FROM ferry_inbox WHERE applied_at <= $1`, time.Now().Add(-retention).UTC())
		if err != nil {
			return 0, fmt.Errorf("prove: cleanup inbox: %w", err)
		}
		n2, err := ex.Exec(ctx, `DELETE FROM ferry_inbox_cursor WHERE updated_at <= $1`, time.Now().Add(-retention).UTC())
		if err != nil {
			return 0, fmt.Errorf("prove: cleanup cursors: %w", err)
		}
		return n1 + n2, nil
	}
	n1, err := ex.Exec(ctx, `DELETE FROM prove_inbox WHERE claimed_at <= $1`, cut)
	if err != nil {
		return 0, fmt.Errorf("prove: cleanup inbox: %w", err)
	}
	n2, err := ex.Exec(ctx, `DELETE FROM prove_cursor WHERE updated_at <= $1`, cut)
	if err != nil {
		return 0, fmt.Errorf("prove: cleanup cursors: %w", err)
	}
	return n1 + n2, nil
}

// cleanupThenReplay runs the scenario's cleanup and then replays the whole
// stream through a fresh subscription of the same consumer.
func cleanupThenReplay(ctx context.Context, e *env, wg *sync.WaitGroup, inbox *refInbox) (string, error) {
	var note string
	if e.realInbox {
		n, err := e.opsCleanup(ctx)
		if err != nil {
			return "", err
		}
		note = n
	}
	switch e.sc.cleanup {
	case "guarded":
		if e.realInbox {
			break
		}
		_, err := cleanupInbox(ctx, e, 0, true)
		if !errors.Is(err, ErrRetentionTooShort) {
			return "", fmt.Errorf("prove: guarded cleanup accepted a zero retention (err=%v)", err)
		}
		n, err := cleanupInbox(ctx, e, replayWindow, true)
		if err != nil {
			return "", err
		}
		note = fmt.Sprintf("cleanup with retention 0 refused; with retention = replay window deleted %d rows; full replay absorbed", n)
	case "premature":
		if e.realInbox {
			break
		}
		n, err := cleanupInbox(ctx, e, 0, false)
		if err != nil {
			return "", err
		}
		note = fmt.Sprintf("cleanup with retention 0 (unguarded) deleted %d dedup rows before a full replay", n)
	}
	durable := "replay"
	if err := e.tr.replay(ctx, durable); err != nil {
		return "", err
	}
	replay := &refInbox{env: e, maxAttempts: inbox.maxAttempts, durable: durable, nonAtomic: inbox.nonAtomic, inlineEffect: inbox.inlineEffect}
	if e.realInbox {
		supervise(ctx, wg, e.log, "replay", func(ctx context.Context) error { return e.runRealInbox(ctx, durable, inbox.inlineEffect, true) })
	} else {
		supervise(ctx, wg, e.log, "replay", replay.run)
	}
	deadline := time.Now().Add(e.cfg.duration)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		ok, err := e.tr.drained(ctx, durable)
		if err != nil {
			return "", err
		}
		e.prog.update("replaying the stream")
		if ok {
			break
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	settle(ctx, e, e.cfg)
	return note, nil
}

// opsCleanup runs package ops' cleanup against package inbox's tables. The
// guarded scenario asks for a retention inside the replay window and must
// be refused; the premature control first shortens the window (an audited
// operator override, as a careless operator would) and then cleans.
func (e *env) opsCleanup(ctx context.Context) (string, error) {
	if err := e.snapshotOutbox(ctx); err != nil {
		return "", err
	}
	o, err := ops.New(e.db.drv, ops.WithLogger(e.log))
	if err != nil {
		return "", fmt.Errorf("prove: ops: %w", err)
	}
	approve := ops.Approval{Approve: true, Actor: "ferry-prove", Reason: "prove scenario " + e.sc.name}
	switch e.sc.cleanup {
	case "guarded":
		_, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: time.Second}, approve)
		if !errors.Is(err, ops.ErrRetentionTooShort) {
			return "", fmt.Errorf("prove: ops cleanup accepted a 1s retention inside the replay window (err=%v)", err)
		}
		w, err := o.ReplayWindow(ctx)
		if err != nil {
			return "", err
		}
		res, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: w.Min()}, approve)
		if err != nil {
			return "", fmt.Errorf("prove: ops cleanup: %w", err)
		}
		return fmt.Sprintf("ops cleanup with retention 1s refused (replay window %s); with retention %s deleted %d inbox rows; full replay absorbed",
			w.Min(), w.Min(), res.Inbox), nil
	default: // premature
		if _, err := o.SetReplayWindow(ctx, ops.Window{BrokerDedupWindow: time.Second, InboxReplayHorizon: time.Second}, approve); err != nil {
			return "", fmt.Errorf("prove: shorten window: %w", err)
		}
		sleepCtx(ctx, 1100*time.Millisecond)
		res, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: time.Second}, approve)
		if err != nil {
			return "", fmt.Errorf("prove: ops cleanup: %w", err)
		}
		return fmt.Sprintf("replay window shortened to 1s by an operator; ops cleanup deleted %d inbox rows before a full replay", res.Inbox), nil
	}
}
