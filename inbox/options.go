package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// Handler applies one event's effect inside tx, the consumer's transaction.
// The inbox claim and cursor advance are written in the same transaction,
// so the effect happens once or not at all. Returning an error rolls back
// everything (effect, claim, cursor) and the message is redelivered with
// backoff; wrap the error with [Permanent] when a retry cannot help, and
// the message is parked as poison instead.
//
// A handler must not commit or roll back tx, and should keep external side
// effects (HTTP, email) out of it: those belong in an effect ledger.
type Handler[TTx any] func(ctx context.Context, tx TTx, ev ferry.Event) error

// Authorizer decides whether ev may take effect, before the handler runs,
// in the same transaction (so it can read current state, e.g. "is the
// principal still a member of the tenant?"). Possession of a message
// grants nothing: the provenance is in ev.TenantID and ev.Headers
// (Principal, Action, Target). A non-nil error parks the message as
// unauthorized with the error text as the reason; it is not retried until
// an operator replays it.
type Authorizer[TTx any] func(ctx context.Context, tx TTx, ev ferry.Event) error

// SchemaKey names one event contract a consumer supports.
type SchemaKey struct {
	EventType     string
	SchemaVersion int
}

// StartPolicy says what the cursor expects for an aggregate it has never seen.
type StartPolicy int

const (
	// StartStrict expects sequence 1: a first event with a higher sequence
	// is a gap and is parked until its predecessors arrive or an operator
	// releases the gap. The default: nothing is silently skipped.
	StartStrict StartPolicy = iota
	// StartAtFirstSeen accepts whatever sequence comes first for an
	// aggregate and orders from there. Use it for a consumer started after
	// the producer had been running, whose broker retention no longer holds
	// the early events.
	StartAtFirstSeen
)

// Faults are crash points for proofs and tests (`ferry prove` uses them).
// A hook returning an error makes the runtime stop at that point without
// acking, as a crash would; Run returns a *[FaultError]. Nil hooks cost
// nothing.
type Faults struct {
	// BeforeCommit runs after the handler, before the commit: the
	// transaction is rolled back.
	BeforeCommit func(ev ferry.Event) error
	// AfterCommitBeforeAck runs after the commit, before the broker ack:
	// the effect is durable but the broker will redeliver.
	AfterCommitBeforeAck func(ev ferry.Event) error
}

type config struct {
	tables         ferry.Tables
	schemas        map[SchemaKey]bool
	contracts      ContractValidator
	opener         PayloadOpener // WithDecryption
	fetcher        PayloadOpener // WithClaimCheck
	authorize      any           // an Authorizer[TTx]; New checks its type
	ordering       bool
	start          StartPolicy
	workers        int
	queue          int
	batch          int
	batchLinger    time.Duration
	maxAttempts    int
	backoffBase    time.Duration
	backoffMax     time.Duration
	gapAlert       time.Duration
	healInterval   time.Duration
	drainTimeout   time.Duration
	partitionEvery time.Duration // WithPartitionMaintenance
	maxRawBytes    int
	limits         ferry.Limits
	logger         *slog.Logger
	registerer     prometheus.Registerer
	faults         Faults
	lag            func(ctx context.Context) (int64, error)
	now            func() time.Time
	tracer         trace.Tracer
	nonAtomicTest  bool // negative control: claim and effect in separate transactions
	// beforeResolveParked (tests) runs before a replayed parked row is
	// marked resolved, inside the transaction; an error fails the replay.
	beforeResolveParked func(ctx context.Context, tx driver.Tx) error
	// alwaysSavepoints skips the optimistic batch pass (benchmarks compare).
	alwaysSavepoints bool
}

// Option configures an Inbox. Options are not generic: only
// [WithAuthorizer] names the transaction type, and New checks that it
// matches the driver's.
type Option func(*config)

// WithTracerProvider sets where the inbox's spans go (default: the global
// OpenTelemetry provider, a no-op unless the application installs one). The
// handler runs inside a consumer span named by the OpenTelemetry messaging
// conventions ("process {destination}", with messaging.system,
// messaging.destination.name, messaging.operation.type, messaging.message.id
// = the event id and messaging.consumer.group.name = the consumer's name)
// whose parent is the trace context the event carries (its traceparent), so
// one trace shows command → publish → apply, and the handler's own spans
// nest in it.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracer = tp.Tracer(tracerName) }
}

const tracerName = "github.com/ferryhq/ferry/inbox"

// WithTables sets the schema and table prefix (default: search_path, "ferry_").
func WithTables(t ferry.Tables) Option {
	return func(c *config) { c.tables = t }
}

