package cdc

import (
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
)

// Option configures a Relay (functional options, franz-go style).
type Option func(*config)

type config struct {
	tables        ferry.Tables
	slot          string
	publication   string
	standby       time.Duration // status-update interval towards Postgres
	acquire       time.Duration // standby retry interval for a busy slot
	heartbeat     time.Duration // pg_logical_emit_message interval, 0 = off
	monitor       time.Duration // slot-lag sampling interval
	flushInterval time.Duration // status flusher interval
	reconcile     time.Duration // how often pending rows behind the slot are looked for
	visibleWait   time.Duration // how long record waits for decoded rows to become visible
	maxBatch      int           // events per Publish call
	maxPending    int           // decoded transactions buffered ahead of the publisher
	pendingBytes  int64         // payload bytes decoded and not yet acknowledged
	backoffMin    time.Duration
	backoffMax    time.Duration
	lagAlertBytes int64
	lagAlertAge   time.Duration
	logger        *slog.Logger
	registerer    prometheus.Registerer
	faults        Faults
	source        string
	// partitionEvery: how often a partitioned outbox's partitions are
	// created ahead (WithPartitionMaintenance)
	partitionEvery time.Duration
}

func defaultConfig() config {
	return config{
		slot:           "ferry_cdc",
		publication:    "ferry_cdc",
		standby:        2 * time.Second,
		acquire:        2 * time.Second,
		monitor:        5 * time.Second,
		flushInterval:  20 * time.Millisecond,
		reconcile:      10 * time.Second,
		visibleWait:    2 * time.Second,
		maxBatch:       512,
		maxPending:     4096,
		pendingBytes:   DefaultMaxPendingBytes,
		backoffMin:     100 * time.Millisecond,
		backoffMax:     5 * time.Second,
		lagAlertBytes:  1 << 30,
		lagAlertAge:    5 * time.Minute,
		partitionEvery: 10 * time.Minute,
	}
}

// WithTables sets the schema and table prefix of the outbox (default: the
// connection's search_path and "ferry_"). The publication is created for
// exactly this one table.
func WithTables(t ferry.Tables) Option { return func(c *config) { c.tables = t } }

// WithSlotName names the logical replication slot (default "ferry_cdc").
// One slot per outbox table and deployment: two deployments sharing a slot
// would each see only part of the stream.
func WithSlotName(name string) Option { return func(c *config) { c.slot = name } }

// WithPublicationName names the publication (default "ferry_cdc"). It is
// created on first start for the outbox table only, inserts only; an
// existing publication must publish that table.
func WithPublicationName(name string) Option { return func(c *config) { c.publication = name } }

// WithStandbyTimeout sets how often the relay sends a standby status update
// (the confirmed LSN) to Postgres and asks for a keepalive (default 2s). It
// must be well below the server's wal_sender_timeout (default 60s). Shorter
// means the slot releases WAL sooner; the cost is one small message each.
func WithStandbyTimeout(d time.Duration) Option { return func(c *config) { c.standby = d } }

// WithAcquireInterval sets how often a standby relay retries to take over a
// slot held by another relay (default 2s): the takeover delay after the
// active relay dies is at most this plus Postgres noticing the dead
// connection.
func WithAcquireInterval(d time.Duration) Option { return func(c *config) { c.acquire = d } }

// WithHeartbeat makes the relay emit a non-transactional logical message
// with prefix "ferry.heartbeat" and empty content (pg_logical_emit_message)
// every d (default 0: off). The message is not part of
// any table, pgoutput is started with messages=false, so it never reaches
// the broker; it only makes WAL move so keepalives carry a fresh position on
// an otherwise idle database. Keepalive-based advancing works without it on
// a database that has other write traffic.
func WithHeartbeat(d time.Duration) Option { return func(c *config) { c.heartbeat = d } }

// WithMonitorInterval sets how often slot lag is sampled from
// pg_replication_slots (default 5s).
func WithMonitorInterval(d time.Duration) Option { return func(c *config) { c.monitor = d } }

// WithFlushInterval sets how long the status flusher gathers acknowledged
// events before one UPDATE marks them sent (default 20ms). The confirmed LSN
// waits for that write, so a longer interval means fewer statements and a
// slot that trails by that much more.
func WithFlushInterval(d time.Duration) Option { return func(c *config) { c.flushInterval = d } }

