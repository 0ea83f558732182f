package effect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/logattr"
)

// Faults are test hooks for crash experiments. Every hook is nil by default
// and costs one nil check when unused.
type Faults struct {
	// AfterExecuteBeforeRecord runs after Executor.Execute returned and
	// before the ledger records the outcome. Returning an error makes the
	// worker abandon the intent exactly as a crash at that point would: the
	// row stays in_flight until its lease expires, and is then reconciled.
	// A hook may also block, or kill the process, to simulate a real crash.
	AfterExecuteBeforeRecord func(in Intent, res Result, execErr error) error
}

// Worker executes recorded intents. It is safe to run several workers (in
// one process or many) on one ledger: rows are claimed under a lease.
type Worker struct {
	db     db
	sql    statements
	exec   Executor
	rec    Reconciler
	cfg    workerConfig
	now    func() time.Time
	m      *metrics
	log    *slog.Logger
	id     string
	mu     sync.Mutex
	target map[string]*targetState
}

type db interface {
	Executor() driver.Executor
}

type workerConfig struct {
	id             string
	batch          int
	poll           time.Duration
	lease          time.Duration
	callTimeout    time.Duration
	maxAttempts    int
	backoffBase    time.Duration
	backoffMax     time.Duration
	concurrency    int
	rateLimit      rate.Limit
	rateBurst      int
	breakerFails   int
	breakerCool    time.Duration
	reg            prometheus.Registerer
	log            *slog.Logger
	faults         Faults
	onBreakerShift func(target string, from, to BreakerState)
}

// WorkerOption configures a Worker.
type WorkerOption func(*workerConfig)

// WithWorkerID names the worker in leases and logs (default: a random UUID).
func WithWorkerID(id string) WorkerOption { return func(c *workerConfig) { c.id = id } }

// WithBatchSize bounds how many intents the worker holds at once (default 64).
func WithBatchSize(n int) WorkerOption { return func(c *workerConfig) { c.batch = n } }

// WithPollInterval is how long the worker sleeps when nothing is due (default 200ms).
func WithPollInterval(d time.Duration) WorkerOption { return func(c *workerConfig) { c.poll = d } }

// WithLease is how long a claimed intent is reserved for this worker
// (default 30s). An in_flight intent whose lease expired is taken over by
// any worker and treated as unknown. It must be at least twice the call
// timeout so a live call never outlasts its lease.
func WithLease(d time.Duration) WorkerOption { return func(c *workerConfig) { c.lease = d } }

// WithCallTimeout bounds each Execute and Status call (default 10s). A call
// cut by the timeout after sending is unknown, never retried blind.
func WithCallTimeout(d time.Duration) WorkerOption {
	return func(c *workerConfig) { c.callTimeout = d }
}

// WithMaxAttempts bounds execution attempts per intent (default 5). When an
// intent is known not to have happened and the bound is reached, it fails.
// Unknown intents are never failed by the bound: they are reconciled (with
// capped backoff) until the outside system answers.
func WithMaxAttempts(n int) WorkerOption { return func(c *workerConfig) { c.maxAttempts = n } }

// WithBackoff sets full-jitter backoff: the n-th retry waits a random
// duration in [0, min(max, base·2^n)) (default 100ms, 1m). Jitter spreads
// retries of many intents, so a recovered provider is not hit all at once.
func WithBackoff(base, max time.Duration) WorkerOption {
	return func(c *workerConfig) { c.backoffBase, c.backoffMax = base, max }
}

// WithTargetConcurrency bounds concurrent calls per target (default 16).
// Run claims at most this many intents at a time, and none of a target
// whose calls its claims already fill.
func WithTargetConcurrency(n int) WorkerOption { return func(c *workerConfig) { c.concurrency = n } }

// WithTargetRate limits calls (executions and status queries) per target to
// r per second with burst (default 100/s, burst 100). rate.Inf disables it.
func WithTargetRate(r rate.Limit, burst int) WorkerOption {
	return func(c *workerConfig) { c.rateLimit, c.rateBurst = r, burst }
}

// WithBreaker sets the per-target circuit breaker: it opens after failures
// consecutive unclear or unsent calls and lets one probe through per
// cooldown (default 5, 5s). While open, due intents of the target wait; no
// attempt is spent, so an outage never becomes a retry storm.
func WithBreaker(failures int, cooldown time.Duration) WorkerOption {
	return func(c *workerConfig) { c.breakerFails, c.breakerCool = failures, cooldown }
}