// WithSchemas declares the (event type, schema version) pairs the handler
// supports. Anything else is parked with reason schema — replayable after
// an upgrade, never dropped. Default: every event is accepted.
func WithSchemas(keys ...SchemaKey) Option {
	return func(c *config) {
		if c.schemas == nil {
			c.schemas = map[SchemaKey]bool{}
		}
		for _, k := range keys {
			c.schemas[k] = true
		}
	}
}

// WithAuthorizer installs the authorization hook run before every effect.
func WithAuthorizer[TTx any](a Authorizer[TTx]) Option {
	return func(c *config) { c.authorize = a }
}

// WithoutOrdering turns off the per-aggregate cursor: events are applied as
// they come and only deduplicated. For consumers whose effects commute
// (counters, projections keyed by event id).
func WithoutOrdering() Option {
	return func(c *config) { c.ordering = false }
}

// WithStartPolicy sets what the cursor expects for an unseen aggregate
// (default StartStrict).
func WithStartPolicy(p StartPolicy) Option {
	return func(c *config) { c.start = p }
}

// WithWorkers sets how many aggregates are applied in parallel (default 8).
// Each aggregate hashes to one worker, so its events stay serial. More
// workers than database connections only adds waiting: New logs a warning
// when the driver's pool (driver.PoolSizer) has fewer than workers + 1
// connections, and Run one when the consumer's broker window (natsjs max
// ack pending, RabbitMQ prefetch) does not fit the in-flight bound.
func WithWorkers(n int) Option {
	return func(c *config) { c.workers = n }
}

// WithQueue sets how many messages may wait per worker (default 64): the
// in-flight bound is workers × (queue + batch). When full, the consumer
// stops pulling (back-pressure) instead of buffering without limit.
func WithQueue(n int) Option {
	return func(c *config) { c.queue = n }
}

// WithBatch applies up to n queued messages of one worker in one
// transaction, with a savepoint per message so one failing message never
// rolls back its neighbours; all are acked after the commit. linger is how
// long a worker waits for more messages before committing a short batch
// (0: take what is queued). Default n = 1 (a transaction per message).
// Batching trades latency and a larger redelivery set on crash for
// throughput; it changes nothing about what is applied.
func WithBatch(n int, linger time.Duration) Option {
	return func(c *config) { c.batch, c.batchLinger = n, linger }
}

// WithMaxAttempts parks a message as poison once it has failed n times
// (default 5). The broker's delivery count is used when it reports one.
func WithMaxAttempts(n int) Option {
	return func(c *config) { c.maxAttempts = n }
}

// WithBackoff sets the redelivery delay after a handler error: base × 2^(attempt-1)
// with full jitter, capped at max (default 200ms, 30s).
func WithBackoff(base, max time.Duration) Option {
	return func(c *config) { c.backoffBase, c.backoffMax = base, max }
}

// WithGapAlert sets the age after which an open gap counts as overdue in
// ferry_inbox_gaps_overdue (default 5m). A gap that old usually means a
// lost or dead-lettered event upstream: release it or find the event.
func WithGapAlert(d time.Duration) Option {
	return func(c *config) { c.gapAlert = d }
}

// WithHealInterval sets how often Run looks for parked gap successors whose
// predecessor has been applied (default 5s; 0 turns the sweep off). The
// live path applies successors at once; the sweep covers the race where
// another instance parked a successor while this one filled the gap.
func WithHealInterval(d time.Duration) Option {
	return func(c *config) { c.healInterval = d }
}

// DefaultPartitionMaintenance: how often Run creates the partitions of a
// partitioned inbox ahead (see WithPartitionMaintenance).
const DefaultPartitionMaintenance = 10 * time.Minute

// WithPartitionMaintenance sets how often Run makes sure the range
// partitions of a partitioned inbox (migrate.WithPartitionedInbox) exist
// ahead of the events' ids (default DefaultPartitionMaintenance; it also
// runs when Run starts). On a plain inbox it does nothing beyond one
// catalog lookup at start. Claims never fail for a missing range — they
// go to the inbox's default partition — but the default is never dropped,
// so claims there wait for the row-by-row cleanup.
func WithPartitionMaintenance(every time.Duration) Option {
	return func(c *config) { c.partitionEvery = every }
}

// WithDrainTimeout bounds how long Run lets in-flight transactions finish
// after its context is cancelled (default 10s); after that they are rolled
// back and their messages left for redelivery.
func WithDrainTimeout(d time.Duration) Option {
	return func(c *config) { c.drainTimeout = d }
}

