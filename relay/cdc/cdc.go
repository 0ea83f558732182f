package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver/pgxv5"
	ibackoff "github.com/ferryhq/ferry/internal/backoff"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/sanitize"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrSlotBusy: another relay holds the slot. Run treats it as "wait as
	// standby and retry"; it is exported for logs and tests.
	ErrSlotBusy = errors.New("cdc: replication slot is held by another relay")
	// ErrSlotLost: the slot was invalidated (wal_status = lost) or dropped
	// behind the relay's back. Run recovers by recreating the slot and
	// re-publishing pending rows from the table, and says so loudly.
	ErrSlotLost = errors.New("cdc: replication slot lost")
	// ErrPublicationMismatch: an existing publication or slot with the
	// configured name does not fit (publishes other tables, not pgoutput,
	// another database). Run stops: guessing would publish the wrong rows.
	// On a partitioned outbox the publication must also publish via the
	// partition root (publish_via_partition_root), so rows of partitions
	// created later arrive as rows of the outbox.
	ErrPublicationMismatch = errors.New("cdc: publication or slot does not match the outbox")
)

// Role is what a relay is doing with its slot.
type Role string

// The roles.
const (
	RoleStarting Role = "starting" // connecting, checking publication and slot
	RoleStandby  Role = "standby"  // another relay holds the slot; retrying
	RoleActive   Role = "active"   // streaming from the slot
	RoleStopped  Role = "stopped"  // Run returned
)

// Status is a snapshot for `ferry status` and health checks.
type Status struct {
	Role        Role
	Slot        string
	Publication string
	// ConfirmedLSN is the position this relay last confirmed to Postgres:
	// every outbox transaction committed before it was acknowledged by the
	// broker and recorded in the table.
	ConfirmedLSN string
	// LagBytes and LagSeconds are sampled from pg_replication_slots (see
	// the ferry_cdc_slot_lag_* metrics); WALStatus is its wal_status
	// (reserved, extended, unreserved, lost).
	LagBytes   int64
	LagSeconds float64
	WALStatus  string
	SampledAt  time.Time
	// Published, Dead, Retries and SlotLosses count since New.
	Published  int64
	Dead       int64
	Retries    int64
	SlotLosses int64
	// Reconciled counts rows the reconciler found pending behind the
	// slot and re-published and marked (see WithReconcileInterval).
	Reconciled int64
	// CatchingUp is true while the relay re-publishes pending rows from
	// the table after it created or recreated the slot.
	CatchingUp bool
	// LastError is the last session error (sanitised), empty when none.
	LastError string
}

// Relay publishes committed outbox rows from Postgres' logical replication
// stream. Create it with [New], run it with [Run]; it is safe to call
// [Relay.Status] from any goroutine.
type Relay struct {
	cfg      config
	connStr  string
	replCfg  *pgconn.Config
	pub      broker.Publisher
	m        *metrics
	log      *slog.Logger
	running  atomic.Bool
	mu       sync.Mutex
	st       Status
	lagAlert bool // guarded by mu: an alert is open (log once per crossing)

	published, dead, retries, losses, reconciled atomic.Int64
}

// New validates the configuration and returns a relay. connString is an
// ordinary Postgres URL or DSN (the relay adds replication=database for its
// streaming connection and opens a small pool with the plain string for
// bookkeeping). It connects nothing until Run.
func New(connString string, pub broker.Publisher, opts ...Option) (*Relay, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if pub == nil {
		return nil, &ferry.ConfigError{Field: "publisher", Reason: "must not be nil"}
	}
	if lc := strings.ToLower(connString); strings.HasPrefix(lc, "mysql://") || strings.HasPrefix(lc, "mariadb://") || strings.Contains(lc, "@tcp(") {
		return nil, &ferry.ConfigError{Field: "conn_string", Reason: "the CDC relay reads Postgres logical decoding only; " +
			"on MySQL/MariaDB use the polling relay (relay.New with driver/mysql)"}
	}
	if _, err := pgxpool.ParseConfig(connString); err != nil {
		return nil, &ferry.ConfigError{Field: "conn_string", Reason: "not a valid Postgres connection string: " + dsnError(err)}
	}
	rc, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, &ferry.ConfigError{Field: "conn_string", Reason: "not a valid Postgres connection string: " + dsnError(err)}
	}
	if rc.RuntimeParams == nil {
		rc.RuntimeParams = map[string]string{}
	}
	// The walsender formats values with its own settings: pin the ones the
	// decoder parses, whatever the server's defaults are.
	rc.RuntimeParams["replication"] = "database"
	rc.RuntimeParams["datestyle"] = "ISO, YMD"
	rc.RuntimeParams["bytea_output"] = "hex"
	rc.RuntimeParams["timezone"] = "UTC"
	rc.RuntimeParams["extra_float_digits"] = "3"
	if rc.RuntimeParams["application_name"] == "" {
		rc.RuntimeParams["application_name"] = "ferry-cdc"
	}
	m, err := newMetrics(cfg.registerer, cfg.slot)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, connStr: connString, replCfg: rc, pub: pub, m: m,
		log: logattr.OrDefault(cfg.logger).With("component", "cdc", "slot", cfg.slot)}
	r.st = Status{Role: RoleStopped, Slot: cfg.slot, Publication: cfg.publication}
	return r, nil
}

