package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/ident"
)

// DeadPolicy says what a dead row does to the later events of its aggregate.
type DeadPolicy string

const (
	// DeadHold (the default) holds the aggregate's later events until an
	// operator resolves the dead row: publishing them would break G3 for
	// every consumer of that aggregate.
	DeadHold DeadPolicy = "hold"
	// DeadSkip publishes the later events anyway; consumers see a gap
	// (which their cursor parks) instead of a stalled aggregate.
	DeadSkip DeadPolicy = "skip"
)

// Defaults.
const (
	DefaultBatchSize    = 2000
	DefaultPollInterval = 500 * time.Millisecond
	DefaultWorkers      = 4
	DefaultLeaseTTL     = 10 * time.Second
	DefaultBackoffBase  = 500 * time.Millisecond
	DefaultBackoffMax   = 5 * time.Minute
	DefaultMaxAttempts  = 25
	DefaultProbeBase    = 200 * time.Millisecond
	DefaultProbeMax     = 10 * time.Second
	// DefaultPartitionMaintenance: how often a relay creates the
	// partitions of a partitioned outbox ahead (see WithPartitionMaintenance).
	DefaultPartitionMaintenance = 10 * time.Minute
	// DefaultPublishTimeout bounds one batch's publish (all acks).
	DefaultPublishTimeout = 30 * time.Second
	// DefaultMaxBatchBytes bounds the payload bytes of one batch (see
	// WithMaxBatchBytes): 2,000 events at the writer's default payload
	// limit of 256 KiB would be 500 MiB per batch.
	DefaultMaxBatchBytes = 16 << 20
	// MaxMaxBatchBytes bounds WithMaxBatchBytes.
	MaxMaxBatchBytes = 1 << 30
	// MaxBatchSize bounds WithBatchSize (and WithPublishRate's burst,
	// WithTenantShare's n).
	MaxBatchSize = 10000
	// MaxShardPipeline bounds WithShardPipeline.
	MaxShardPipeline = 8
	// MaxPublishRate bounds WithPublishRate's events per second.
	MaxPublishRate = 1e7
)

// Faults are hooks that let a test or `ferry prove` stop the relay at the
// dangerous points of its cycle. A hook that returns an error simulates a
// crash there: Run returns an error wrapping [ErrFaultInjected] and the
// error, without marking the batch and without releasing its leases (a
// crashed process releases nothing). Nil hooks cost one nil check.
type Faults struct {
	// BeforePublish runs after a batch was claimed, before it is published.
	BeforePublish func(ctx context.Context, events []ferry.Event) error
	// AfterPublishBeforeMark runs after the broker acknowledged (or failed)
	// a batch and before any outbox row is marked: the window in which a
	// crash turns into a duplicate publish after restart.
	AfterPublishBeforeMark func(ctx context.Context, events []ferry.Event, results []broker.Result) error
}

// Option configures a Relay.
type Option func(*config)

type config struct {
	tables         ferry.Tables
	shards         int
	instance       string
	batch          int
	batchBytes     int // WithMaxBatchBytes
	poll           time.Duration
	ttl            time.Duration
	backoffBase    time.Duration
	backoffMax     time.Duration
	probeBase      time.Duration
	probeMax       time.Duration
	publishTimeout time.Duration
	maxAttempts    int
	deadPolicy     DeadPolicy
	listenPool     *pgxpool.Pool
	listenChannel  string
	logger         *slog.Logger
	registerer     prometheus.Registerer
	faults         Faults
	syncMarks      bool
	sentWatermark  bool // WithSentWatermark
	workers        int
	shardPipeline  int // WithShardPipeline: batches of one shard in flight at once
	tracer         trace.Tracer
	clock          func() time.Time // WithClock; nil: time.Now
	publishRate    float64          // WithPublishRate: events/s, 0 = unlimited
	publishBurst   int
	tenantShare    int           // WithTenantShare: rows per tenant per shard per claim, 0 = off
	partitionEvery time.Duration // WithPartitionMaintenance

	// Test hooks (unexported; only this package's tests set them).
	noFence         bool         // negative control: drop the fence from marks
	beforeLeaseTick func()       // may block to simulate a paused process
	afterMark       func(string) // called after each mark statement, with its kind
	noAggregateStop bool         // negative control: mark later rows of a failed aggregate anyway
	noBreaker       bool         // negative control: charge attempts even when the broker is down
	noSnapshotWait  bool         // negative control: the watermark passes rows without waiting for open transactions
	xipOnlyWait     bool         // negative control: wait only for the claim snapshot's xip (misses transactions at or above its xmax)
	noRetryWait     bool         // negative control: a retry row above the watermark is marked sent on its ack
	advanceFirst    bool         // negative control: the watermark passes a batch before it is published
	noMarkOrder     bool         // negative control: a pipelined batch marks without waiting for the aggregate's earlier batch
	noPublishOrder  bool         // negative control: a pipelined batch publishes without waiting for the aggregate's earlier batch
	noClaimLock     bool         // negative control: two claims of one shard may run at once
}

