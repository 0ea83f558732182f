package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/time/rate"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/partition"
)

// DB is what the relay needs from a store: the dialect, statements on the
// pool, and transactions. *pgxv5.Driver, *databasesql.Driver and the CLI's
// store all satisfy it.
type DB interface {
	Dialect() driver.Dialect
	Executor() driver.Executor
	Begin(ctx context.Context) (driver.Tx, error)
}

// Sentinel errors callers branch on.
var (
	// ErrShardCountMismatch: unsent rows were written with another shard
	// count than the relay's; see *ShardCountError.
	ErrShardCountMismatch = errors.New("relay: shard count mismatch")
	// ErrFaultInjected: a Faults hook returned an error and the relay
	// stopped as if it had crashed there.
	ErrFaultInjected = errors.New("relay: fault injected")
	// ErrRunning: Run was called on a relay that is already running.
	ErrRunning = errors.New("relay: already running")
)

// ShardCountError names both shard counts. Changing N needs a drain first,
// like repartitioning Kafka: every row a relay could still publish under
// the old N — pending rows, and dead letters that are not discarded (`ferry
// dlq retry` makes them pending again) — must be sent or discarded. Sent
// rows and discarded dead letters do not count.
type ShardCountError struct {
	Configured int   // the relay's N
	Found      int   // the N unsent rows (or a live relay) carry
	Rows       int64 // Pending + Dead (0: a live relay uses Found)
	Pending    int64 // pending rows written with Found
	Dead       int64 // dead letters written with Found and not discarded
}

func (e *ShardCountError) Error() string {
	if e.Rows == 0 {
		return fmt.Sprintf("relay: shard count mismatch: this relay is configured with %d shards but a live relay uses %d", e.Configured, e.Found)
	}
	msg := fmt.Sprintf("relay: shard count mismatch: this relay is configured with %d shards but %d outbox rows a relay can still publish were written with %d (%d pending, %d dead letters not discarded); "+
		"before changing the shard count", e.Configured, e.Rows, e.Found, e.Pending, e.Dead)
	var steps []string
	if e.Pending > 0 {
		steps = append(steps, fmt.Sprintf("run the relay with the old count (`ferry relay --shards %d`, writers still on %d) until the %d pending rows are sent (`ferry status` shows pending 0)",
			e.Found, e.Found, e.Pending))
	}
	if e.Dead > 0 {
		steps = append(steps, fmt.Sprintf("resolve the %d dead letters (`ferry dlq list`): `ferry dlq discard --approve --reason \"…\"` them, or `ferry dlq retry --approve --reason \"…\"` them while a relay with --shards %d runs",
			e.Dead, e.Found))
	}
	return msg + " " + strings.Join(steps, ", and ") + "; sent rows and discarded dead letters do not count"
}

// Is reports ErrShardCountMismatch.
func (e *ShardCountError) Is(target error) bool { return target == ErrShardCountMismatch }

// BreakerState is the circuit breaker's state.
type BreakerState int

// Breaker states.
const (
	BreakerClosed BreakerState = iota // publishing normally
	BreakerOpen                       // broker unreachable: only probes are sent
)

func (s BreakerState) String() string {
	if s == BreakerOpen {
		return "open"
	}
	return "closed"
}

// Status is a snapshot for health and readiness checks.
type Status struct {
	Instance      string
	ShardCount    int
	OwnedShards   []int // sorted
	LiveInstances int   // relays with a live heartbeat, this one included
	Breaker       BreakerState
	Running       bool
	// Counters since start.
	Published   uint64
	Duplicates  uint64
	Retries     uint64
	Dead        uint64
	Fenced      uint64 // row updates rejected by the fence (lease lost)
	PublishCall uint64 // Publisher.Publish calls
	PingCalls   uint64 // Publisher.Ping calls
	// Pipelined counts batches claimed while another batch of one of
	// their shards was in flight (WithShardPipeline).
	Pipelined uint64
	// MissingDestinations are the event topics the broker reported missing
	// (broker.ErrDestinationMissing) on their latest publish, sorted; their
	// rows are held until the destination exists.
	MissingDestinations []string
}

// Ready reports whether the relay is doing its share: it owns at least one
// shard (or there are more relays than shards, so owning none is fair) and
// the breaker is closed.
func (s Status) Ready() bool {
	if !s.Running || s.Breaker != BreakerClosed {
		return false
	}
	return len(s.OwnedShards) > 0 || s.LiveInstances > s.ShardCount
}

