package prove

import (
	"context"
	"errors"
	"fmt"
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
	switch e.sc.cleanup {
	case "guarded":
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
		n, err := cleanupInbox(ctx, e, 0, false)
		if err != nil {
			return "", err
		}
		note = fmt.Sprintf("cleanup with retention 0 (unguarded) deleted %d dedup rows before a full replay", n)
	}
	durable := "replay"
	if err := e.stream.createReplayConsumer(ctx, durable); err != nil {
		return "", err
	}
	replay := &refInbox{env: e, maxAttempts: inbox.maxAttempts, durable: durable, nonAtomic: inbox.nonAtomic, inlineEffect: inbox.inlineEffect}
	if e.realInbox {
		supervise(ctx, wg, e.log, "replay", func(ctx context.Context) error { return e.runRealInbox(ctx, durable, inbox.inlineEffect) })
	} else {
		supervise(ctx, wg, e.log, "replay", replay.run)
	}
	deadline := time.Now().Add(e.cfg.duration)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		ok, err := e.stream.drained(ctx, durable)
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
