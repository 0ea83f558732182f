// Package outbox writes events into the outbox table in the same local
// transaction as the caller's business change (guarantee G1), allocating the
// per-aggregate sequence under a row lock in that transaction (G3).
//
// Calls come in pairs, like river's Insert/InsertTx: [Writer.InsertTx] joins
// the caller's transaction (pgx.Tx or *sql.Tx), [Writer.Insert] runs its own.
//
//	w, _ := outbox.New(pgxv5.New(pool))
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	// ... business writes in tx ...
//	_, err := w.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", ...})
//	tx.Commit(ctx)
//
// On Postgres the sequence allocation and the outbox insert travel in one
// statement, so an outbox write costs one round trip per call whatever the
// number of events.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/ident"
	"github.com/ferryhq/ferry/otelferry"
)

// Writer writes events. It is safe for concurrent use and holds no
// connection of its own beyond the driver's.
type Writer[TTx any] struct {
	drv       driver.Driver[TTx]
	cfg       config
	insert    string // the dialect's insert statement, rendered once
	insertOne string // Postgres: the single-event form
	seq       string // SQLite, MySQL: the sequence upsert
	// MySQL: undo a sequence upsert of a failed call (insertMySQLFast).
	seqUndoUpdate, seqUndoDelete string

	// Postgres, caller-supplied versions of one aggregate, keyed by
	// "creates the aggregate" (expected version 0): the multi- and
	// single-event statements, and the read of the sequence after a conflict.
	expected, expectedOne map[bool]string
	lastSeq               string
}

type config struct {
	tables  ferry.Tables
	limits  ferry.Limits
	topics  ferry.TopicTemplate
	shards  int
	notify  string
	now     func() time.Time
	admit   func(ctx context.Context) error
	noTrace bool
	// contracts, when set, validates each payload before anything is written.
	contracts ContractValidator
	sealer    PayloadSealer    // WithEncryption
	offloader PayloadOffloader // WithClaimCheck
}

// Option configures a Writer.
type Option func(*config)

// WithTables sets the schema and table prefix (default: search_path, "ferry_").
func WithTables(t ferry.Tables) Option { return func(c *config) { c.tables = t } }

// WithLimits sets validation limits (default: ferry.Limits{}, i.e. 256 KiB payloads).
func WithLimits(l ferry.Limits) Option { return func(c *config) { c.limits = l } }

// WithTopicTemplate sets how a topic is derived when an event has none
// (default "{aggregate_type}.events").
func WithTopicTemplate(t ferry.TopicTemplate) Option { return func(c *config) { c.topics = t } }

// WithShardCount sets N in shard = hash(aggregate) mod N (default 16). It is
// fixed per deployment: every writer and relay must use the same N, and a
// relay refuses rows written with another.
func WithShardCount(n int) Option { return func(c *config) { c.shards = n } }

// WithNotify makes each insert also NOTIFY channel (Postgres only), inside
// the same statement, so a listening relay wakes at commit instead of at its
// next poll. Notifications are delivered only if the transaction commits.
func WithNotify(channel string) Option { return func(c *config) { c.notify = channel } }

// WithAdmission runs check before every write; an error aborts the call
// before anything is written and is returned wrapped. Use it with
// ops.CapacityGuard so producers fail fast with ops.ErrOutboxFull instead of
// filling the disk when the relay is stuck:
//
//	guard, _ := ops.NewCapacityGuard(drv.Executor(), 1_000_000)
//	w, _ := outbox.New(drv, outbox.WithAdmission(guard.Check))
func WithAdmission(check func(ctx context.Context) error) Option {
	return func(c *config) { c.admit = check }
}

// WithoutTraceCapture stops the writer from filling an empty
// Headers.Traceparent from the OpenTelemetry span in ctx (on by default, so
// one trace shows command → publish → apply).
func WithoutTraceCapture() Option { return func(c *config) { c.noTrace = true } }

// WithClock overrides time.Now (tests).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// ContractValidator checks a payload against the contract of its event type
// and schema version; *contract.Set implements it. An error must name where
// the payload breaks the contract and which rule, without payload values.
type ContractValidator interface {
	Validate(eventType string, schemaVersion int, payload []byte) error
}

