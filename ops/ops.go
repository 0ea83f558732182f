package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
)

// DB is what ops needs from a store: a pool executor and transactions.
// Both Ferry drivers (pgxv5.Driver, databasesql.Driver) satisfy it, as does
// the CLI's store.
type DB interface {
	Dialect() driver.Dialect
	Executor() driver.Executor
	Begin(ctx context.Context) (driver.Tx, error)
}

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrRetentionTooShort: a cleanup asked for a retention shorter than the
	// replay/redelivery window; see *RetentionError for both numbers.
	ErrRetentionTooShort = errors.New("ops: retention shorter than the replay window")
	// ErrOutboxFull: the outbox holds at least the hard cap of pending rows;
	// see *OutboxFullError. The producer should fail the command instead of
	// filling the disk.
	ErrOutboxFull = errors.New("ops: outbox full")
	// ErrReasonRequired: a mutating action was approved without a reason.
	ErrReasonRequired = errors.New("ops: a reason is required")
	// ErrActorRequired: a mutating action was approved without an actor.
	ErrActorRequired = errors.New("ops: an actor is required")
	// ErrEmptyFilter: a mutating action had no filter and did not say All.
	ErrEmptyFilter = errors.New("ops: empty filter")
	// ErrNotFound: the event, message or key does not exist in the tables.
	ErrNotFound = errors.New("ops: not found")
	// ErrUnsupported: the tables this call needs are not installed (e.g.
	// the inbox migration has not been applied).
	ErrUnsupported = errors.New("ops: not supported by this schema")
	// ErrInvalidArgument: an argument failed validation; see *ArgError.
	ErrInvalidArgument = errors.New("ops: invalid argument")
	// ErrStatusIncomplete: Status could not read a section that should
	// exist (a missing or unreadable table); see *StatusError. The
	// section's numbers are unknown, not zero.
	ErrStatusIncomplete = errors.New("ops: status incomplete")
)

// ArgError names the argument that was rejected and why.
type ArgError struct {
	Field  string
	Reason string
}

func (e *ArgError) Error() string { return fmt.Sprintf("ops: invalid %s: %s", e.Field, e.Reason) }

// Is reports ErrInvalidArgument.
func (e *ArgError) Is(target error) bool { return target == ErrInvalidArgument }

// RetentionError names the retention that was asked for and the window it
// must not undercut, with the two settings the window is made of.
type RetentionError struct {
	Table              string        // "outbox", "inbox" or "effects"
	Retention          time.Duration // what the caller asked for
	Window             time.Duration // the minimum: max of the two below
	BrokerDedupWindow  time.Duration
	InboxReplayHorizon time.Duration
	// OutlivesOutbox: the inbox retention was shorter than the outbox
	// retention (Window holds the outbox retention then).
	OutlivesOutbox bool
}

func (e *RetentionError) Error() string {
	if e.OutlivesOutbox {
		return fmt.Sprintf("ops: refusing cleanup: inbox retention %s is shorter than outbox retention %s; "+
			"a replay of a kept outbox row would reach consumers whose inbox no longer remembers it", e.Retention, e.Window)
	}
	return fmt.Sprintf("ops: refusing cleanup of %s: retention %s is shorter than the replay window %s "+
		"(broker dedup window %s, inbox replay horizon %s); deleting younger rows would let a redelivered or replayed event be applied again",
		e.Table, e.Retention, e.Window, e.BrokerDedupWindow, e.InboxReplayHorizon)
}

// Is reports ErrRetentionTooShort.
func (e *RetentionError) Is(target error) bool { return target == ErrRetentionTooShort }

// OutboxFullError says how many rows are pending and what the cap is.
type OutboxFullError struct {
	Pending int64
	Cap     int64
}

func (e *OutboxFullError) Error() string {
	return fmt.Sprintf("ops: outbox full: at least %d pending rows, hard cap %d; the relay is not keeping up (see docs/OPERATIONS.md, growing backlog)", e.Pending, e.Cap)
}

// Is reports ErrOutboxFull.
func (e *OutboxFullError) Is(target error) bool { return target == ErrOutboxFull }

// Ops runs operator queries and actions on Ferry's tables. It is safe for
// concurrent use and holds no connection beyond the DB's.
type Ops struct {
	db  DB
	cfg config
	wm  atomic.Bool // see watermarked
}

type config struct {
	tables ferry.Tables
	now    func() time.Time
	log    *slog.Logger
	window Window // minimums from options; the effective window is max(settings, these)
	mask   *MaskPolicy
}

// Option configures Ops.
type Option func(*config)

// WithTables sets the schema and table prefix (default: search_path, "ferry_").
func WithTables(t ferry.Tables) Option { return func(c *config) { c.tables = t } }

// WithClock overrides time.Now (tests).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithLogger sets the logger for actions. Without it (or with nil) Ops
// logs to slog.Default() as it is when New runs, like every Ferry
// component; pass slog.New(slog.DiscardHandler) to silence it. Logs carry
// ids and counts, never payloads or secrets.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithMinimumWindow raises the replay window cleanup enforces. The
// effective window is the larger of this and the values stored in the
// ops_settings table, so configuration can make the guard stricter but
// never weaker than what the database records.
func WithMinimumWindow(w Window) Option { return func(c *config) { c.window = w } }

// New returns Ops over db.
func New(db DB, opts ...Option) (*Ops, error) {
	if db == nil {
		return nil, &ArgError{Field: "db", Reason: "must not be nil"}
	}
	cfg := config{now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.tables.Check(); err != nil {
		return nil, err
	}
	cfg.log = logattr.OrDefault(cfg.log)
	if cfg.window.BrokerDedupWindow < 0 || cfg.window.InboxReplayHorizon < 0 {
		return nil, &ArgError{Field: "window", Reason: "durations must be >= 0"}
	}
	return &Ops{db: db, cfg: cfg}, nil
}

func (o *Ops) t(base string) string { return o.cfg.tables.Name(base) }

func (o *Ops) now() time.Time { return o.cfg.now().UTC() }

// queryRow scans the first row of q into dest; ErrNotFound when none.
func queryRow(ctx context.Context, exec driver.Executor, q string, args []any, dest ...any) error {
	found, err := driver.QueryRow(ctx, exec, q, args, dest...)
	if err == nil && !found {
		return ErrNotFound
	}
	return err
}

// inTx runs fn in a transaction and commits when it returns nil.
func (o *Ops) inTx(ctx context.Context, fn func(tx driver.Tx) error) error {
	tx, err := o.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("ops: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ops: commit: %w", err)
	}
	return nil
}