// WithReconcileInterval sets how often the relay looks for rows left
// 'pending' behind its slot (default 10s): it notes the oldest pending rows
// and the current WAL insert position, and once the slot's confirmed
// position has passed that position, re-publishes whichever of those rows
// are still pending (the broker's dedup answers with the original receipt)
// and marks them. Such rows are left by a transaction whose rows were not
// yet visible when the relay marked its batch (see docs/CDC.md, "Table
// and broker agree"), or by an older relay version; a healthy relay finds
// none. A row is repaired within about two intervals.
func WithReconcileInterval(d time.Duration) Option { return func(c *config) { c.reconcile = d } }

// WithMaxBatch bounds the events handed to one Publisher.Publish call
// (default 512). A transaction is split across calls only when it alone
// is larger, or when it is handed off in parts (WithMaxPendingBytes).
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// DefaultMaxPendingBytes and MaxMaxPendingBytes are WithMaxPendingBytes'
// default and upper limit.
const (
	DefaultMaxPendingBytes = 64 << 20
	MaxMaxPendingBytes     = 1 << 30
)

// WithMaxPendingBytes bounds the relay's memory for events: the payload
// bytes of transactions decoded from the WAL and not yet acknowledged by
// the broker, 1..1 GiB (default 64 MiB). While the budget is spent the
// WAL reader stops reading (and keeps the replication session alive with
// status updates) until acknowledged batches free it; the catch-up and
// the reconcile read their rows from the table within the same budget. A
// transaction whose payloads reach a quarter of the budget is handed to
// the broker in parts as it is decoded (it is committed: pgoutput sends
// only committed transactions), so a large one is never held whole; its
// LSN is confirmed only with its last part. Without the budget only the
// number of transactions (4096) bounds the memory, whatever their sizes.
func WithMaxPendingBytes(n int) Option { return func(c *config) { c.pendingBytes = int64(n) } }

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

// WithBackoff bounds the retry delay after a broker failure (default 100ms
// to 5s, full jitter): an outage costs at most one attempt per max delay.
func WithBackoff(min, max time.Duration) Option {
	return func(c *config) { c.backoffMin, c.backoffMax = min, max }
}

// WithLagAlert sets when slot lag is logged as an alert: more than bytes of
// WAL retained, or the confirmed position not moving for age while lag is
// positive (default 1 GiB, 5 min).
func WithLagAlert(bytes int64, age time.Duration) Option {
	return func(c *config) { c.lagAlertBytes, c.lagAlertAge = bytes, age }
}

// WithPartitionMaintenance sets how often the relay makes sure a
// partitioned outbox (migrate.WithPartitionedOutbox) has its partitions
// for the next partition intervals created (default 10 min, like the
// polling relay's; it also runs when the relay starts). Every CDC relay
// does it, the standby too; on a plain outbox it does nothing.
func WithPartitionMaintenance(every time.Duration) Option {
	return func(c *config) { c.partitionEvery = every }
}

// WithLogger sets the structured logger. Without it (or with nil) the CDC
// relay logs to slog.Default() as it is when New runs, like every Ferry
// component; pass slog.New(slog.DiscardHandler) to silence it. Logs carry
// event ids, slot names and LSNs, never payloads or the connection
// string's password, and are written with the context of the work, so a
// handler can attach trace ids.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the relay's Prometheus metrics (prefix
// ferry_cdc_) on r (default: none registered; Status still works).
func WithRegisterer(r prometheus.Registerer) Option { return func(c *config) { c.registerer = r } }

// WithFaults injects faults for tests and `ferry prove` negative controls.
// Never set in production: each fault removes a safety mechanism.
func WithFaults(f Faults) Option { return func(c *config) { c.faults = f } }