// WithContracts makes InsertTx refuse an event whose payload does not match
// its contract (see package contract: contracts/<event_type>/v<N>.json):
// the call fails before anything is written with an error that is
// ferry.ErrInvalidEvent (a *ferry.ValidationError for field payload) and
// also unwraps to the validator's own error (*contract.Violation: JSON path
// and rule). Event types without a contract pass. Off by default.
func WithContracts(v ContractValidator) Option { return func(c *config) { c.contracts = v } }

// contractError is a *ferry.ValidationError that also unwraps to the
// contract's own error.
type contractError struct {
	ve    *ferry.ValidationError
	cause error
}

func (e *contractError) Error() string   { return e.ve.Error() }
func (e *contractError) Unwrap() []error { return []error{e.ve, e.cause} }

// New returns a Writer over drv. It validates the configuration and renders
// its SQL once.
func New[TTx any](drv driver.Driver[TTx], opts ...Option) (*Writer[TTx], error) {
	cfg := config{shards: ferry.DefaultShardCount, now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.tables.Check(); err != nil {
		return nil, err
	}
	if err := cfg.limits.Check(); err != nil {
		return nil, err
	}
	if err := cfg.topics.Check(); err != nil {
		return nil, err
	}
	if cfg.shards < 1 || cfg.shards > ferry.MaxShardCount {
		return nil, &ferry.ConfigError{Field: "shard_count", Reason: fmt.Sprintf("must be in 1..%d, got %d", ferry.MaxShardCount, cfg.shards)}
	}
	if cfg.notify != "" {
		if drv.Dialect() != driver.Postgres {
			return nil, &ferry.ConfigError{Field: "notify", Reason: "LISTEN/NOTIFY needs Postgres"}
		}
		if !ident.Valid(cfg.notify, ident.MaxChannel) {
			return nil, &ferry.ConfigError{Field: "notify", Reason: "channel must match [a-z_][a-z0-9_]* and be at most 63 bytes"}
		}
	}
	w := &Writer[TTx]{drv: drv, cfg: cfg}
	switch drv.Dialect() {
	case driver.Postgres:
		w.insert = postgresInsertSQL(cfg.tables, cfg.notify)
		w.insertOne = postgresInsertOneSQL(cfg.tables, cfg.notify)
		w.expected = map[bool]string{false: postgresExpectedSQL(cfg.tables, cfg.notify, false), true: postgresExpectedSQL(cfg.tables, cfg.notify, true)}
		w.expectedOne = map[bool]string{false: postgresExpectedOneSQL(cfg.tables, cfg.notify, false), true: postgresExpectedOneSQL(cfg.tables, cfg.notify, true)}
		w.lastSeq = fmt.Sprintf(`SELECT last_seq FROM %s WHERE tenant_id = $1 AND aggregate_type = $2 AND aggregate_id = $3`, cfg.tables.Name("aggregate_seq"))
	case driver.SQLite:
		w.insert = sqliteInsertSQL(cfg.tables)
		w.seq = sqliteSeqSQL(cfg.tables)
	case driver.MySQL:
		w.insert = mysqlInsertSQL(cfg.tables, 1)
		w.seq = mysqlSeqSQL(cfg.tables)
		w.seqUndoUpdate, w.seqUndoDelete = mysqlSeqUndoSQL(cfg.tables)
	default:
		return nil, &ferry.ConfigError{Field: "dialect", Reason: fmt.Sprintf("unsupported dialect %q", drv.Dialect())}
	}
	return w, nil
}

// ShardCount returns the configured N.
func (w *Writer[TTx]) ShardCount() int { return w.cfg.shards }

// Insert writes events in a transaction of its own and commits it. Use it
// for events that announce nothing else written by the caller; otherwise use
// InsertTx, which is the point of an outbox.
func (w *Writer[TTx]) Insert(ctx context.Context, events ...ferry.Event) ([]ferry.Event, error) {
	tx, err := w.drv.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	out, err := w.insertExec(ctx, tx, events)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outbox: commit: %w", err)
	}
	return out, nil
}