// WithMaxRawBytes bounds the raw body and headers kept for an undecodable
// message (default 64 KiB each); the rest is cut and the cut noted.
func WithMaxRawBytes(n int) Option {
	return func(c *config) { c.maxRawBytes = n }
}

// WithLimits sets what a delivered event may hold (default ferry.Limits{},
// the producer's defaults: 256 KiB payload, 1 KiB header values, 128-byte
// names, ferry.DefaultContentTypes()). The inbox checks every decoded
// event with the same [ferry.Limits.Validate] the outbox writer runs (the
// topic excepted: it is the broker's destination, already delivered), so
// a consumer refuses what its producer would refuse. An event outside the
// limits is parked as undecodable, the reason naming the field and the
// limit, and acked: never applied, never dropped. Give a consumer the
// limits its producers were given (outbox.WithLimits).
func WithLimits(l ferry.Limits) Option {
	return func(c *config) { c.limits = l }
}

// WithLogger sets the logger. Without it (or with nil) the inbox logs to
// slog.Default() as it is when New runs, like every Ferry component; pass
// slog.New(slog.DiscardHandler) to silence it. Logs carry ids, never
// payloads or secrets, and are written with the context of the work
// (derived from the one Run was given), so a handler can attach trace ids.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithRegisterer registers the ferry_inbox_* metrics on r (default: none).
func WithRegisterer(r prometheus.Registerer) Option {
	return func(c *config) { c.registerer = r }
}

// WithLag sets how ferry_inbox_consumer_lag is read, for adapters whose
// lag is not a plain count, e.g. Kafka:
//
//	inbox.WithLag(func(ctx context.Context) (int64, error) {
//		l, err := kafkaConsumer.Lag(ctx)
//		return l.Total, err
//	})
//
// Without it, a consumer with Lag(ctx) (int64, error) or (like natsjs)
// Pending(ctx) (uint64, error) is asked directly.
func WithLag(f func(ctx context.Context) (int64, error)) Option {
	return func(c *config) { c.lag = f }
}

// WithFaults installs crash-point hooks (proofs and tests only).
func WithFaults(f Faults) Option {
	return func(c *config) { c.faults = f }
}

// WithClock overrides time.Now (tests).
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now = now }
}

func (c *config) check() error {
	bad := func(field, format string, args ...any) error {
		return &ferry.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if err := c.tables.Check(); err != nil {
		return err
	}
	if err := c.limits.Check(); err != nil {
		var ce *ferry.ConfigError
		if errors.As(err, &ce) {
			return &ferry.ConfigError{Field: "inbox." + ce.Field, Reason: ce.Reason}
		}
		return err
	}
	switch {
	case c.workers < 1 || c.workers > 1024:
		return bad("inbox.workers", "must be in 1..1024, got %d", c.workers)
	case c.queue < 1 || c.queue > 1<<16:
		return bad("inbox.queue", "must be in 1..65536, got %d", c.queue)
	case c.batch < 1 || c.batch > 10000:
		return bad("inbox.batch", "must be in 1..10000, got %d", c.batch)
	case c.batchLinger < 0 || c.batchLinger > time.Minute:
		return bad("inbox.batch_linger", "must be in 0..1m, got %s", c.batchLinger)
	case c.maxAttempts < 1:
		return bad("inbox.max_attempts", "must be >= 1, got %d", c.maxAttempts)
	case c.backoffBase <= 0 || c.backoffMax < c.backoffBase:
		return bad("inbox.backoff", "need 0 < base <= max, got %s, %s", c.backoffBase, c.backoffMax)
	case c.gapAlert <= 0:
		return bad("inbox.gap_alert", "must be > 0, got %s", c.gapAlert)
	case c.healInterval < 0:
		return bad("inbox.heal_interval", "must be >= 0, got %s", c.healInterval)
	case c.drainTimeout < 0:
		return bad("inbox.drain_timeout", "must be >= 0, got %s", c.drainTimeout)
	case c.partitionEvery < 100*time.Millisecond:
		return bad("inbox.partition_maintenance", "must be at least 100ms, got %s", c.partitionEvery)
	case c.maxRawBytes < 0 || c.maxRawBytes > 16<<20:
		return bad("inbox.max_raw_bytes", "must be in 0..16MiB, got %d", c.maxRawBytes)
	case c.start != StartStrict && c.start != StartAtFirstSeen:
		return bad("inbox.start_policy", "unknown policy %d", c.start)
	}
	for k := range c.schemas {
		if k.EventType == "" || k.SchemaVersion < 1 {
			return bad("inbox.schemas", "need a non-empty event type and version >= 1, got %q v%d", k.EventType, k.SchemaVersion)
		}
	}
	return nil
}