// WithRegisterer registers the worker's metrics (ferry_effect_*) on reg.
func WithRegisterer(reg prometheus.Registerer) WorkerOption {
	return func(c *workerConfig) { c.reg = reg }
}

// WithLogger sets the logger. Without it (or with nil) the worker logs to
// slog.Default() as it is when NewWorker runs, like every Ferry component;
// pass slog.New(slog.DiscardHandler) to silence it. Logs carry keys and
// ids, never request or response bodies or secrets, and are written with
// the context of the work, so a handler can attach trace ids.
func WithLogger(l *slog.Logger) WorkerOption { return func(c *workerConfig) { c.log = l } }

// WithFaults installs crash-experiment hooks (tests, `ferry prove`).
func WithFaults(f Faults) WorkerOption { return func(c *workerConfig) { c.faults = f } }

// WithBreakerObserver is called on every breaker transition (tests, alerts).
func WithBreakerObserver(f func(target string, from, to BreakerState)) WorkerOption {
	return func(c *workerConfig) { c.onBreakerShift = f }
}

// NewWorker returns a worker executing the intents of l with exec, and
// reconciling unknown ones with rec. Both are required: a worker that could
// not reconcile would have to choose between retrying blind and giving up.
func NewWorker[TTx any](l *Ledger[TTx], exec Executor, rec Reconciler, opts ...WorkerOption) (*Worker, error) {
	cfg := workerConfig{
		batch: 64, poll: 200 * time.Millisecond, lease: 30 * time.Second, callTimeout: 10 * time.Second,
		maxAttempts: 5, backoffBase: 100 * time.Millisecond, backoffMax: time.Minute, concurrency: 16,
		rateLimit: 100, rateBurst: 100, breakerFails: 5, breakerCool: 5 * time.Second,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if exec == nil {
		return nil, &ferry.ConfigError{Field: "effect.executor", Reason: "is required"}
	}
	if rec == nil {
		return nil, &ferry.ConfigError{Field: "effect.reconciler", Reason: "is required: unknown outcomes must be reconciled, never retried blind"}
	}
	checks := []struct {
		ok            bool
		field, reason string
	}{
		{cfg.batch >= 1 && cfg.batch <= 1000, "effect.batch_size", fmt.Sprintf("must be in 1..1000, got %d", cfg.batch)},
		{cfg.poll > 0, "effect.poll_interval", fmt.Sprintf("must be positive, got %s", cfg.poll)},
		{cfg.callTimeout > 0, "effect.call_timeout", fmt.Sprintf("must be positive, got %s", cfg.callTimeout)},
		{cfg.lease >= 2*cfg.callTimeout, "effect.lease", fmt.Sprintf("lease %s must be at least twice the call timeout %s", cfg.lease, cfg.callTimeout)},
		{cfg.maxAttempts >= 1 && cfg.maxAttempts <= 100, "effect.max_attempts", fmt.Sprintf("must be in 1..100, got %d", cfg.maxAttempts)},
		{cfg.backoffBase > 0 && cfg.backoffMax >= cfg.backoffBase, "effect.backoff", fmt.Sprintf("need 0 < base <= max, got base %s max %s", cfg.backoffBase, cfg.backoffMax)},
		{cfg.concurrency >= 1 && cfg.concurrency <= 10000, "effect.target_concurrency", fmt.Sprintf("must be in 1..10000, got %d", cfg.concurrency)},
		{cfg.rateLimit > 0 && cfg.rateBurst >= 1, "effect.target_rate", fmt.Sprintf("need rate > 0 and burst >= 1, got %v/%d", cfg.rateLimit, cfg.rateBurst)},
		{cfg.breakerFails >= 1 && cfg.breakerCool > 0, "effect.breaker", fmt.Sprintf("need failures >= 1 and cooldown > 0, got %d, %s", cfg.breakerFails, cfg.breakerCool)},
		{len(cfg.id) <= MaxNameBytes, "effect.worker_id", fmt.Sprintf("must be at most %d bytes", MaxNameBytes)},
	}
	for _, c := range checks {
		if !c.ok {
			return nil, &ferry.ConfigError{Field: c.field, Reason: c.reason}
		}
	}
	m, err := newMetrics(cfg.reg)
	if err != nil {
		return nil, err
	}
	if cfg.id == "" {
		cfg.id = uuid.NewString()
	}
	log := logattr.OrDefault(cfg.log)
	return &Worker{db: l.drv, sql: l.sql, exec: exec, rec: rec, cfg: cfg, now: l.now, m: m,
		log: log.With("component", "effect.worker", "worker", cfg.id), id: cfg.id, target: map[string]*targetState{}}, nil
}

// targetState is the per-target protection: concurrency, rate, breaker.
type targetState struct {
	name    string
	sem     chan struct{}
	limiter *rate.Limiter
	breaker *breaker
	// held counts the target's intents Run has claimed and not finished
	// with (called, waiting for a slot, or being released).
	held atomic.Int64
}

// maxSkippedTargets bounds the targets a claim leaves out (one parameter
// each); intents of further full targets are claimed and wait for a slot
// as far as takeSlot allows.
const maxSkippedTargets = 100

// fullTargets lists the targets whose call slots Run's claims fill.
func (w *Worker) fullTargets() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for name, t := range w.target {
		if t.held.Load() >= int64(w.cfg.concurrency) && len(out) < maxSkippedTargets {
			out = append(out, name)
		}
	}
	return out
}