// InsertTx writes events inside tx, the caller's transaction: they exist if
// and only if tx commits. It returns the events with their assigned fields
// (ID, AggregateSeq, Topic, Shard, OccurredAt, ContentType).
//
// All events are validated before anything is written, including that no
// two events of the call share an ID. On any error nothing from this call is
// written. What happens to tx depends on the error and the database:
//
//   - Validation (ferry.ErrInvalidEvent) and admission errors: no statement
//     was sent; tx is untouched and usable, on every driver.
//   - ferry.ErrSequenceConflict: nothing was written; tx is usable, on every
//     driver.
//   - Any other error (ferry.ErrDuplicateEventID for an ID already in the
//     outbox, a cancelled ctx, a database error):
//     On SQLite the call runs under a savepoint that is rolled back, so tx
//     is usable and holds exactly what it held before the call. The call's
//     statements are not interrupted mid-way (SQLite would roll back all of
//     tx); ctx is checked between them. If the rollback itself fails, the
//     error says to roll tx back.
//     On MySQL/MariaDB the call also runs under a savepoint, rolled back
//     on error, so tx is usable and holds what it held before; ctx is
//     checked between statements, and a ctx cancelled while a statement
//     runs closes the connection (the server rolls tx back). Two errors end
//     tx on the server whatever the savepoint: an InnoDB deadlock (the
//     error wraps driver.ErrDeadlock; InnoDB rolled back all of tx, the
//     caller's writes with the events, so retry the whole transaction) and
//     a lock wait timeout (driver.ErrLockTimeout; roll tx back and retry).
//     On Postgres the failed statement aborts tx (a cancelled ctx may also
//     close its connection): it can only be rolled back, its Commit fails,
//     and nothing of tx is kept. The exception is a call with
//     caller-supplied versions on several aggregates: it runs under a
//     savepoint, rolled back on error, so tx stays usable unless its
//     connection was lost.
//
// With database/sql, a tx begun with BeginTx(ctx) is rolled back by
// database/sql itself when that ctx is cancelled, on every database.
func (w *Writer[TTx]) InsertTx(ctx context.Context, tx TTx, events ...ferry.Event) ([]ferry.Event, error) {
	return w.insertExec(ctx, w.drv.UnwrapExecutor(tx), events)
}

// insertExec validates, normalises and writes events through exec.
func (w *Writer[TTx]) insertExec(ctx context.Context, exec driver.Executor, events []ferry.Event) ([]ferry.Event, error) {
	if len(events) == 0 {
		return nil, nil
	}
	if len(events) > MaxEventsPerCall {
		return nil, &ferry.ValidationError{Index: MaxEventsPerCall, Field: "events", Reason: fmt.Sprintf("%d events in one call exceeds the limit of %d", len(events), MaxEventsPerCall)}
	}
	if w.cfg.admit != nil {
		if err := w.cfg.admit(ctx); err != nil {
			return nil, fmt.Errorf("outbox: admission refused: %w", err)
		}
	}
	now := w.cfg.now().UTC()
	traceparent := ""
	if !w.cfg.noTrace {
		traceparent = otelferry.TraceparentFromContext(ctx)
	}
	out := make([]ferry.Event, len(events))
	limits := w.dataLimits()
	var given map[uuid.UUID]int // caller-supplied ids, to reject duplicates within the call
	for i := range events {
		e := events[i]
		if e.Headers.Traceparent == "" {
			e.Headers.Traceparent = traceparent
		}
		if err := limits.Validate(i, &e); err != nil {
			return nil, err
		}
		if w.cfg.contracts != nil {
			if err := w.cfg.contracts.Validate(e.EventType, e.SchemaVersion, e.Payload); err != nil {
				return nil, &contractError{ve: &ferry.ValidationError{Index: i, Field: "payload", Reason: err.Error()}, cause: err}
			}
		}
		if e.ID != uuid.Nil {
			if given == nil {
				given = map[uuid.UUID]int{}
			}
			if j, dup := given[e.ID]; dup {
				return nil, &ferry.ValidationError{Index: i, Field: "event_id",
					Reason: fmt.Sprintf("duplicate of event[%d].event_id (%s): the events of one call need distinct ids", j, e.ID)}
			}
			given[e.ID] = i
		}
		if err := normalize(i, &e, w.cfg.topics, w.cfg.shards, now); err != nil {
			return nil, err
		}
		out[i] = e
	}
	plan, err := planBatch(out)
	if err != nil {
		return nil, err
	}
	if w.cfg.sealer != nil {
		if err := w.seal(ctx, exec, out); err != nil {
			return nil, err
		}
	}
	if w.cfg.offloader != nil {
		if err := w.offload(ctx, out); err != nil {
			return nil, err
		}
	}
	switch {
	case exec.Dialect() == driver.MySQL && !plan.expected && mysqlOneChunk(out):
		// MySQL, the common call: no savepoint, the call undoes its own
		// sequence upserts if its INSERT fails.
		return w.insertMySQLFast(ctx, exec, out, plan)
	case exec.Dialect() == driver.SQLite, exec.Dialect() == driver.MySQL:
		// SQLite and MySQL write a call in several statements and a failed
		// statement does not end the transaction: run the call under a
		// savepoint so that any error (a duplicate id, a cancelled context,
		// a version mismatch) undoes the sequence bumps and rows it made.
		return w.insertChecked(ctx, exec, out, plan)
	case plan.expected && len(plan.aggs) == 1:
		// Postgres, one aggregate: one statement that writes nothing on a
		// mismatch, so no savepoint is needed.
		if err := w.writePostgresExpected(ctx, exec, out); err != nil {
			return nil, w.mapWriteErr(err, out)
		}
		return out, nil
	case plan.expected:
		// Postgres, several aggregates: a caller-supplied version may not
		// match after other aggregates were bumped; the savepoint undoes
		// them and keeps the transaction usable.
		return w.insertChecked(ctx, exec, out, plan)
	}
	// Postgres: one statement; if it fails, it aborts the transaction.
	if err := w.write(ctx, exec, out, plan); err != nil {
		return nil, err
	}
	return out, nil
}