// Faults removes safety mechanisms on purpose, so tests and `ferry prove`
// can show each one matters (a checker that cannot fail proves nothing).
type Faults struct {
	// ConfirmBeforeAck confirms a transaction's LSN to Postgres as soon as
	// it is decoded, before the broker acknowledged it: a crash or outage
	// then loses the unacknowledged tail.
	ConfirmBeforeAck bool
	// StartFromCurrentWAL starts replication at pg_current_wal_lsn()
	// instead of the slot's confirmed position, the bug that loses rows
	// committed while the relay was down.
	StartFromCurrentWAL bool
	// NoCatchUp skips re-publishing pending rows from the table after the
	// slot was (re)created: a lost slot then loses the rows it held.
	NoCatchUp bool
	// NoIdleAdvance never confirms keepalive positions: with an idle
	// outbox the slot then pins WAL however busy other tables are.
	NoIdleAdvance bool
	// ConfirmBeforeMark confirms a batch's LSN as soon as the broker
	// acknowledged it, before its rows are marked sent: a crash in between
	// leaves published rows 'pending' behind the slot, never streamed
	// again (the ordering issue #23 suspected). Pair it with NoReconcile
	// to see the table disagree with the broker.
	ConfirmBeforeMark bool
	// NoVisibilityWait trusts the marking UPDATE even when it did not find
	// every row (the behaviour before #23): a row decoded from the log
	// before its transaction is visible to other sessions is then never
	// marked, although it was published.
	NoVisibilityWait bool
	// NoReconcile never looks for pending rows behind the slot, so rows
	// left pending by a fault stay pending (the table keeps disagreeing
	// with the broker). The other negative controls that must show a loss
	// set it too: the reconciler would otherwise re-publish what they
	// skipped.
	NoReconcile bool
	// BeforeConfirm, when set, is called with each LSN about to be
	// confirmed (test hook, e.g. to observe or to crash at that point).
	BeforeConfirm func(lsn uint64)
}

var nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

func (c *config) check() error {
	if err := c.tables.Check(); err != nil {
		return err
	}
	for _, n := range []struct{ field, v string }{{"slot_name", c.slot}, {"publication_name", c.publication}} {
		if len(n.v) == 0 || len(n.v) > 63 || !nameRE.MatchString(n.v) {
			return &ferry.ConfigError{Field: n.field, Reason: fmt.Sprintf("must match [a-z_][a-z0-9_]* and be 1..63 bytes, got %q", n.v)}
		}
	}
	type dur struct {
		field    string
		v        time.Duration
		min, max time.Duration
	}
	for _, d := range []dur{
		{"standby_timeout", c.standby, 10 * time.Millisecond, 30 * time.Second},
		{"acquire_interval", c.acquire, 10 * time.Millisecond, 10 * time.Minute},
		{"monitor_interval", c.monitor, 10 * time.Millisecond, 10 * time.Minute},
		{"flush_interval", c.flushInterval, time.Millisecond, 10 * time.Second},
		{"reconcile_interval", c.reconcile, 10 * time.Millisecond, time.Hour},
		{"backoff_min", c.backoffMin, time.Millisecond, time.Minute},
		{"backoff_max", c.backoffMax, c.backoffMin, 10 * time.Minute},
		{"partition_maintenance", c.partitionEvery, 100 * time.Millisecond, 24 * time.Hour},
	} {
		if d.v < d.min || d.v > d.max {
			return &ferry.ConfigError{Field: d.field, Reason: fmt.Sprintf("must be in %v..%v, got %v", d.min, d.max, d.v)}
		}
	}
	if c.heartbeat != 0 && (c.heartbeat < 10*time.Millisecond || c.heartbeat > time.Hour) {
		return &ferry.ConfigError{Field: "heartbeat", Reason: fmt.Sprintf("must be 0 (off) or in 10ms..1h, got %v", c.heartbeat)}
	}
	if c.maxBatch < 1 || c.maxBatch > 10000 {
		return &ferry.ConfigError{Field: "max_batch", Reason: fmt.Sprintf("must be in 1..10000, got %d", c.maxBatch)}
	}
	if c.pendingBytes < 1 || c.pendingBytes > MaxMaxPendingBytes {
		return &ferry.ConfigError{Field: "max_pending_bytes", Reason: fmt.Sprintf("must be in 1..%d, got %d", MaxMaxPendingBytes, c.pendingBytes)}
	}
	if c.lagAlertBytes < 0 || c.lagAlertAge < 0 {
		return &ferry.ConfigError{Field: "lag_alert", Reason: "must not be negative"}
	}
	return nil
}