func (w *Worker) targetFor(name string) *targetState {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t, ok := w.target[name]; ok {
		return t
	}
	t := &targetState{name: name, sem: make(chan struct{}, w.cfg.concurrency), limiter: rate.NewLimiter(w.cfg.rateLimit, w.cfg.rateBurst)}
	t.breaker = &breaker{threshold: w.cfg.breakerFails, cooldown: w.cfg.breakerCool, onChange: func(from, to BreakerState) {
		w.m.setBreaker(name, to)
		w.m.breakerTransitions.WithLabelValues(name, to.String()).Inc()
		w.log.Warn("effect breaker", "target", name, "from", from.String(), "to", to.String())
		if w.cfg.onBreakerShift != nil {
			w.cfg.onBreakerShift(name, from, to)
		}
	}}
	w.m.setBreaker(name, BreakerClosed)
	w.target[name] = t
	return t
}

// BreakerState returns target's breaker state (closed if never called).
func (w *Worker) BreakerState(target string) BreakerState {
	w.mu.Lock()
	t, ok := w.target[target]
	w.mu.Unlock()
	if !ok {
		return BreakerClosed
	}
	return t.breaker.current()
}

// Run claims and executes intents until ctx is done, then waits for calls
// in progress (each bounded by the call timeout) and returns nil. Calls in
// progress are not cancelled by ctx: cutting one after sending would only
// turn a known outcome into an unknown one.
func (w *Worker) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, w.cfg.batch)
	freed := make(chan struct{}, 1)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := 1
	more:
		for free < w.cfg.batch {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break more
			}
		}
		// A claim takes at most one target's worth of call slots and none
		// for a target whose slots this worker's claims already fill:
		// intents claimed beyond what can be called wait here under a
		// lease while another worker, idle, could call them.
		limit, skip := min(free, w.cfg.concurrency), w.fullTargets()
		rows, err := w.claim(ctx, limit, skip)
		if err != nil && ctx.Err() == nil {
			w.log.ErrorContext(ctx, "effect claim failed", logattr.Err(err))
		}
		for range free - len(rows) {
			<-slots
		}
		for _, r := range rows {
			t := w.targetFor(r.in.Target)
			t.held.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				defer func() {
					// A skipped target has a free slot again: claim now,
					// not after the poll interval.
					if t.held.Add(-1) == int64(w.cfg.concurrency-1) {
						select {
						case freed <- struct{}{}:
						default:
						}
					}
				}()
				w.process(ctx, r)
			}()
		}
		if len(rows) == 0 {
			t := time.NewTimer(w.cfg.poll)
			select {
			case <-t.C:
			case <-freed:
				t.Stop()
			case <-ctx.Done():
				t.Stop()
				return nil
			}
		}
	}
}

// Work claims one batch of due intents, processes it and returns how many
// it claimed. Run is Work in a loop; Work suits tests and cron-style use.
func (w *Worker) Work(ctx context.Context) (int, error) {
	rows, err := w.claim(ctx, w.cfg.batch, nil)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	for _, r := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.process(ctx, r)
		}()
	}
	wg.Wait()
	return len(rows), nil
}

// row is a claimed intent.
type row struct {
	id              int64
	owner           string
	claimedAt       time.Time // by this worker's clock: the claim's lease runs from here
	in              Intent
	state           State
	attempts        int
	reconciliations int
}

