package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/relay/cdc"
)

// cdcRestarts is how many times the CDC relay is killed (SIGKILLed as a
// subprocess; stopped in-process when no worker command is set, and in the
// start-from-current-WAL control).
const cdcRestarts = 6

// cdcHoldAt is how many of the start-from-current-WAL control's
// transactions commit before its workload waits for the first relay to go
// down (env.cdcFirstDown).
const cdcHoldAt = 10

// The CDC relay builds a scenario runs (workerJob.Broken for the
// subprocess).
const (
	// cdcBuildCurrentWAL restarts from the current WAL position instead of
	// the slot: rows committed while it was down are skipped.
	cdcBuildCurrentWAL = "cdc-start-from-current-wal"
	// cdcBuildConfirmBeforeMark confirms a batch's LSN at the broker's ack,
	// before the rows are marked sent (lazy marks: the longest flush
	// interval, 10s, and its relays are killed soon after they confirm, so
	// their confirmed rows are never marked): a SIGKILL in between leaves
	// published rows pending behind the slot.
	cdcBuildConfirmBeforeMark = "cdc-confirm-before-mark"
)

// cdcLazyFlush is the confirm-before-mark build's flush interval: its
// first marks come this long after its first broker ack.
const cdcLazyFlush = 10 * time.Second

// cdcOptions are the relay options of a build. Broken builds run without
// the reconciler, which would otherwise repair (late) what they break.
func cdcOptions(build string) []cdc.Option {
	switch build {
	case cdcBuildCurrentWAL:
		return []cdc.Option{cdc.WithFaults(cdc.Faults{StartFromCurrentWAL: true, NoReconcile: true})}
	case cdcBuildConfirmBeforeMark:
		return []cdc.Option{cdc.WithFaults(cdc.Faults{ConfirmBeforeMark: true, NoReconcile: true}), cdc.WithFlushInterval(cdcLazyFlush)}
	}
	// The real relay; the reconciler at prove's patience rather than 10s.
	return []cdc.Option{cdc.WithReconcileInterval(300 * time.Millisecond)}
}

func (e *env) cdcBuild() string {
	switch {
	case e.sc.cdcCurrentWAL:
		return cdcBuildCurrentWAL
	case e.sc.cdcConfirmEarly:
		return cdcBuildConfirmBeforeMark
	}
	return ""
}

// startCDCRelay runs package relay/cdc (Postgres logical replication)
// and kills it cdcRestarts times; the last instance runs until ctx ends.
// restartsDone is closed after the last kill. With a worker command the
// relay is a subprocess, SIGKILLed (startCDCSigkill); otherwise, and for
// the start-from-current-WAL control, it is stopped in-process.
func startCDCRelay(ctx context.Context, wg *sync.WaitGroup, e *env, startFromCurrentWAL bool, restartsDone chan<- struct{}) {
	if !startFromCurrentWAL && len(e.cfg.worker) > 0 {
		startCDCSigkill(ctx, wg, e, restartsDone)
		return
	}
	s1, s2 := seedFor(e.cfg.seed, e.sc.name+"/cdc")
	rng := rand.New(rand.NewPCG(s1, s2))
	build := e.cdcBuild()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			if restartsDone != nil {
				close(restartsDone)
			}
		}()
		for i := 0; ctx.Err() == nil; i++ {
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- e.runCDC(rctx, build) }()
			life := 200*time.Millisecond + time.Duration(rng.Int64N(int64(300*time.Millisecond)))
			if i == 0 && startFromCurrentWAL {
				// The control's first relay goes down once it has sent a
				// row: the workload, held back until the relay streams,
				// has then just started, and it stops after cdcHoldAt
				// transactions until this relay is down. A lifetime
				// counted from the slot's creation let a 100-event
				// workload end before the first kill (once in a full
				// local run); without the hold, a relay slow to stream
				// (-race, a loaded CI) published all 100 in its first
				// batch, and the control showed nothing.
				waitSlot(ctx, e, 60*time.Second)
				waitCount(ctx, e, 10*time.Second, 1, `SELECT COUNT(*) FROM ferry_outbox WHERE status = 'sent'`)
				life = 0
			}
			if i < cdcRestarts {
				select {
				case <-ctx.Done():
				case <-time.After(life):
					e.faults.Add(1)
				case err := <-done:
					e.rec.err(err)
				}
			} else {
				if restartsDone != nil {
					close(restartsDone)
					restartsDone = nil
				}
				<-ctx.Done()
			}
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil {
				e.rec.err(err)
			}
			if i == 0 && e.cdcFirstDown != nil {
				close(e.cdcFirstDown)
			}
			if startFromCurrentWAL && i < cdcRestarts {
				// The control must skip something: it stays down until a
				// transaction has committed behind it (bounded: the
				// workload may have ended), however slow the machine.
				waitCommits(ctx, e, 5*time.Second)
			} else {
				sleepCtx(ctx, 150*time.Millisecond) // down: commits pile up in the WAL
			}
		}
	}()
}