// Relay publishes committed outbox rows. Create it with New and start it
// with Run; it is safe to call Notify and Status from any goroutine.
type Relay struct {
	db   DB
	pub  broker.Publisher
	cfg  config
	q    *queries
	log  *slog.Logger
	m    *metrics
	wake []chan struct{} // one per worker

	limiter *rate.Limiter // WithPublishRate; nil: unlimited

	running atomic.Bool

	mu         sync.Mutex
	owned      map[int]int64 // shard → fence
	validUntil time.Time     // local estimate of when the owned leases lapse without renewal
	live       int
	breaker    BreakerState

	// inflight counts, per shard, the worker cycles that claimed from it
	// and have not finished marking; releasing lists shards given up for
	// rebalancing, no longer claimed from, whose lease row is released
	// once nothing of theirs is in flight (so a rebalance strands no batch).
	inflight   map[int]int
	releasing  map[int]bool
	rotate     uint64      // takeIdle's rotating offset (under mu)
	crashed    atomic.Bool // a fault hook fired: no worker marks anything more
	probeOwner atomic.Bool // held by the worker probing the open breaker
	missing    missingDests
	// unavailable: destinations whose every publish of a batch failed
	// transiently while the broker answered (worker.go, holdUnavailable).
	unavailable missingDests
	accepted    acceptedDests
	wm          map[int]*shardWM // WithSentWatermark: acked rows above the watermark (under mu)
	flight      *flights         // WithShardPipeline > 1: what is in flight per shard (under mu); nil otherwise
	// rowBytes: the mean payload bytes of the last claim's rows, which
	// sizes the next claim's per-shard LIMIT to WithMaxBatchBytes.
	rowBytes atomic.Int64

	published, duplicates, retries, dead, fenced, publishCalls, pingCalls, pipelined atomic.Uint64
}

// New validates the configuration and returns a relay over db publishing
// through pub. It touches neither the database nor the broker; Run does.
// The caller keeps owning db and pub: the relay never closes them.
func New(db DB, pub broker.Publisher, opts ...Option) (*Relay, error) {
	if db == nil {
		return nil, &ferry.ConfigError{Field: "db", Reason: "is nil"}
	}
	if pub == nil {
		return nil, &ferry.ConfigError{Field: "publisher", Reason: "is nil"}
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.listenPool != nil && db.Dialect() != driver.Postgres {
		return nil, &ferry.ConfigError{Field: "listener", Reason: "LISTEN/NOTIFY needs Postgres; call Relay.Notify after commit instead"}
	}
	if db.Dialect() == driver.SQLite && cfg.tables.Schema != "" {
		return nil, &ferry.ConfigError{Field: "tables.schema", Reason: "must be empty on SQLite"}
	}
	if cfg.instance == "" {
		cfg.instance = defaultInstanceID()
	}
	if cfg.tracer == nil {
		cfg.tracer = otel.GetTracerProvider().Tracer(tracerName)
	}
	cfg.logger = logattr.OrDefault(cfg.logger)
	if cfg.sentWatermark && db.Dialect() != driver.Postgres {
		return nil, &ferry.ConfigError{Field: "sent_watermark", Reason: fmt.Sprintf("needs Postgres (got %s)", db.Dialect())}
	}
	if cfg.shardPipeline > 1 && db.Dialect() != driver.Postgres {
		return nil, &ferry.ConfigError{Field: "shard_pipeline", Reason: fmt.Sprintf("needs Postgres (got %s); use 1", db.Dialect())}
	}
	q, err := newQueries(db.Dialect(), cfg.tables, cfg.deadPolicy, cfg.queryOpts(false, false))
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.registerer)
	if err != nil {
		return nil, err
	}
	r := &Relay{
		db: db, pub: pub, cfg: cfg, q: q, m: m,
		log:   cfg.logger.With("relay_instance", cfg.instance),
		owned: map[int]int64{}, inflight: map[int]int{}, releasing: map[int]bool{},
		limiter: newPublishLimiter(&cfg),
	}
	if cfg.shardPipeline > 1 {
		r.flight = newFlights()
	}
	for range cfg.workers {
		r.wake = append(r.wake, make(chan struct{}, 1))
	}
	checkPool(r.log, db, &cfg)
	return r, nil
}