// claim takes up to limit due intents under a lease, leaving out skip's
// targets.
func (w *Worker) claim(ctx context.Context, limit int, skip []string) ([]row, error) {
	now := w.now().UTC()
	owner := w.id + "/" + uuid.NewString()[:8]
	args := make([]any, 0, 4+len(skip))
	args = append(args, owner, now.Add(w.cfg.lease), now, limit)
	for _, t := range skip {
		args = append(args, t)
	}
	query := claimSkipping(w.sql.claim, skip)
	if w.sql.mysqlPick != "" {
		q, err := w.claimMySQL(ctx, skip, args...)
		if err != nil {
			return nil, fmt.Errorf("effect: claim: %w", err)
		}
		if q == "" {
			return nil, nil
		}
		query = q
	}
	rows, err := w.db.Executor().Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("effect: claim: %w", err)
	}
	defer rows.Close()
	var out []row
	for rows.Next() {
		r := row{owner: owner, claimedAt: now}
		var ev, state string
		if err := rows.Scan(&r.id, &r.in.Key, &r.in.Consumer, &ev, &r.in.Step, &r.in.TenantID, &r.in.Target, &r.in.Operation,
			&r.in.Request, &state, &r.attempts, &r.reconciliations); err != nil {
			return nil, fmt.Errorf("effect: claim: %w", err)
		}
		if r.in.EventID, err = uuid.Parse(ev); err != nil {
			return nil, fmt.Errorf("effect: claim: event id of %s: %w", r.in.Key, err)
		}
		r.state = State(state)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("effect: claim: %w", err)
	}
	return out, nil
}

// process moves one claimed intent on as far as it safely can.
func (w *Worker) process(ctx context.Context, r row) {
	// Ledger writes and calls outlive ctx's cancellation (bounded by their
	// own timeouts): abandoning them half-way only creates unknowns.
	bg := context.WithoutCancel(ctx)
	t := w.targetFor(r.in.Target)
	if !w.takeSlot(ctx, bg, t, r) {
		return
	}
	defer func() { <-t.sem }()
	log := w.log.With("key", r.in.Key, "consumer", r.in.Consumer, "event_id", r.in.EventID.String(), "step", r.in.Step, "target", r.in.Target)
	if r.state == StateUnknown {
		if !w.reconcile(ctx, bg, t, r, log) {
			return
		}
	}
	w.execute(ctx, bg, t, r, log)
}

// takeSlot waits for one of the target's call slots, but not past the
// point where the claim's lease would no longer cover a call (the bound
// execute applies to a slow start). A claim can take more intents of a
// target than it has free slots (Run's up to the slot count, Work's a
// whole batch), and when the calls in progress run long, the intents
// behind them would otherwise sit claimed and untried until their lease
// ran out. Released, due at once, they go to whichever worker has a free
// slot first. It returns false when the intent was released.
func (w *Worker) takeSlot(ctx, bg context.Context, t *targetState, r row) bool {
	select {
	case t.sem <- struct{}{}:
		return true
	default:
	}
	wait := time.NewTimer(r.claimedAt.Add(w.slotWait()).Sub(w.now()))
	defer wait.Stop()
	select {
	case t.sem <- struct{}{}:
		return true
	case <-wait.C:
		w.release(bg, r, w.now(), "no_call_slot")
	case <-ctx.Done():
		w.release(bg, r, w.now(), "shutdown")
	}
	return false
}

// gate applies the breaker and the rate limit before a call. If the call
// may not go now, the intent is released for later and gate returns false.
func (w *Worker) gate(ctx, bg context.Context, t *targetState, r row) bool {
	now := w.now()
	if ok, retryAt := t.breaker.allow(now); !ok {
		// Spread the wake-ups over a fraction of the cooldown.
		w.release(bg, r, retryAt.Add(backoff.Uniform(0, w.cfg.breakerCool/4)), "breaker_open")
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, w.cfg.lease/2)
	defer cancel()
	if err := t.limiter.Wait(wctx); err != nil {
		w.release(bg, r, now.Add(w.backoff(1)), "rate_limited")
		return false
	}
	return true
}