// waitSlot waits, at most limit, until the scenario's replication slot
// exists and a relay streams from it (active). The start-from-current-WAL
// control's workload and its kills wait for it: rows committed before the
// slot exists are caught up from the table, which the broken build does
// right, so a workload that ended before the relay streamed would show
// nothing.
func waitSlot(ctx context.Context, e *env, limit time.Duration) {
	waitCount(ctx, e, limit, 1, `SELECT COUNT(*) FROM pg_replication_slots WHERE slot_name = $1 AND active`, e.db.schema)
}

// waitCommits waits, at most limit, until the outbox holds a row newer
// than when it was called, plus a moment for more to pile up.
func waitCommits(ctx context.Context, e *env, limit time.Duration) {
	const newest = `SELECT COALESCE(MAX(id), 0) FROM ferry_outbox`
	var from int64
	if err := countInto(ctx, e.db.drv.Executor(), newest, &from); err == nil && waitCount(ctx, e, limit, from+1, newest) {
		sleepCtx(ctx, 100*time.Millisecond)
		return
	}
	sleepCtx(ctx, 150*time.Millisecond)
}

// waitCount polls q (a single count) every 20 ms, at most limit, until it
// is at least want; it reports whether it got there.
func waitCount(ctx context.Context, e *env, limit time.Duration, want int64, q string, args ...any) bool {
	deadline := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		var n int64
		if err := countInto(ctx, e.db.drv.Executor(), q, &n, args...); err == nil && n >= want {
			return true
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	return false
}

// startCDCSigkill runs the CDC relay as a worker subprocess and SIGKILLs it
// cdcRestarts times at seeded moments: the first while the first start
// creates the slot and catches up, from the table, the rows committed
// before it (the workload starts first); then alternately mid-stream and
// right after a restart that follows a down time, while the relay streams
// the slot's backlog (those lives count from when the process streams,
// see streamingSince). The confirm-before-mark build's relays are killed
// once they have confirmed something (see confirmedSince), well inside
// its flush interval, so each kill falls between confirmations and marks.
func startCDCSigkill(ctx context.Context, wg *sync.WaitGroup, e *env, restartsDone chan<- struct{}) {
	s1, s2 := seedFor(e.cfg.seed, e.sc.name+"/cdc-sigkill")
	rng := rand.New(rand.NewPCG(s1, s2))
	build := e.cdcBuild()
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	argv := e.cfg.worker
	wg.Add(1)
	go func() {
		defer wg.Done()
		kills := 0
		defer func() {
			if kills < cdcRestarts {
				close(restartsDone)
			}
		}()
		sleepCtx(ctx, 300*time.Millisecond) // rows before the slot exists
		for i := 0; ctx.Err() == nil; i++ {
			from := slotConfirmedLSN(ctx, e)
			prevPID := slotActivePID(ctx, e)
			job, _ := json.Marshal(workerJob{Role: "cdc", DatabaseURL: e.db.adminURL, Schema: e.db.schema, Transport: e.tr.job(),
				ID: fmt.Sprintf("cdc-proc-%d", i), Broken: build})
			cmd, exited, err := startWorkerProc(argv, string(job))
			if err != nil {
				e.rec.err(fmt.Errorf("prove: start cdc worker: %w", err))
				sleepCtx(ctx, 200*time.Millisecond)
				continue
			}
			var timer <-chan time.Time
			if kills < cdcRestarts {
				var life time.Duration
				switch {
				case build == cdcBuildConfirmBeforeMark && i > 0:
					// A fixed life missed the window once under CI's
					// contention: the relay had confirmed nothing yet.
					timer = confirmedSince(ctx, wg, e, from, between(900*time.Millisecond, 2500*time.Millisecond))
				case i == 0:
					life = between(30*time.Millisecond, 250*time.Millisecond) // mid slot creation / catch-up
				case i%2 == 1:
					life = between(80*time.Millisecond, 300*time.Millisecond) // mid backlog, right after the down time
				default:
					life = between(300*time.Millisecond, 900*time.Millisecond) // mid-stream
				}
				if timer == nil && i > 0 {
					// The life counts from when this process streams from
					// the slot, so the kill falls mid-backlog or
					// mid-stream as planned however slowly a loaded
					// machine starts it. (Counted from the start, six
					// kills in CI 21, six columns at once on two cores,
					// all fell before any process had streamed.)
					timer = streamingSince(ctx, wg, e, prevPID, life)
				}
				if timer == nil {
					timer = time.After(life)
				}
			}
			select {
			case <-ctx.Done():
			case <-exited:
				continue
			case <-timer:
				kills++
				e.faults.Add(1)
			}
			_ = cmd.Process.Kill() // SIGKILL: no deferred cleanup, no last status update
			<-exited
			if kills == cdcRestarts && timer != nil {
				close(restartsDone)
			}
			if i%2 == 0 && ctx.Err() == nil {
				sleepCtx(ctx, between(200*time.Millisecond, 500*time.Millisecond)) // down: a backlog builds up in the slot
			}
		}
	}()
}

// slotActivePID is the pid of the walsender streaming the scenario's slot,
// 0 while there is no slot or nothing streams from it.
func slotActivePID(ctx context.Context, e *env) int64 {
	var pid int64
	_ = countInto(ctx, e.db.drv.Executor(), `SELECT COALESCE((SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1), 0)`, &pid, e.db.schema)
	return pid
}

// streamingSince fires life after a walsender other than prev streams
// from the scenario's slot (a new relay process has started streaming),
// or life after at most 20s (a relay that never streams is still killed).
func streamingSince(ctx context.Context, wg *sync.WaitGroup, e *env, prev int64, life time.Duration) <-chan time.Time {
	return firesAfter(wg, func() {
		waitCount(ctx, e, 20*time.Second, 1,
			`SELECT COUNT(*) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL AND active_pid <> $2`, e.db.schema, prev)
		sleepCtx(ctx, life)
	})
}

// firesAfter runs wait in a goroutine of wg and fires once it returns.
func firesAfter(wg *sync.WaitGroup, wait func()) <-chan time.Time {
	fire := make(chan time.Time, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		wait()
		fire <- time.Now()
	}()
	return fire
}

// slotConfirmedLSN is the scenario slot's confirmed position as text
// ("0/0" while there is no slot or it has confirmed nothing).
func slotConfirmedLSN(ctx context.Context, e *env) string {
	rows, err := e.db.drv.Executor().Query(ctx, `SELECT COALESCE((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1), '0/0')::text`, e.db.schema)
	if err != nil {
		return "0/0"
	}
	defer rows.Close()
	lsn := "0/0"
	if rows.Next() && rows.Scan(&lsn) != nil {
		return "0/0"
	}
	return lsn
}

// confirmedSince fires once the slot's confirmed position has passed from
// and at least life has gone by, or at most 8s after that (a relay that
// never confirms is still killed): the confirm-before-mark build's kill
// then falls after a confirmation and, its marks waiting cdcLazyFlush
// from its first ack, before them.
func confirmedSince(ctx context.Context, wg *sync.WaitGroup, e *env, from string, life time.Duration) <-chan time.Time {
	return firesAfter(wg, func() {
		sleepCtx(ctx, life)
		waitCount(ctx, e, 8*time.Second, 1,
			`SELECT COUNT(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn > CAST($2 AS pg_lsn)`, e.db.schema, from)
	})
}

// runCDC runs one CDC relay of build until ctx ends.
func (e *env) runCDC(ctx context.Context, build string) error {
	pub, err := e.newPublisher()
	if err != nil {
		return err
	}
	defer pub.Close()
	opts := append([]cdc.Option{cdc.WithTables(ferry.Tables{Schema: e.db.schema}),
		cdc.WithSlotName(e.db.schema), cdc.WithPublicationName(e.db.schema),
		cdc.WithStandbyTimeout(200 * time.Millisecond), cdc.WithAcquireInterval(100 * time.Millisecond),
		cdc.WithBackoff(20*time.Millisecond, 500*time.Millisecond), cdc.WithLogger(e.log),
		cdc.WithRegisterer(prometheus.WrapRegistererWith(prometheus.Labels{"prove_instance": randHex(3)}, e.reg))},
		cdcOptions(build)...)
	r, err := cdc.New(e.db.adminURL, pub, opts...)
	if err != nil {
		return fmt.Errorf("prove: cdc relay: %w", err)
	}
	return r.Run(ctx)
}

// needsPostgresAndWorker: the CDC SIGKILL control needs both.
func needsPostgresAndWorker(st *stack, c *config) string {
	if why := needsPostgres(st, c); why != "" {
		return why
	}
	if len(c.worker) == 0 {
		return "no worker command (run through `ferry prove`, or pass WithWorkerCommand): the control needs a relay process to SIGKILL"
	}
	return ""
}

// dropCDC removes the scenario's replication slot and publication: a
// forgotten slot pins WAL on the server for ever.
func (e *env) dropCDC(ctx context.Context) {
	ex := e.db.drv.Executor()
	for i := 0; i < 50; i++ {
		if _, err := ex.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, e.db.schema); err == nil {
			break
		}
		// A SIGKILLed worker's walsender may still hold it for a moment.
		_, _ = ex.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, e.db.schema)
		sleepCtx(ctx, 100*time.Millisecond)
	}
	_, _ = ex.Exec(ctx, fmt.Sprintf(`DROP PUBLICATION IF EXISTS %q`, e.db.schema))
}