// dsnError keeps an error message but never a password from a DSN: a
// parse error may quote the connection string, so only its kind is kept;
// any other message follows the one text rule (internal/sanitize).
func dsnError(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return "parse error"
	}
	return sanitize.Error(err)
}

// Status returns a snapshot of the relay's state and slot lag.
func (r *Relay) Status() Status {
	r.mu.Lock()
	st := r.st
	r.mu.Unlock()
	st.Published, st.Dead, st.Retries, st.SlotLosses = r.published.Load(), r.dead.Load(), r.retries.Load(), r.losses.Load()
	st.Reconciled = r.reconciled.Load()
	return st
}

func (r *Relay) setRole(role Role) {
	r.mu.Lock()
	r.st.Role = role
	r.mu.Unlock()
	if role == RoleActive {
		r.m.active.Set(1)
	} else {
		r.m.active.Set(0)
	}
}

func (r *Relay) setError(err error) {
	r.mu.Lock()
	if err == nil {
		r.st.LastError = ""
	} else {
		r.st.LastError = truncate(err.Error(), 300)
	}
	r.mu.Unlock()
}

// Run streams until ctx is cancelled, then returns nil; it returns an error
// only for a configuration that cannot work (a publication or slot of that
// name that does not fit the outbox: [ErrPublicationMismatch]). Connection
// losses, broker outages, a missing outbox or bookkeeping table (migrations
// not applied yet) and a busy slot are logged and retried: a second relay on
// the same slot waits as standby and takes over within the acquire interval
// after the first dies.
//
// Run may be called once per Relay.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("cdc: Run called twice")
	}
	r.setRole(RoleStarting)
	defer r.setRole(RoleStopped)
	pool, err := pgxpool.New(ctx, r.connStr)
	if err != nil {
		return fmt.Errorf("cdc: connect: %w", err)
	}
	defer pool.Close()

	var tgt target
	for {
		tgt, err = resolveTarget(ctx, pool, r.cfg.tables)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrPublicationMismatch) {
			return err
		}
		r.log.WarnContext(ctx, "cdc: cannot resolve outbox table, retrying", logattr.Err(err))
		if !sleep(ctx, r.cfg.backoffMax) {
			return nil
		}
	}

	// The polling relay's watermark design (relay.WithSentWatermark)
	// leaves sent rows 'pending'; this relay's catch-up would publish
	// every one of them again and never publish a 'retry' row.
	var inUse bool
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE sent_up_to > 0)`,
		r.cfg.tables.Name("relay_leases"))).Scan(&inUse); err != nil && ctx.Err() == nil {
		// Before migration 0012 there is no sent_up_to (42703), without
		// the relay migration no lease table (42P01): nothing to check.
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "42703" && pgErr.Code != "42P01") {
			return fmt.Errorf("cdc: check the relay state design: %w", err)
		}
	}
	if inUse {
		return fmt.Errorf("%w: the outbox is run by polling relays in the watermark design (relay_leases.sent_up_to > 0); the CDC relay reads row states from the status column only", ErrPublicationMismatch)
	}

	var wg sync.WaitGroup
	bg, stopBG := context.WithCancel(ctx)
	defer func() { stopBG(); wg.Wait() }()
	if tgt.partitioned {
		// Producers must never find no partition: every CDC relay, the
		// standby too, keeps them created ahead, as the polling relay does.
		keeper := partition.Keeper{Exec: pgxv5.New(pool).Executor(), Tables: tgt.tables, Table: partition.Outbox, Log: r.log}
		if err := keeper.Start(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cdc: %w", err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); keeper.Maintain(bg, r.cfg.partitionEvery) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); r.monitor(bg, pool) }()
	if r.cfg.heartbeat > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); r.heartbeat(bg, pool) }()
	}

	b := backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}
	for {
		began := time.Now()
		err := r.session(ctx, pool, tgt)
		if time.Since(began) > 2*r.cfg.backoffMax {
			b.reset() // the session was healthy for a while: start over at min
		}
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, ErrSlotBusy):
			r.setRole(RoleStandby)
			r.log.DebugContext(ctx, "cdc: slot busy, standing by", "retry_in", r.cfg.acquire)
			if !sleep(ctx, r.cfg.acquire) {
				return nil
			}
			continue
		case errors.Is(err, ErrPublicationMismatch), errors.Is(err, ferry.ErrInvalidConfig):
			r.setError(err)
			return err
		}
		r.m.sessionErrs.Inc()
		r.setError(err)
		r.setRole(RoleStarting)
		d := b.next()
		r.log.WarnContext(ctx, "cdc: replication session ended, reconnecting", logattr.Err(err), "retry_in", d)
		if !sleep(ctx, d) {
			return nil
		}
	}
}

// target is the resolved outbox table.
type target struct {
	oid       uint32
	schema    string
	name      string
	qualified string // quoted schema.name
	slotTable string // quoted cdc_slot bookkeeping table
	// partitioned: the outbox is a partitioned table
	// (migrate.WithPartitionedOutbox); tables are Ferry's tables in the
	// outbox's schema.
	partitioned bool
	tables      ferry.Tables
}

func resolveTarget(ctx context.Context, pool *pgxpool.Pool, t ferry.Tables) (target, error) {
	var tg target
	err := pool.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, t.Name("outbox")).
		Scan(&tg.oid, &tg.schema, &tg.name)
	if err != nil {
		return tg, fmt.Errorf("cdc: outbox table %s not found (run `ferry migrate up`): %w", t.Name("outbox"), err)
	}
	tg.qualified = fmt.Sprintf("%q.%q", tg.schema, tg.name)
	// The bookkeeping table (and a partitioned outbox's partitions) live
	// next to the outbox, in the same schema.
	tg.tables = ferry.Tables{Schema: tg.schema, Prefix: t.Prefix}
	tg.slotTable = tg.tables.Name("cdc_slot")
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tg.slotTable).Scan(&ok); err != nil {
		return tg, fmt.Errorf("cdc: look up %s: %w", tg.slotTable, err)
	}
	if !ok {
		return tg, fmt.Errorf("cdc: bookkeeping table %s not found (run `ferry migrate up`, migration 0006)", tg.slotTable)
	}
	if tg.partitioned, err = partition.IsPartitioned(ctx, pgxv5.New(pool).Executor(), tg.tables, partition.Outbox); err != nil {
		return tg, fmt.Errorf("cdc: %w", err)
	}
	return tg, nil
}

// backoff is the session's retry state: the n-th delay is uniform in
// [min/2, cur], cur = min(max, min·2^(n-1)) (internal/backoff). The floor
// of min/2 keeps a failing session from reconnecting in a tight loop.
type backoff struct {
	min, max, cur time.Duration
	n             int
}

func (b *backoff) next() time.Duration {
	b.n++
	b.cur = ibackoff.Ceil(b.min, b.max, b.n)
	return ibackoff.Uniform(b.min/2, b.cur)
}

func (b *backoff) reset() { b.cur, b.n = 0, 0 }

// sleep waits d or until ctx ends; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool { return ibackoff.Sleep(ctx, d) }

// monitor samples slot lag from pg_replication_slots into metrics and
// Status, and raises (logs) an alert when it crosses the threshold.
func (r *Relay) monitor(ctx context.Context, pool *pgxpool.Pool) {
	var lastConfirmed pglogrepl.LSN
	var lastMove time.Time
	for {
		var lag *int64
		var confirmed *pglogrepl.LSN
		var walStatus *string
		err := pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, confirmed_flush_lsn, wal_status
			FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.slot).Scan(&lag, &confirmed, &walStatus)
		now := time.Now()
		if err == nil {
			var lb int64
			var ws string
			if lag != nil {
				lb = max(*lag, 0)
			}
			if walStatus != nil {
				ws = *walStatus
			}
			if confirmed != nil && *confirmed != lastConfirmed {
				lastConfirmed, lastMove = *confirmed, now
			}
			var secs float64
			if lb > 0 && !lastMove.IsZero() {
				secs = now.Sub(lastMove).Seconds()
			}
			r.m.lagSeconds.Set(secs)
			alert := (r.cfg.lagAlertBytes > 0 && lb > r.cfg.lagAlertBytes) ||
				(r.cfg.lagAlertAge > 0 && secs > r.cfg.lagAlertAge.Seconds()) || ws == "lost" || ws == "unreserved"
			r.mu.Lock()
			r.st.LagBytes, r.st.LagSeconds, r.st.WALStatus, r.st.SampledAt = lb, secs, ws, now
			opened := alert && !r.lagAlert
			closed := !alert && r.lagAlert
			r.lagAlert = alert
			r.mu.Unlock()
			if opened {
				r.m.lagAlerts.Inc()
				r.log.ErrorContext(ctx, "cdc: ALERT slot lag", "alert", "slot_lag", "lag_bytes", lb, "lag_seconds", secs, "wal_status", ws)
			} else if closed {
				r.log.InfoContext(ctx, "cdc: slot lag back under threshold", "lag_bytes", lb, "lag_seconds", secs)
			}
		} else if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			r.log.DebugContext(ctx, "cdc: slot lag sample failed", logattr.Err(err))
		}
		if !sleep(ctx, r.cfg.monitor) {
			return
		}
	}
}

// heartbeat writes a non-transactional logical message so WAL moves and the
// server's keepalives carry a fresh position the relay can confirm.
func (r *Relay) heartbeat(ctx context.Context, pool *pgxpool.Pool) {
	for sleep(ctx, r.cfg.heartbeat) {
		if r.Status().Role != RoleActive {
			continue
		}
		if _, err := pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'ferry.heartbeat', '')`); err != nil && ctx.Err() == nil {
			r.log.DebugContext(ctx, "cdc: heartbeat failed", logattr.Err(err))
		}
	}
}