// reconcile asks the outside system about an unknown intent. It returns
// true when the intent is known not to have happened and may be executed
// again (with the same key).
func (w *Worker) reconcile(ctx, bg context.Context, t *targetState, r row, log *slog.Logger) bool {
	if !w.gate(ctx, bg, t, r) {
		return false
	}
	cctx, cancel := context.WithTimeout(bg, w.cfg.callTimeout)
	st, err := w.rec.Status(cctx, r.in)
	cancel()
	if err != nil {
		st = Status{Lookup: LookupUnknown, Summary: truncate(err.Error(), MaxSummaryBytes)}
	}
	t.breaker.record(w.now(), st.Lookup != LookupUnknown)
	w.m.reconciliations.WithLabelValues(r.in.Target, st.Lookup.String()).Inc()
	now := w.now().UTC()
	switch st.Lookup {
	case LookupFound:
		log.InfoContext(ctx, "effect reconciled: found", "operation_id", st.OperationID)
		w.finish(bg, r, StateSucceeded, truncate(st.OperationID, MaxOpIDBytes), truncate(st.Summary, MaxSummaryBytes), "", 1, now, log)
		return false
	case LookupNotFound:
		if r.attempts >= w.cfg.maxAttempts {
			log.WarnContext(ctx, "effect failed: not applied and attempts exhausted", "attempts", r.attempts)
			w.finish(bg, r, StateFailed, "", truncate(st.Summary, MaxSummaryBytes),
				fmt.Sprintf("not applied (status query: not found) after %d attempts; attempts exhausted", r.attempts), 1, now, log)
			return false
		}
		n, err := w.db.Executor().Exec(bg, w.sql.notFound, r.id, r.owner, now)
		if err != nil || n != 1 {
			log.WarnContext(ctx, "effect: could not record reconciliation; leaving for lease expiry", logattr.Err(err), "rows", n)
			return false
		}
		log.InfoContext(ctx, "effect reconciled: not found; executing again with the same key")
		return true
	default:
		msg := "status query inconclusive"
		if err != nil {
			msg = "status query failed: " + err.Error()
		}
		next := now.Add(w.backoff(r.reconciliations + 1))
		if _, err := w.db.Executor().Exec(bg, w.sql.unknown, r.id, r.owner, next, truncate(msg, MaxSummaryBytes), 1, now); err != nil {
			log.WarnContext(ctx, "effect: could not record reconciliation", logattr.Err(err))
		}
		return false
	}
}

func (w *Worker) execute(ctx, bg context.Context, t *targetState, r row, log *slog.Logger) {
	if !w.gate(ctx, bg, t, r) {
		return
	}
	now := w.now().UTC()
	// The attempt is committed before the call: if we die during the call,
	// the next worker finds it in_flight and reconciles instead of retrying.
	leaseEnd := now.Add(w.cfg.lease)
	n, err := w.db.Executor().Exec(bg, w.sql.start, r.id, r.owner, leaseEnd, now)
	if err != nil || n != 1 {
		log.WarnContext(ctx, "effect: lost the intent before the call; not executing", logattr.Err(err), "rows", n)
		return
	}
	// If the database made us wait, the lease we just wrote may not cover
	// the call any more; another worker could then take the row over and
	// reconcile while our call is still in progress. Do not call. Nothing
	// was sent, so the attempt is taken back (unstart): it does not count
	// towards the maximum — a database slow for a while must not exhaust
	// an intent that was never tried. Had the lease already passed to
	// another claim, unstart changes nothing and that claim reconciles
	// (not found → retried with the same key).
	// The slack left after the call, at least (lease − call timeout)/2,
	// absorbs clock differences between workers.
	if elapsed := w.now().Sub(now); elapsed > w.slotWait() {
		log.WarnContext(ctx, "effect: attempt start took too long; not calling, the lease would not cover the call", "elapsed", elapsed)
		at := w.now().UTC()
		if _, err := w.db.Executor().Exec(bg, w.sql.unstart, r.id, r.owner, at.Add(w.backoff(0)), at); err != nil {
			log.WarnContext(ctx, "effect: could not take the attempt back; it will be reconciled after its lease", logattr.Err(err))
		}
		w.m.attempts.WithLabelValues(r.in.Target, "not_called").Inc()
		return
	}
	in := r.in
	in.Attempt = r.attempts + 1
	r.attempts++
	cctx, cancel := context.WithTimeout(bg, w.cfg.callTimeout)
	res, execErr := w.exec.Execute(cctx, in)
	cancel()
	if h := w.cfg.faults.AfterExecuteBeforeRecord; h != nil {
		if err := h(in, res, execErr); err != nil {
			log.WarnContext(ctx, "effect fault injected after execute: outcome not recorded", logattr.Err(err))
			return
		}
	}
	now = w.now().UTC()
	switch {
	case execErr == nil:
		t.breaker.record(now, true)
		w.m.attempts.WithLabelValues(in.Target, "succeeded").Inc()
		w.finish(bg, r, StateSucceeded, truncate(res.OperationID, MaxOpIDBytes), truncate(res.Summary, MaxSummaryBytes), "", 0, now, log)
	case errors.Is(execErr, ErrRejected):
		t.breaker.record(now, true) // the provider is up and answering
		w.m.attempts.WithLabelValues(in.Target, "failed").Inc()
		w.finish(bg, r, StateFailed, "", truncate(res.Summary, MaxSummaryBytes), truncate(execErr.Error(), MaxSummaryBytes), 0, now, log)
	case errors.Is(execErr, ErrNotSent):
		t.breaker.record(now, false)
		w.m.attempts.WithLabelValues(in.Target, "not_sent").Inc()
		if r.attempts >= w.cfg.maxAttempts {
			w.finish(bg, r, StateFailed, "", "", truncate(fmt.Sprintf("never sent; %d attempts exhausted: %v", r.attempts, execErr), MaxSummaryBytes), 0, now, log)
			return
		}
		next := now.Add(w.backoff(r.attempts))
		if _, err := w.db.Executor().Exec(bg, w.sql.retry, r.id, r.owner, next, truncate(execErr.Error(), MaxSummaryBytes), now); err != nil {
			log.WarnContext(ctx, "effect: could not record retry", logattr.Err(err))
		}
	default:
		t.breaker.record(now, false)
		w.m.attempts.WithLabelValues(in.Target, "unknown").Inc()
		log.InfoContext(ctx, "effect outcome unknown; will reconcile before any new attempt", "attempt", in.Attempt)
		// No status query before the attempt's lease has run out. A call
		// that timed out may have left a request still on its way to the
		// provider; a status query sent now could answer "not found" and
		// the intent be executed again, and then the first request lands:
		// two charges. The lease ends at least (lease − call timeout)/2
		// after the call's deadline — the same point at which a takeover
		// reconciles the attempt of a worker that died.
		next := now.Add(w.backoff(0))
		if next.Before(leaseEnd) {
			next = leaseEnd
		}
		if _, err := w.db.Executor().Exec(bg, w.sql.unknown, r.id, r.owner, next, truncate(execErr.Error(), MaxSummaryBytes), 0, now); err != nil {
			log.WarnContext(ctx, "effect: could not record unknown outcome; lease expiry will mark it unknown", logattr.Err(err))
		}
	}
}

