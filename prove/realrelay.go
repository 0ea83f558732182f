package prove

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/relay"
)

// relayTTL is the lease TTL prove gives relays. It must exceed the worst
// gap between a live relay's renewals, or the relay's own marks are fenced
// over and over and its rows stay pending while it republishes them: the
// scenarios test crash safety and fencing, not how fast a dead relay's
// shards are taken over. On SQLite (one writer at a time) a renewal waits
// for every other writer's lock; under the race detector (modernc SQLite is
// instrumented Go) on a loaded machine the gap between one relay's
// renewals was measured at p50 1.6 s, max 12.9 s with a 300 ms TTL (fences
// reached 11 per shard in 47 s with a single relay). Scenarios that test
// expiry (concurrent-relays' stall) wait in multiples of it.
const relayTTL = 2 * time.Second

// relayPublishTimeout bounds one batch's publish and mark. It exceeds
// concurrent-relays' freeze (3 TTLs): the frozen relay's batch must still
// publish and attempt its mark when the process resumes, so the fence is
// what rejects it — not a deadline that lapsed while it was stopped.
const relayPublishTimeout = 4 * relayTTL

// relayFaults are the in-process fault points prove drives through the
// real relay's relay.Faults hooks.
type relayFaults struct {
	pause         *atomic.Bool       // first batch stalls 3 lease periods
	markBeforeAck bool               // emulate the broken build through the hook
	stopOnce      *atomic.Bool       // freeze the whole process before the first publish
	clock         func() time.Time   // relay.WithClock (relay-clock-skew, skew.go); nil: time.Now
	status        func(relay.Status) // called with the relay's status every 50 ms while it runs
}

// runRealRelay runs one instance of the real relay (package relay) until
// ctx ends or a planned fault crashes it.
func (e *env) runRealRelay(ctx context.Context, name string, rf relayFaults) error {
	pub, err := e.newPublisher()
	if err != nil {
		return err
	}
	defer pub.Close()
	id := name + "-" + randHex(3)
	faults := relay.Faults{
		BeforePublish: func(ctx context.Context, events []ferry.Event) error {
			if rf.pause != nil && rf.pause.CompareAndSwap(true, false) {
				e.faults.Add(1)
				e.log.DebugContext(ctx, "prove: relay stalled past its lease", "relay_instance", id)
				sleepCtx(ctx, 3*relayTTL)
			}
			if rf.stopOnce != nil && rf.stopOnce.CompareAndSwap(true, false) {
				stopSelf() // returns when the parent sends SIGCONT
			}
			if rf.markBeforeAck {
				// The broken build: rows marked sent before the broker
				// acked; a crash here loses them.
				if err := e.markSent(ctx, events); err != nil {
					return err
				}
				for _, ev := range events {
					if e.fire(faultRelayCrash, ev.ID.String()) {
						return errCrash
					}
				}
			}
			return nil
		},
		AfterPublishBeforeMark: func(_ context.Context, events []ferry.Event, _ []broker.Result) error {
			for _, ev := range events {
				if e.fire(faultRelayCrash, ev.ID.String()) {
					return errCrash
				}
			}
			return nil
		},
	}
	var db relay.DB = e.db.drv
	if e.relayDB != nil {
		db = e.relayDB
	}
	opts := []relay.Option{relay.WithShardCount(proveShards), relay.WithInstanceID(id),
		relay.WithPollInterval(20 * time.Millisecond), relay.WithLeaseTTL(relayTTL),
		relay.WithBackoff(20*time.Millisecond, time.Second), relay.WithProbe(50*time.Millisecond, time.Second),
		relay.WithPublishTimeout(relayPublishTimeout), relay.WithBatchSize(200),
		relay.WithLogger(e.log), relay.WithRegisterer(prometheus.WrapRegistererWith(prometheus.Labels{"prove_instance": id}, e.reg)),
		relay.WithFaults(faults), relay.WithClock(rf.clock)}
	if e.sentWatermark {
		opts = append(opts, relay.WithSentWatermark())
	}
	if e.shardPipeline > 1 {
		// Batches of 5 rows: at prove's event counts a shard rarely holds
		// two batches of 200, and its batches must overlap to be tested.
		opts = append(opts, relay.WithShardPipeline(e.shardPipeline), relay.WithBatchSize(5))
	}
	r, err := relay.New(db, pub, opts...)
	if err != nil {
		return fmt.Errorf("prove: relay: %w", err)
	}
	if rf.status != nil {
		done, ended := make(chan struct{}), make(chan struct{})
		defer func() { close(done); <-ended }()
		go func() {
			defer close(ended)
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					rf.status(r.Status())
				}
			}
		}()
	}
	err = r.Run(ctx)
	st := r.Status()
	e.rec.fencedMarks.Add(int64(st.Fenced))
	e.rec.pipelined.Add(int64(st.Pipelined))
	return err
}

// markSent is the broken relay's premature mark.
func (e *env) markSent(ctx context.Context, events []ferry.Event) error {
	if len(events) == 0 {
		return nil
	}
	args := []any{time.Now().UTC()}
	ph := make([]string, len(events))
	for i, ev := range events {
		args = append(args, ev.ID.String())
		ph[i] = fmt.Sprintf("$%d", i+2)
	}
	_, err := e.db.drv.Executor().Exec(ctx, `UPDATE ferry_outbox SET status = 'sent', published_at = $1 WHERE event_id IN (`+strings.Join(ph, ", ")+`)`, args...)
	if err != nil {
		return fmt.Errorf("prove: premature mark: %w", err)
	}
	return nil
}