// WithClock sets the clock the relay reads for its local estimate of when
// its leases lapse without renewal (the lease rows themselves expire by
// the database's clock on Postgres and MySQL). For tests and `ferry prove`
// that run a relay with a skewed or jumping clock; nil means time.Now.
func WithClock(now func() time.Time) Option { return func(c *config) { c.clock = now } }

// now reads the configured clock.
func (c *config) now() time.Time {
	if c.clock != nil {
		return c.clock()
	}
	return time.Now()
}

// WithTables sets the schema and table prefix (default: search_path, "ferry_").
func WithTables(t ferry.Tables) Option { return func(c *config) { c.tables = t } }

// WithTracerProvider sets where the relay's spans go (default: the global
// OpenTelemetry provider, a no-op unless the application installs one).
// Each publish is a producer span named by the OpenTelemetry messaging
// conventions ("send {topic}", or "send" for a batch to several topics, with
// messaging.system, messaging.destination.name, messaging.operation.type
// and messaging.batch.message_count), linked to the trace context every
// event carries in its traceparent, so a trace shows command → publish →
// apply.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracer = tp.Tracer(tracerName) }
}

const tracerName = "github.com/ferryhq/ferry/relay"

// WithShardCount sets N (default ferry.DefaultShardCount). It must equal the
// writers' N: the relay refuses to start when unsent rows carry another.
func WithShardCount(n int) Option { return func(c *config) { c.shards = n } }

// WithInstanceID names this relay in the lease table and in logs (default
// hostname-pid-random). Ids must be unique among live relays; a restarted
// relay that reuses its id adopts its own leases at once (with a new fence)
// instead of waiting for them to expire.
func WithInstanceID(id string) Option { return func(c *config) { c.instance = id } }

// WithBatchSize sets how many rows one cycle claims and publishes (default
// 2000, at most MaxBatchSize). Larger batches amortise round trips (drain
// rate by batch size: docs/RELAY.md) at the cost of memory (up to workers ×
// batch events in flight) and a larger window of duplicates after a crash.
func WithBatchSize(n int) Option { return func(c *config) { c.batch = n } }

// WithMaxBatchBytes bounds the payload bytes one batch holds, so the
// events in flight stay within a memory budget whatever their sizes:
// about workers × n payload bytes (the broker client holds an encoded copy
// of each while it waits for the ack). The budget is split evenly over
// the shards a claim reads; a shard's rows are taken in id order until
// the next would pass its share, and always at least one, so a batch
// holds at most n bytes plus one event per shard larger than its share.
// The rows left out stay due: they are claimed by the next cycle, which
// starts at once. Default DefaultMaxBatchBytes; at most MaxMaxBatchBytes.
func WithMaxBatchBytes(n int) Option { return func(c *config) { c.batchBytes = n } }

// WithPollInterval sets how often the relay looks for work when nothing
// woke it (default 500ms). With NOTIFY or Notify it is only the fallback.
func WithPollInterval(d time.Duration) Option { return func(c *config) { c.poll = d } }

// WithLeaseTTL sets how long a shard lease lasts without renewal (default
// 10s); renewal runs every TTL/3. It is the upper bound on how long a
// crashed relay's shards stay unpublished, and must exceed the longest
// pause (GC, network) a healthy relay may suffer, or shards flap.
func WithLeaseTTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// WithBackoff sets the retry delay of a failed row: a uniformly random
// delay in [0, min(max, base·2^(attempts-1))] ("full jitter"), so rows that
// failed together do not retry together.
func WithBackoff(base, max time.Duration) Option {
	return func(c *config) { c.backoffBase, c.backoffMax = base, max }
}