// finish records a terminal state.
func (w *Worker) finish(bg context.Context, r row, s State, opID, summary, lastErr string, recon int, now time.Time, log *slog.Logger) {
	var err error
	if s == StateSucceeded {
		_, err = w.db.Executor().Exec(bg, w.sql.succeed, r.id, r.owner, opID, summary, recon, now)
	} else {
		_, err = w.db.Executor().Exec(bg, w.sql.fail, r.id, r.owner, lastErr, recon, now, summary)
	}
	if err != nil {
		log.WarnContext(bg, "effect: could not record outcome; lease expiry will reconcile it", "state", string(s), logattr.Err(err))
		return
	}
	w.m.attemptsPerEffect.WithLabelValues(r.in.Target, string(s)).Observe(float64(r.attempts))
	log.DebugContext(bg, "effect done", "state", string(s), "operation_id", opID, "attempts", r.attempts)
}

// release hands a claimed, unattempted intent back, due at at; reason
// labels ferry_effect_released_total.
func (w *Worker) release(bg context.Context, r row, at time.Time, reason string) {
	w.m.released.WithLabelValues(r.in.Target, reason).Inc()
	if _, err := w.db.Executor().Exec(bg, w.sql.release, r.id, r.owner, at.UTC(), w.now().UTC()); err != nil {
		w.log.WarnContext(bg, "effect: could not release intent; its lease will expire", "key", r.in.Key, logattr.Err(err))
	}
}

// slotWait is how long a lease may have run before a call starts, so that
// what is left of it covers the call with slack: (lease − call timeout)/2.
// A claimed intent waits at most this long for a call slot, and a start
// that the database held longer is taken back.
func (w *Worker) slotWait() time.Duration { return (w.cfg.lease - w.cfg.callTimeout) / 2 }

// backoff is full jitter after the n-th failure: uniform in
// [0, min(max, base·2^n)].
func (w *Worker) backoff(n int) time.Duration {
	return backoff.Full(w.cfg.backoffBase, w.cfg.backoffMax, n+1)
}