// Notify wakes the relay to look for work now. Call it after committing
// outbox rows when there is no LISTEN/NOTIFY (SQLite, embedded). It never
// blocks; calls while a wake-up is pending are folded into it.
//
// It wakes one worker, which claims from every idle shard in one query;
// the others join only when that claim shows a backlog. Waking all of them
// at every commit would cost one claim query per worker per commit.
func (r *Relay) Notify() { r.wakeWorker(0) }

func (r *Relay) wakeWorker(w int) {
	select {
	case r.wake[w] <- struct{}{}:
	default:
	}
}

// wakeHelpers wakes the workers other than the first, to drain a backlog.
func (r *Relay) wakeHelpers() {
	for w := 1; w < len(r.wake); w++ {
		r.wakeWorker(w)
	}
}

// wakeAll wakes every worker (WithShardPipeline: a shard's next batch
// may be claimed while its last is in flight).
func (r *Relay) wakeAll() {
	for w := range r.wake {
		r.wakeWorker(w)
	}
}

// InstanceID returns the id this relay holds leases under.
func (r *Relay) InstanceID() string { return r.cfg.instance }

// Status returns a snapshot of the relay's state.
func (r *Relay) Status() Status {
	r.mu.Lock()
	owned := make([]int, 0, len(r.owned))
	for s := range r.owned {
		owned = append(owned, s)
	}
	live, br := r.live, r.breaker
	r.mu.Unlock()
	sort.Ints(owned)
	return Status{
		Instance: r.cfg.instance, ShardCount: r.cfg.shards, OwnedShards: owned, LiveInstances: live, Breaker: br,
		Running:   r.running.Load(),
		Published: r.published.Load(), Duplicates: r.duplicates.Load(), Retries: r.retries.Load(), Dead: r.dead.Load(),
		Fenced: r.fenced.Load(), PublishCall: r.publishCalls.Load(), PingCalls: r.pingCalls.Load(), Pipelined: r.pipelined.Load(),
		MissingDestinations: r.refreshMissing(),
	}
}

// Run publishes until ctx is cancelled, then finishes the batch in flight,
// releases its leases and returns nil. It returns an error when it cannot
// start (shard count mismatch, missing tables, database unreachable) or
// when a fault hook fired (wrapping ErrFaultInjected; leases are then kept,
// as after a crash). Once started, database and broker errors do not end
// Run: they are logged and retried (the broker behind the circuit
// breaker); if lease renewals fail for a whole TTL the relay stops
// claiming until they succeed again. Run may be called again after it
// returned.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	if err := r.start(ctx); err != nil {
		return err
	}

	inner, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var workerErr error
	for w := range r.cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.work(inner, w); err != nil {
				errMu.Lock()
				workerErr = errors.Join(workerErr, err)
				errMu.Unlock()
				cancel(err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.leaseLoop(inner)
	}()
	if r.cfg.listenPool != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(inner)
		}()
	}
	if r.q.partitioned {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.partitions().Maintain(inner, r.cfg.partitionEvery)
		}()
	}
	wg.Wait()

	r.mu.Lock()
	r.owned = map[int]int64{}
	r.releasing = map[int]bool{}
	r.wm = nil
	r.mu.Unlock()
	r.crashed.Store(false)
	if errors.Is(workerErr, ErrFaultInjected) {
		r.log.WarnContext(ctx, "relay stopped by fault hook; leases kept as after a crash", logattr.Err(workerErr))
		return workerErr
	}
	// Graceful: hand the shards over now instead of after the TTL.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	exec := r.db.Executor()
	_, err1 := exec.Exec(rctx, r.q.releaseAll, r.cfg.instance)
	_, err2 := exec.Exec(rctx, r.q.deleteSelf, r.cfg.instance)
	if err := errors.Join(err1, err2); err != nil {
		r.log.WarnContext(ctx, "release leases at shutdown failed; they expire after the TTL", logattr.Err(err))
	} else {
		r.log.InfoContext(ctx, "relay stopped; leases released")
	}
	return workerErr
}