// WithProbe sets the circuit breaker's probe interval while the broker is
// down: it starts at base and doubles up to max (default 200ms..10s). Only
// Ping is called while the breaker is open, so an outage costs one broker
// call per interval, whatever the backlog.
func WithProbe(base, max time.Duration) Option {
	return func(c *config) { c.probeBase, c.probeMax = base, max }
}

// WithPublishTimeout bounds one batch's Publish call, acks included
// (default 30s). Keep it below the lease TTL's order of magnitude: a batch
// still in flight when the lease is lost is marked by nobody and
// republished by the new owner.
func WithPublishTimeout(d time.Duration) Option { return func(c *config) { c.publishTimeout = d } }

// WithMaxAttempts sets after how many failed attempts a row goes dead
// (default 25). Attempts are never counted while the breaker is open.
func WithMaxAttempts(n int) Option { return func(c *config) { c.maxAttempts = n } }

// WithDeadPolicy sets what a dead row does to its aggregate (default DeadHold).
func WithDeadPolicy(p DeadPolicy) Option { return func(c *config) { c.deadPolicy = p } }

// WithListener makes the relay LISTEN on channel over a dedicated
// connection taken from pool (Postgres), waking at each producer commit
// that used outbox.WithNotify(channel). The connection is re-established
// when lost; polling covers the gap.
func WithListener(pool *pgxpool.Pool, channel string) Option {
	return func(c *config) { c.listenPool, c.listenChannel = pool, channel }
}

// WithLogger sets the logger. Without it (or with nil) the relay logs to
// slog.Default() as it is when New runs, like every Ferry component; pass
// slog.New(slog.DiscardHandler) to silence it. Logs carry event ids,
// aggregates, attempts and the instance id, never payloads or secrets;
// each line is written with the context of its work (a batch's outcome
// with its "send" span's), so a handler can attach trace ids.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the relay's metrics (see docs/RELAY.md) on r.
// Without it metrics are kept but not exported. Two relays in one process
// need two registries (or prometheus.WrapRegistererWith).
func WithRegisterer(r prometheus.Registerer) Option { return func(c *config) { c.registerer = r } }

// WithWorkers sets how many claim-publish-mark loops may run concurrently
// while draining a backlog (default 4), so one batch's database round
// trips overlap another's broker round trips. A quiet relay uses one. A
// shard is in at most one batch at a time, so per-aggregate order is
// unaffected (an aggregate lives in one shard). Each worker holds a
// database connection; New warns when the pool (driver.PoolSizer) has
// fewer than workers + 1.
func WithWorkers(n int) Option { return func(c *config) { c.workers = n } }

// WithShardPipeline lets up to depth batches of one shard be in flight at
// once (default 1; Postgres, status design): while a shard's batch waits
// for its acks, another worker claims the shard's next rows. A shard has
// one claim running at a time and a pipelined claim leaves the rows in
// flight out; a row whose aggregate had earlier rows in flight is
// published only after that batch's publish got them all acked, and
// marked only after that batch marked them all sent — else it stays
// pending, untouched, and goes out again after them — so a later event
// is neither stored ahead of an earlier one by the pipeline nor marked
// sent while an earlier one is unacked (pipeline.go). It pays where a shard's round trips, not CPU, are the limit; see
// docs/PERFORMANCE.md. Memory stays bounded by workers ×
// WithMaxBatchBytes: each batch is one worker's.
func WithShardPipeline(depth int) Option { return func(c *config) { c.shardPipeline = depth } }

// WithSynchronousMarks makes the relay's row updates wait for the WAL
// flush like any commit (Postgres). By default they commit asynchronously:
// losing a mark in a database crash only republishes the row under the
// same event id (a duplicate, which at-least-once delivery allows), and
// it saves a flush per batch.
func WithSynchronousMarks() Option { return func(c *config) { c.syncMarks = true } }

// WithSentWatermark keeps the relay's state out of the event row
// (Postgres, migration 0012): an event the broker acked is not updated;
// each shard's lease row carries a "sent up to" id instead, moved once per
// shard per batch, and only rows that failed (or were held) are written,
// as 'retry'. Marking sent is two thirds of a cycle in the status design;
// see docs/PERFORMANCE.md for what this saves and the argument that it
// keeps G2 and G3 (watermark.go). Every relay of the deployment must use
// it: a relay refuses to start beside live relays of the other design, or
// in the status design once the watermark is in use.
//
// Readers of the outbox must read a row's state through the watermark
// (internal/outboxstate); see the README's upgrade notes for which Ferry
// commands do.
func WithSentWatermark() Option { return func(c *config) { c.sentWatermark = true } }