// MaxEventsPerCall bounds one call; larger batches belong in several calls.
const MaxEventsPerCall = 10000

// insertChecked writes events under a savepoint, checks caller-supplied
// versions, and rolls the savepoint back on any error, so that the call
// leaves nothing behind and the transaction usable.
func (w *Writer[TTx]) insertChecked(ctx context.Context, exec driver.Executor, events []ferry.Event, plan batchPlan) ([]ferry.Event, error) {
	stmtCtx := ctx
	if exec.Dialect() == driver.SQLite {
		// No statement of the call is interrupted mid-way (see writeSQLite);
		// ctx is checked between them.
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("outbox: insert: %w", err)
		}
		stmtCtx = context.WithoutCancel(ctx)
	}
	if _, err := exec.Exec(stmtCtx, "SAVEPOINT ferry_outbox_insert"); err != nil {
		return nil, fmt.Errorf("outbox: savepoint: %w", err)
	}
	// Remember what the caller asked for; write() overwrites AggregateSeq.
	want := make([]int64, len(events))
	for i := range events {
		want[i] = events[i].AggregateSeq
	}
	err := w.write(ctx, exec, events, plan)
	if err == nil {
		for i := range events {
			if want[i] != 0 && want[i] != events[i].AggregateSeq {
				e := events[i]
				err = &ferry.SequenceConflictError{TenantID: e.TenantID, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
					Expected: want[i], Next: e.AggregateSeq}
				break
			}
		}
	}
	if err == nil {
		_, relErr := exec.Exec(stmtCtx, "RELEASE SAVEPOINT ferry_outbox_insert")
		if relErr == nil {
			return events, nil
		}
		err = fmt.Errorf("outbox: release savepoint: %w", relErr)
	}
	// Undo, even when ctx is what failed the call.
	undoCtx := context.WithoutCancel(ctx)
	if _, rbErr := exec.Exec(undoCtx, "ROLLBACK TO SAVEPOINT ferry_outbox_insert"); rbErr != nil {
		return nil, errors.Join(err, fmt.Errorf("outbox: rollback to savepoint (roll the transaction back): %w", rbErr))
	}
	if _, relErr := exec.Exec(undoCtx, "RELEASE SAVEPOINT ferry_outbox_insert"); relErr != nil {
		return nil, errors.Join(err, fmt.Errorf("outbox: release savepoint (roll the transaction back): %w", relErr))
	}
	return nil, err
}