// start checks the schema and shard count, creates the lease rows and
// takes the first leases, so Run fails fast on misconfiguration.
func (r *Relay) start(ctx context.Context) error {
	exec := r.db.Executor()
	// With ops' migration applied, a discarded dead row releases its hold.
	var cols int64
	rows, err := exec.Query(ctx, r.q.hasDiscarded)
	if err != nil {
		return fmt.Errorf("relay: inspect outbox columns: %w", err)
	}
	for rows.Next() {
		err = rows.Scan(&cols)
	}
	if err == nil {
		err = rows.Err()
	}
	rows.Close()
	if err != nil {
		return fmt.Errorf("relay: inspect outbox columns: %w", err)
	}
	parted, err := partition.IsPartitioned(ctx, exec, r.cfg.tables, partition.Outbox)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if q, err := newQueries(r.db.Dialect(), r.cfg.tables, r.cfg.deadPolicy, r.cfg.queryOpts(cols > 0, parted)); err == nil {
		r.q = q
	}
	if err := r.checkStateDesign(ctx); err != nil {
		return err
	}
	if parted {
		// Before the first claim: producers must never find no partition.
		if err := r.partitions().Start(ctx); err != nil {
			return fmt.Errorf("relay: %w", err)
		}
	}
	rows, err = exec.Query(ctx, r.q.checkShards, r.cfg.shards)
	if err != nil {
		return fmt.Errorf("relay: check shard count (did `ferry migrate up` run?): %w", err)
	}
	var found int
	var pending, dead int64
	if rows.Next() {
		err = rows.Scan(&found, &pending, &dead)
	}
	if err == nil {
		err = rows.Err()
	}
	rows.Close()
	if err != nil {
		return fmt.Errorf("relay: check shard count: %w", err)
	}
	if pending+dead > 0 {
		return &ShardCountError{Configured: r.cfg.shards, Found: found, Rows: pending + dead, Pending: pending, Dead: dead}
	}
	rows, err = exec.Query(ctx, r.q.otherShardCount, r.cfg.shards, r.cfg.instance)
	if err != nil {
		return fmt.Errorf("relay: check live relays: %w", err)
	}
	found = 0
	if rows.Next() {
		err = rows.Scan(&found)
	}
	if err == nil {
		err = rows.Err()
	}
	rows.Close()
	if err != nil {
		return fmt.Errorf("relay: check live relays: %w", err)
	}
	if found > 0 {
		return &ShardCountError{Configured: r.cfg.shards, Found: found}
	}
	// Relays starting together all run this upsert of the same rows; on
	// MySQL/MariaDB two of them can deadlock (each holds the shared lock
	// a duplicate key takes and waits to upgrade it: the project's CI saw
	// TestThreeRelays/mysql fail so).
	if tries, err := retryContended(ctx, func() error {
		_, err := exec.Exec(ctx, r.q.ensureLeases, r.cfg.shards)
		return err
	}); err != nil {
		if isContention(err) {
			return fmt.Errorf("relay: create lease rows: still contended after %d tries: %w", tries, err)
		}
		return fmt.Errorf("relay: create lease rows (did `ferry migrate up` run?): %w", err)
	}
	// A previous incarnation with our id crashed holding leases: adopt
	// them with a new fence rather than wait for them to expire.
	adopted, err := r.leaseRows(ctx, r.q.adopt, r.cfg.instance, r.cfg.ttl.Seconds(), r.cfg.shards)
	if err != nil {
		return fmt.Errorf("relay: adopt leases: %w", err)
	}
	r.mu.Lock()
	r.owned = adopted
	r.validUntil = r.cfg.now().Add(r.cfg.ttl)
	r.breaker = BreakerClosed
	r.mu.Unlock()
	r.m.setBreaker(BreakerClosed)
	// The first lease tick (heartbeat, renew, acquire) meets the same
	// contention from relays starting beside this one; later ticks retry
	// on their own schedule, this one would end the start.
	if tries, err := retryContended(ctx, func() error { return r.leaseTick(ctx) }); err != nil {
		if isContention(err) {
			return fmt.Errorf("%w (still contended after %d tries)", err, tries)
		}
		return err
	}
	r.log.InfoContext(ctx, "relay started", "shard_count", r.cfg.shards, "owned_shards", len(r.Status().OwnedShards), "batch_size", r.cfg.batch)
	return nil
}