// WithPublishRate caps how fast this relay publishes: at most
// eventsPerSecond events per second on average, in bursts of at most burst
// events, across all its workers and shards (a relay has one broker). A
// batch waits for its tokens after it is claimed and before it is
// published; while it waits the relay keeps renewing its leases, and a
// batch whose shard lease was lost meanwhile (or whose relay is stopping)
// is not published: its rows stay pending for the owner. Claims shrink to
// at most burst rows, so no batch waits for more tokens than one burst.
// 0 (the default) means unlimited. See docs/RELAY.md, "Rate and fairness".
func WithPublishRate(eventsPerSecond float64, burst int) Option {
	return func(c *config) { c.publishRate, c.publishBurst = eventsPerSecond, burst }
}

// WithTenantShare makes a claim take at most n rows per tenant from each
// shard, so one tenant's burst cannot fill every batch while another
// tenant's events wait behind it: each tenant with due rows gets up to n
// rows of every batch, in id order (per aggregate order is unchanged: an
// aggregate belongs to one tenant and its claimed rows stay a consecutive
// prefix). The claim then reads every due row of the shard to rank them
// (a window function), which costs more per claim on a deep backlog
// (figures: docs/PERFORMANCE.md). 0 (the default) is off: rows are
// claimed in id order whatever their tenant.
func WithTenantShare(n int) Option { return func(c *config) { c.tenantShare = n } }

// WithPartitionMaintenance sets how often the relay makes sure the
// partitions of a partitioned outbox (migrate.WithPartitionedOutbox)
// exist ahead of the producers' writes (default
// DefaultPartitionMaintenance; it also runs when the relay starts). On a
// plain outbox it does nothing. Every relay of a deployment runs it;
// creating a partition is idempotent.
func WithPartitionMaintenance(every time.Duration) Option {
	return func(c *config) { c.partitionEvery = every }
}

// WithFaults installs fault hooks (tests, `ferry prove`).
func WithFaults(f Faults) Option { return func(c *config) { c.faults = f } }

func defaultConfig() config {
	return config{
		shards:         ferry.DefaultShardCount,
		batch:          DefaultBatchSize,
		batchBytes:     DefaultMaxBatchBytes,
		poll:           DefaultPollInterval,
		ttl:            DefaultLeaseTTL,
		backoffBase:    DefaultBackoffBase,
		backoffMax:     DefaultBackoffMax,
		probeBase:      DefaultProbeBase,
		probeMax:       DefaultProbeMax,
		publishTimeout: DefaultPublishTimeout,
		maxAttempts:    DefaultMaxAttempts,
		deadPolicy:     DeadHold,
		workers:        DefaultWorkers,
		shardPipeline:  1,
		partitionEvery: DefaultPartitionMaintenance,
	}
}

// queryOpts are the query switches of c; discarded and partitioned are
// what Run finds in the schema (New renders without them).
func (c *config) queryOpts(discarded, partitioned bool) queryOpts {
	return queryOpts{noFence: c.noFence, syncMarks: c.syncMarks, discarded: discarded, tenantShare: c.tenantShare,
		partitioned: partitioned, pipeline: c.shardPipeline > 1, watermark: c.sentWatermark,
		noSnapshotWait: c.noSnapshotWait, xipOnlyWait: c.xipOnlyWait}
}

// CheckOptions validates opts as New would, without a database or a
// broker: a command can refuse a bad setting before it connects to
// anything. The error is a *ferry.ConfigError naming the option's field.
func CheckOptions(opts ...Option) error {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	return cfg.check()
}