// batchPlan groups a call's events by aggregate.
type batchPlan struct {
	aggs     []aggKey // in order of first appearance
	count    map[aggKey]int64
	ord      []int64 // 1-based position of each event within its aggregate
	expected bool    // some event carries a caller-supplied sequence
}

type aggKey struct{ tenant, typ, id string }

func planBatch(events []ferry.Event) (batchPlan, error) {
	p := batchPlan{count: map[aggKey]int64{}, ord: make([]int64, len(events))}
	first := map[aggKey]int64{} // caller-supplied seq of the aggregate's first event
	for i, e := range events {
		k := aggKey{e.TenantID, e.AggregateType, e.AggregateID}
		if _, seen := p.count[k]; !seen {
			p.aggs = append(p.aggs, k)
			first[k] = e.AggregateSeq
		}
		p.count[k]++
		p.ord[i] = p.count[k]
		if e.AggregateSeq != 0 {
			p.expected = true
			// Within one call, supplied sequences must run on consecutively
			// from the aggregate's first event, and all or none are supplied.
			if first[k] == 0 || e.AggregateSeq != first[k]+p.ord[i]-1 {
				return p, &ferry.ValidationError{Index: i, Field: "aggregate_seq",
					Reason: "caller-supplied sequences of one aggregate in one call must all be given and consecutive"}
			}
		} else if first[k] != 0 {
			return p, &ferry.ValidationError{Index: i, Field: "aggregate_seq",
				Reason: "caller-supplied sequences of one aggregate in one call must all be given and consecutive"}
		}
	}
	return p, nil
}

func (w *Writer[TTx]) write(ctx context.Context, exec driver.Executor, events []ferry.Event, plan batchPlan) error {
	var err error
	switch exec.Dialect() {
	case driver.Postgres:
		err = w.writePostgres(ctx, exec, events)
	case driver.SQLite:
		err = w.writeSQLite(ctx, exec, events, plan)
	case driver.MySQL:
		err = w.writeMySQL(ctx, exec, events, plan, nil)
	default:
		err = fmt.Errorf("outbox: unsupported dialect %q", exec.Dialect())
	}
	return w.mapWriteErr(err, events)
}

// mapWriteErr wraps a write's error: a duplicate event id as a
// *ferry.DuplicateEventIDError naming the event, a sequence conflict
// unchanged, anything else (a cancelled context too) as "outbox: insert".
func (w *Writer[TTx]) mapWriteErr(err error, events []ferry.Event) error {
	if err == nil {
		return nil
	}
	var sc *ferry.SequenceConflictError
	var de *ferry.DuplicateEventIDError
	if errors.As(err, &sc) || errors.As(err, &de) {
		return err
	}
	var uv *driver.UniqueViolationError
	if errors.As(err, &uv) && strings.Contains(uv.Constraint, "event_id") {
		return duplicateOf(events, -1, uv.Detail, err)
	}
	return fmt.Errorf("outbox: insert: %w", err)
}

// duplicateOf builds the error for an event id already in the outbox: the
// event at index, or (index < 0) the one whose id the database's detail
// names ("Key (event_id)=(…) already exists."; MySQL: "Duplicate entry
// '…' for key '…event_id_key'").
func duplicateOf(events []ferry.Event, index int, detail string, err error) error {
	if index < 0 {
		if m := detailIDRE.FindStringSubmatch(detail); m != nil {
			if id, perr := uuid.Parse(m[1]); perr == nil {
				for i := range events {
					if events[i].ID == id {
						index = i
						break
					}
				}
			}
		}
	}
	de := &ferry.DuplicateEventIDError{Index: index, Err: err}
	if index >= 0 {
		de.ID = events[index].ID
	}
	return de
}

// detailIDRE reads the id from Postgres's detail "Key (event_id)=(…)" and
// from MySQL/MariaDB's message "Duplicate entry '…' for key …".
var detailIDRE = regexp.MustCompile(`(?:\(event_id\)=\(|Duplicate entry ')([0-9a-fA-F-]{36})[)']`)