// ownedSnapshot returns the owned shards (sorted) and their fences.
func (r *Relay) ownedSnapshot() ([]int, map[int]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.now().After(r.validUntil) {
		return nil, nil // renewals failed for a whole TTL: assume the leases are gone
	}
	shards := make([]int, 0, len(r.owned))
	fences := make(map[int]int64, len(r.owned))
	for s, f := range r.owned {
		shards = append(shards, s)
		fences[s] = f
	}
	sort.Ints(shards)
	return shards, fences
}

// takeIdle picks owned shards that no other cycle has in flight — all of
// them when limit <= 0, else at most limit starting at a rotating offset —
// and counts them in flight, atomically with the choice: a shard is in at
// most one batch at a time (its rows stay pending until marked, so a
// second claim would publish them twice and could reorder them), and the
// lease loop never releases a shard between a snapshot and its claim. The
// caller calls doneShards when its cycle is over.
//
// With WithShardPipeline(depth > 1) a shard with fewer than depth batches
// in flight and no claim running may be picked too (idle shards first);
// the exclusion returned lists what the claim must leave out, and the
// caller calls flightStart once its claim is over (pipeline.go).
func (r *Relay) takeIdle(limit int) ([]int, map[int]int64, *exclusion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.now().After(r.validUntil) {
		return nil, nil, nil // renewals failed for a whole TTL: assume the leases are gone
	}
	all := make([]int, 0, len(r.owned))
	var busy []int
	for s := range r.owned {
		switch n := r.inflight[s]; {
		case n == 0:
			all = append(all, s)
		case r.flight != nil && n < r.cfg.shardPipeline && (!r.flight.claiming[s] || r.cfg.noClaimLock):
			busy = append(busy, s)
		}
	}
	sort.Ints(all)
	sort.Ints(busy)
	if limit > 0 && len(all) > limit {
		start := int(r.rotate % uint64(len(all)))
		r.rotate += uint64(limit)
		all = append(all[start:], all[:start]...)[:limit]
		sort.Ints(all)
	}
	if limit <= 0 || len(all) < limit {
		if n := len(busy); limit > 0 && n > limit-len(all) {
			busy = busy[:limit-len(all)]
		}
		all = append(all, busy...)
		sort.Ints(all)
	}
	fences := make(map[int]int64, len(all))
	for _, s := range all {
		fences[s] = r.owned[s]
		r.inflight[s]++
	}
	var excl *exclusion
	if r.flight != nil {
		excl = r.flight.begin(all)
	}
	return all, fences, excl
}

func (r *Relay) doneShards(shards []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range shards {
		if r.inflight[s]--; r.inflight[s] <= 0 {
			delete(r.inflight, s)
		}
	}
}

// setBreaker sets the breaker state and reports whether it changed.
func (r *Relay) setBreaker(s BreakerState) bool {
	r.mu.Lock()
	changed := r.breaker != s
	r.breaker = s
	r.mu.Unlock()
	r.m.setBreaker(s)
	if changed {
		r.log.Warn("circuit breaker " + s.String())
	}
	return changed
}

// sleep waits d or until ctx is done; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool { return backoff.Sleep(ctx, d) }

// partitions is the relay's keeper of a partitioned outbox's partitions.
func (r *Relay) partitions() partition.Keeper {
	return partition.Keeper{Exec: r.db.Executor(), Tables: r.cfg.tables, Table: partition.Outbox, Log: r.log}
}

// startContendedTries bounds retryContended.
const startContendedTries = 8

// isContention reports whether err is the database giving up on a lock:
// chosen as a deadlock victim or out of lock wait time (MySQL/MariaDB;
// InnoDB rolled the statement or transaction back). Retrying is the
// documented answer.
func isContention(err error) bool {
	return errors.Is(err, driver.ErrDeadlock) || errors.Is(err, driver.ErrLockTimeout)
}

// retryContended runs f, the start's writes to rows every starting relay
// writes, again while it fails with contention, up to startContendedTries
// tries with full-jitter backoff (10 ms..500 ms). It returns the tries made
// and f's last error.
func retryContended(ctx context.Context, f func() error) (int, error) {
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil || !isContention(err) || attempt >= startContendedTries ||
			!backoff.Sleep(ctx, backoff.Full(10*time.Millisecond, 500*time.Millisecond, attempt)) {
			return attempt, err
		}
	}
}