func (c *config) check() error {
	if err := c.tables.Check(); err != nil {
		return err
	}
	bad := func(field, reason string, args ...any) error {
		return &ferry.ConfigError{Field: field, Reason: fmt.Sprintf(reason, args...)}
	}
	switch {
	case c.shards < 1 || c.shards > ferry.MaxShardCount:
		return bad("shard_count", "must be in 1..%d, got %d", ferry.MaxShardCount, c.shards)
	case c.batch < 1 || c.batch > MaxBatchSize:
		return bad("batch_size", "must be in 1..%d, got %d", MaxBatchSize, c.batch)
	case c.batchBytes < 1 || c.batchBytes > MaxMaxBatchBytes:
		return bad("max_batch_bytes", "must be in 1..%d, got %d", MaxMaxBatchBytes, c.batchBytes)
	case c.poll < 5*time.Millisecond:
		return bad("poll_interval", "must be at least 5ms, got %s", c.poll)
	case c.ttl < 300*time.Millisecond:
		return bad("lease_ttl", "must be at least 300ms, got %s", c.ttl)
	case c.backoffBase <= 0 || c.backoffMax < c.backoffBase:
		return bad("backoff", "need 0 < base <= max, got base %s max %s", c.backoffBase, c.backoffMax)
	case c.probeBase <= 0 || c.probeMax < c.probeBase:
		return bad("probe", "need 0 < base <= max, got base %s max %s", c.probeBase, c.probeMax)
	case c.publishTimeout <= 0:
		return bad("publish_timeout", "must be positive, got %s", c.publishTimeout)
	case c.maxAttempts < 1:
		return bad("max_attempts", "must be at least 1, got %d", c.maxAttempts)
	case c.deadPolicy != DeadHold && c.deadPolicy != DeadSkip:
		return bad("dead_policy", "must be %q or %q, got %q", DeadHold, DeadSkip, c.deadPolicy)
	case c.workers < 1 || c.workers > 64:
		return bad("workers", "must be in 1..64, got %d", c.workers)
	case c.shardPipeline < 1 || c.shardPipeline > MaxShardPipeline:
		return bad("shard_pipeline", "must be in 1..%d (1 = one batch per shard), got %d", MaxShardPipeline, c.shardPipeline)
	case c.shardPipeline > 1 && c.sentWatermark:
		return bad("shard_pipeline", "needs the status design: the watermark design keeps one batch per shard (its advance passes a shard's rows in claim order), got %d with sent_watermark", c.shardPipeline)
	case c.publishRate < 0 || c.publishRate > MaxPublishRate || c.publishRate != c.publishRate:
		return bad("publish_rate", "must be in 0..%g events/s (0 = unlimited), got %g", float64(MaxPublishRate), c.publishRate)
	case c.publishRate > 0 && (c.publishBurst < 1 || c.publishBurst > MaxBatchSize):
		return bad("publish_burst", "must be in 1..%d with a publish rate, got %d", MaxBatchSize, c.publishBurst)
	case c.publishRate == 0 && c.publishBurst != 0:
		return bad("publish_burst", "needs a publish rate > 0, got burst %d with rate 0", c.publishBurst)
	case c.tenantShare < 0 || c.tenantShare > MaxBatchSize:
		return bad("tenant_share", "must be in 0..%d (0 = off), got %d", MaxBatchSize, c.tenantShare)
	case c.partitionEvery < 100*time.Millisecond:
		return bad("partition_maintenance", "must be at least 100ms, got %s", c.partitionEvery)
	case len(c.instance) > 200:
		return bad("instance_id", "must be at most 200 bytes, got %d", len(c.instance))
	}
	if c.listenChannel != "" || c.listenPool != nil {
		if c.listenPool == nil {
			return bad("listener", "pool is nil")
		}
		if !ident.Valid(c.listenChannel, ident.MaxChannel) {
			return bad("listener", "channel must match [a-z_][a-z0-9_]* and be at most 63 bytes")
		}
	}
	return nil
}

// checkPool warns when db's pool cap (driver.PoolSizer) is below what the
// relay needs: one connection per worker, one for the lease loop and, when
// the LISTEN connection comes from the same pool (WithListener with db's
// own pool), the one it holds for good.
func checkPool(log *slog.Logger, db DB, c *config) {
	maxConns, ok := driver.MaxConns(db)
	if !ok || db.Dialect() == driver.SQLite {
		return
	}
	need, what := c.workers+1, "the lease loop"
	if p, ok := db.(interface{ Pool() *pgxpool.Pool }); ok && c.listenPool != nil && p.Pool() == c.listenPool {
		need, what = need+1, "the lease loop + the LISTEN connection"
	}
	if maxConns >= need {
		return
	}
	log.Warn(fmt.Sprintf("relay: database pool max conns %d < %d (relay workers %d + %s): workers wait for connections and leases renew late; set pool_max_conns>=%d (pgxpool) or SetMaxOpenConns(%d) (database/sql), or WithWorkers(%d)",
		maxConns, need, c.workers, what, need, need, max(1, maxConns-(need-c.workers))),
		"pool_max_conns", maxConns, "workers", c.workers, "need", need)
}

func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "relay"
	}
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
}
