// Package partition manages the time-range partitions of Ferry's
// partitioned tables on Postgres (opt-in at migration time, see
// migrate.WithPartitionedOutbox, migrate.WithPartitionedInbox and
// docs/PARTITIONING.md): it lists them, creates them ahead of time and
// detaches and drops one whose rows are past the retention, under a guard
// checked while the partition is locked.
//
// Two tables are partitioned, each by a time range of its own key: the
// outbox by created_at (timestamp bounds), the inbox by event_id (UUIDv7
// bounds: the first 48 bits of a UUIDv7 are its Unix milliseconds and
// Postgres orders uuids bytewise, so the ids of [T, T+interval) lie
// between the UUIDv7 prefixes of T and T+interval). The inbox's key must
// be event_id because its primary key (consumer, tenant_id, event_id) is
// the dedup guarantee (G4) and Postgres enforces uniqueness per partition
// only.
//
// It is shared by migrate (the first partitions), the relays and the
// inbox consumer (create ahead while they run) and ops (cleanup), so
// there is one way to name, create and drop a partition.
package partition

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/outboxstate"
)

// Limits of the partition interval. Below a second the names (one per
// second at most) would collide; a partition per year is the coarsest
// that still lets cleanup drop anything.
const (
	MinInterval = time.Second
	MaxInterval = 366 * 24 * time.Hour
	// DefaultAhead is how many partitions beyond the current one are kept
	// in existence: with daily partitions a week of producer writes
	// survives a relay (and cleanup) that is down.
	DefaultAhead = 7
)

// ErrNotPartitioned is returned by operations that need a partitioned
// table when the table is a plain one.
var ErrNotPartitioned = errors.New("partition: the table is not partitioned")

// ErrDefaultHoldsRange: a range partition of the inbox could not be
// created because its DEFAULT partition holds rows whose event ids fall in
// that range (ids that are not UUIDv7s but look like that time, or a
// producer clock ahead of the partitions made). Postgres refuses such a
// partition. Dedup is not affected: the range's claims keep going to the
// default partition, whose rows the row-by-row cleanup deletes. See
// *DefaultRowsError.
var ErrDefaultHoldsRange = errors.New("partition: the default partition holds rows of the range")

// DefaultRowsError names the ranges Ensure could not create because the
// default partition holds rows of them; Ensure created the others.
type DefaultRowsError struct {
	Table Table
	Parts []Part // the ranges not created
}

func (e *DefaultRowsError) Error() string {
	names := make([]string, len(e.Parts))
	for i, p := range e.Parts {
		names[i] = fmt.Sprintf("%s [%s, %s)", p.Name, p.From.Format(time.RFC3339), p.To.Format(time.RFC3339))
	}
	return fmt.Sprintf("partition: not created, the %s's default partition holds rows whose event ids fall in their range "+
		"(claims of that range stay in the default partition, deduplicated as before, until cleanup deletes them): %s",
		e.Table, strings.Join(names, ", "))
}

// Is reports ErrDefaultHoldsRange.
func (e *DefaultRowsError) Is(target error) bool { return target == ErrDefaultHoldsRange }

// Table is one of Ferry's tables that can be range partitioned; its value
// is the table's base name in ferry.Tables.
type Table string

// The partitioned tables.
const (
	// Outbox: PARTITION BY RANGE (created_at), timestamptz bounds, no
	// default partition (a write past the partitions fails).
	Outbox Table = "outbox"
	// Inbox: PARTITION BY RANGE (event_id), UUIDv7-prefix bounds, and a
	// DEFAULT partition for ids that are not UUIDv7s or fall outside the
	// ranges made (never dropped).
	Inbox Table = "inbox"
)

// Key is the kind of a partitioned table's range bounds.
type Key int

const (
	// TimeKey bounds are timestamptz values.
	TimeKey Key = iota
	// UUIDv7Key bounds are uuids made of a time's Unix milliseconds in
	// the first 48 bits and zeros after: every UUIDv7 of [T, U) lies in
	// [prefix(T), prefix(U)).
	UUIDv7Key
)

// Key is tb's bound kind.
func (tb Table) Key() Key {
	if tb == Inbox {
		return UUIDv7Key
	}
	return TimeKey
}

// column is tb's partition key column.
func (tb Table) column() string {
	if tb.Key() == UUIDv7Key {
		return "event_id"
	}
	return "created_at"
}

// bound renders the time at as a bound literal of tb's key.
func (tb Table) bound(at time.Time) string {
	if tb.Key() == UUIDv7Key {
		return UUIDv7Prefix(at)
	}
	return at.UTC().Format(time.RFC3339Nano)
}

// UUIDv7Prefix is the smallest uuid of the UUIDv7s made at at's
// millisecond: its 48-bit Unix milliseconds, then zeros (also in the
// version and variant bits, so it sorts before every id of that
// millisecond). Times before 1970 are clamped to the zero uuid.
func UUIDv7Prefix(at time.Time) string {
	ms := max(at.UnixMilli(), 0)
	return fmt.Sprintf("%08x-%04x-0000-0000-000000000000", (ms>>16)&0xffffffff, ms&0xffff)
}

// Part is one partition: rows whose key lies in [From, To) (for the
// inbox: event ids made in that time).
type Part struct {
	Name string    `json:"name"` // unqualified table name
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// CheckInterval validates a partition interval, naming the field.
func CheckInterval(field string, d time.Duration) error {
	if d < MinInterval || d > MaxInterval || d%time.Second != 0 {
		return &ferry.ConfigError{Field: field, Reason: fmt.Sprintf("must be a whole number of seconds between %s and %s", MinInterval, MaxInterval)}
	}
	return nil
}

// schemaExpr is the catalog expression of the tables' schema.
func schemaExpr(t ferry.Tables) string {
	if t.Schema != "" {
		return "'" + t.Schema + "'" // validated identifier (Tables.Check)
	}
	return "current_schema()"
}

// IsPartitioned reports whether tb is a partitioned table.
func IsPartitioned(ctx context.Context, exec driver.Executor, t ferry.Tables, tb Table) (bool, error) {
	if exec.Dialect() != driver.Postgres {
		return false, nil
	}
	var n int64
	_, err := driver.QueryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM pg_partitioned_table pt
JOIN pg_class c ON c.oid = pt.partrelid JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE c.relname = $1 AND s.nspname = %s`, schemaExpr(t)), []any{t.Bare(string(tb))}, &n)
	if err != nil {
		return false, fmt.Errorf("partition: is the %s partitioned: %w", tb, err)
	}
	return n > 0, nil
}

// List returns tb's range partitions in bound order. The server turns
// each bound into Unix microseconds — a timestamp's exactly (independent
// of the session's time zone and date style), a UUIDv7 bound's from its
// first 48 bits — so both kinds read alike. A partition without two
// literal bounds (a DEFAULT partition, or one FROM MINVALUE a user added)
// is not listed: Ferry neither extends nor drops it.
func List(ctx context.Context, exec driver.Executor, t ferry.Tables, tb Table) ([]Part, error) {
	micros := "(extract(epoch FROM %s::timestamptz) * 1000000)::bigint"
	if tb.Key() == UUIDv7Key {
		micros = "('x' || left(replace(%s, '-', ''), 12))::bit(48)::bigint * 1000"
	}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT c.relname, %[2]s, %[3]s
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace s ON s.oid = p.relnamespace,
LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), $$FROM \('([^']+)'\) TO \('([^']+)'\)$$) AS b
WHERE p.relname = $1 AND s.nspname = %[1]s AND b IS NOT NULL
ORDER BY 2`, schemaExpr(t), fmt.Sprintf(micros, "b[1]"), fmt.Sprintf(micros, "b[2]")), t.Bare(string(tb)))
	if err != nil {
		return nil, fmt.Errorf("partition: list %s: %w", tb, err)
	}
	defer rows.Close()
	var out []Part
	for rows.Next() {
		var p Part
		var from, to int64
		if err := rows.Scan(&p.Name, &from, &to); err != nil {
			return nil, fmt.Errorf("partition: list %s: %w", tb, err)
		}
		p.From, p.To = time.UnixMicro(from).UTC(), time.UnixMicro(to).UTC()
		out = append(out, p)
	}
	return out, rows.Err()
}

// Name is tb's partition starting at from:
// <prefix><table>_pYYYYMMDD_HHMMSS (UTC).
func Name(t ferry.Tables, tb Table, from time.Time) string {
	return t.Bare(string(tb)) + "_p" + from.UTC().Format("20060102_150405")
}

// DefaultName is the inbox's DEFAULT partition: <prefix>inbox_default.
// Made by the migration, never dropped.
func DefaultName(t ferry.Tables, tb Table) string { return t.Bare(string(tb)) + "_default" }

// Interval is the width of the newest partition: the deployment's
// partition interval (set when the table was created).
func Interval(parts []Part) (time.Duration, bool) {
	if len(parts) == 0 {
		return 0, false
	}
	last := parts[len(parts)-1]
	return last.To.Sub(last.From), true
}

// Ensure creates the partitions tb needs from now on: contiguous after
// the newest one (or, with none yet, from now rounded down to the
// interval) until one ends more than ahead intervals past now. interval 0
// takes the newest partition's width. It is idempotent and safe to run
// from several processes at once: a partition another process created
// meanwhile is not an error. It returns the names it created.
//
// An inbox range whose rows are already in the default partition cannot
// be created (ErrDefaultHoldsRange): Ensure skips it, creates the ranges
// after it, and returns a *DefaultRowsError naming what it skipped along
// with what it created. Once a later range exists the skipped one lies
// before the newest partition and is not tried again: its claims live in
// the default partition.
func Ensure(ctx context.Context, exec driver.Executor, t ferry.Tables, tb Table, now time.Time, interval time.Duration, ahead int) ([]string, error) {
	if exec.Dialect() != driver.Postgres {
		return nil, nil
	}
	parts, err := List(ctx, exec, t, tb)
	if err != nil {
		return nil, err
	}
	if interval == 0 {
		var ok bool
		if interval, ok = Interval(parts); !ok {
			return nil, fmt.Errorf("partition: the %s has no partition to take the interval from: %w", tb, ErrNotPartitioned)
		}
	}
	if err := CheckInterval("partition_interval", interval); err != nil {
		return nil, err
	}
	if ahead < 1 {
		ahead = 1
	}
	now = now.UTC()
	from := now.Truncate(interval)
	if len(parts) > 0 {
		from = parts[len(parts)-1].To
	}
	until := now.Add(time.Duration(ahead) * interval)
	var created []string
	var blocked []Part
	for ; !from.After(until); from = from.Add(interval) {
		ok, err := Create(ctx, exec, t, tb, from, interval)
		if errors.Is(err, ErrDefaultHoldsRange) {
			blocked = append(blocked, Part{Name: Name(t, tb, from), From: from, To: from.Add(interval)})
			continue
		}
		if err != nil {
			return created, err
		}
		if ok {
			created = append(created, Name(t, tb, from))
		}
	}
	if len(blocked) > 0 {
		return created, &DefaultRowsError{Table: tb, Parts: blocked}
	}
	return created, nil
}

// Create makes tb's partition [from, from+interval) unless it (or one
// overlapping it, made by a concurrent creator) exists; created reports
// whether this call made it. Ensure calls it for the partitions ahead;
// it is exported for tools and tests that need a past range.
//
// For the inbox, Postgres scans the DEFAULT partition for rows of the new
// range while it holds the default's lock (claims routed to the default
// wait meanwhile), and refuses the partition if there are any. Create
// checks first, so that inside migrate's transaction the refusal does not
// abort it, and returns an error wrapping ErrDefaultHoldsRange either way.
func Create(ctx context.Context, exec driver.Executor, t ferry.Tables, tb Table, from time.Time, interval time.Duration) (created bool, err error) {
	from = from.UTC()
	name := Name(t, tb, from)
	// An existing name is not made again (and not reported as made). IF
	// NOT EXISTS stays: inside migrate's transaction a duplicate_table
	// error from a relay that created it meanwhile would abort the
	// migration, where IF NOT EXISTS only notices.
	var exists bool
	if _, err := driver.QueryRow(ctx, exec, `SELECT to_regclass($1) IS NOT NULL`, []any{qualify(t, name)}, &exists); err != nil {
		return false, fmt.Errorf("partition: look up %s: %w", name, err)
	}
	if exists {
		return false, nil
	}
	lo, hi := tb.bound(from), tb.bound(from.Add(interval))
	if tb.Key() == UUIDv7Key {
		// Looked up first: naming a missing table would abort migrate's
		// transaction. A uuid range over the default's rows: a scan, the
		// same one Postgres makes for the CREATE below.
		def := qualify(t, DefaultName(t, tb))
		var hasDefault, inDefault bool
		if _, err := driver.QueryRow(ctx, exec, `SELECT to_regclass($1) IS NOT NULL`, []any{def}, &hasDefault); err != nil {
			return false, fmt.Errorf("partition: look up %s: %w", def, err)
		}
		if hasDefault {
			if _, err := driver.QueryRow(ctx, exec, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s WHERE %[2]s >= $1::uuid AND %[2]s < $2::uuid)`,
				def, tb.column()), []any{lo, hi}, &inDefault); err != nil {
				return false, fmt.Errorf("partition: check the default partition for %s: %w", name, err)
			}
		}
		if inDefault {
			return false, fmt.Errorf("partition: create %s: %w", name, ErrDefaultHoldsRange)
		}
	}
	q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
		qualify(t, name), t.Name(string(tb)), lo, hi)
	if tb.Key() == UUIDv7Key {
		// CREATE TABLE … PARTITION OF locks the whole inbox ACCESS
		// EXCLUSIVE while Postgres scans the default partition, so every
		// claim would wait for that scan. A table created alone and then
		// attached needs only SHARE UPDATE EXCLUSIVE on the inbox: claims
		// of the ranges go on, and only those routed to the default (whose
		// ACCESS EXCLUSIVE lock the scan holds) wait. One DO statement, so
		// both steps are one transaction with any driver. The inbox's SHARE
		// UPDATE EXCLUSIVE lock comes first: it conflicts with itself, so
		// concurrent creators take turns (two CREATE TABLE IF NOT EXISTS
		// at once can fail on the catalog's unique index), and a later one
		// finds the table made and attached, and leaves it (reported as
		// created all the same: the check above ran before the wait).
		q = fmt.Sprintf(`DO $ferry$
BEGIN
    LOCK TABLE %[2]s IN SHARE UPDATE EXCLUSIVE MODE;
    CREATE TABLE IF NOT EXISTS %[1]s (LIKE %[2]s INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
    IF NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = '%[1]s'::regclass) THEN
        ALTER TABLE %[2]s ATTACH PARTITION %[1]s FOR VALUES FROM ('%[3]s') TO ('%[4]s');
    END IF;
END
$ferry$`, qualify(t, name), t.Name(string(tb)), lo, hi)
	}
	if _, err := exec.Exec(ctx, q); err != nil {
		if raced(err) {
			return false, nil // another relay or cleanup created it (or an overlapping one) meanwhile
		}
		if checkViolation(err) {
			// A claim of the range reached the default partition after
			// the check above.
			return false, fmt.Errorf("partition: create %s: %w (%w)", name, ErrDefaultHoldsRange, err)
		}
		return false, fmt.Errorf("partition: create %s: %w", name, err)
	}
	return true, nil
}

// checkViolation reports check_violation (23514): Postgres' "updated
// partition constraint for default partition would be violated".
func checkViolation(err error) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == "23514"
}

// raced reports the errors a concurrent creator of the same partition
// causes: duplicate_table (42P07), or an overlap with a partition it
// created under the same name a moment earlier (42P17).
func raced(err error) bool {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		switch coded.SQLState() {
		case "42P07", "42P17":
			return true
		}
	}
	return strings.Contains(err.Error(), "already exists")
}

// qualify is a partition's schema-qualified, quoted name.
func qualify(t ferry.Tables, name string) string {
	if t.Schema != "" {
		return `"` + t.Schema + `"."` + name + `"`
	}
	return `"` + name + `"`
}

// Guard is what must hold for a partition to be dropped.
type Guard struct {
	// Cutoff: the partition must end at or before it (now minus the
	// retention, which cleanup has already checked against the replay
	// window), and its rows must be past it: in the outbox every row sent
	// and published before it; in the inbox every claim applied before it
	// (an old event replayed recently keeps its dedup row, and with it the
	// partition).
	Cutoff time.Time
	// DiscardedBefore (outbox only), when set, lets discarded dead
	// letters whose discard is older than it go with the partition;
	// otherwise any dead row keeps the partition (a dead letter is work
	// for an operator).
	DiscardedBefore *time.Time
	// Unguarded skips the row checks (unsent rows, publication or claims
	// inside the window): the negative control of the guard's tests, never set by
	// Ferry itself.
	Unguarded bool
}

// Verdict is what Drop decided for one partition.
type Verdict struct {
	Part
	Dropped bool `json:"dropped"`
	// RowsEstimate is the planner's row count of the partition
	// (pg_class.reltuples): counting a day's rows exactly would read them all.
	RowsEstimate int64 `json:"rows_estimate"`
	// Kept says why a partition that ended before the cutoff stays.
	Kept string `json:"kept,omitempty"`
	// ExclusiveMillis is how long the table (outbox or inbox) was locked
	// exclusively for the detach: from the DETACH statement (its lock wait
	// included) to the commit. Its writers wait this long at most.
	ExclusiveMillis float64 `json:"exclusive_ms,omitempty"`
}

// DB is what Drop needs: transactions and a plain executor (both
// Postgres drivers satisfy it).
type DB interface {
	Begin(ctx context.Context) (driver.Tx, error)
	Executor() driver.Executor
}

// LockTimeout bounds how long Drop waits for the locks it needs: the
// detach takes an ACCESS EXCLUSIVE lock on the table for a moment, and a
// lock request that waits blocks every producer queued behind it. A
// partition whose lock is not granted in time is left for the next run.
const LockTimeout = 2 * time.Second

// Drop detaches and drops tb's partition p if the guard holds: in one
// transaction the partition is locked against writers first (SHARE ROW
// EXCLUSIVE: an operator's replay or retry of the outbox, a consumer's
// claim of an old event in the inbox, cannot change a row between the
// check and the detach; readers are not blocked), checked, and detached;
// the detached table is dropped after that commit. With dryRun it only
// checks. A partition that does not pass is kept, with the reason; that
// is not an error. The inbox's default partition is never listed, so
// never dropped.
func Drop(ctx context.Context, db DB, t ferry.Tables, tb Table, p Part, g Guard, dryRun bool) (Verdict, error) {
	v := Verdict{Part: p}
	if p.To.After(g.Cutoff) {
		v.Kept = "ends inside the retention"
		return v, nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return v, fmt.Errorf("partition: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	name := qualify(t, p.Name)
	if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, LockTimeout.Milliseconds())); err != nil {
		return v, fmt.Errorf("partition: %s: %w", p.Name, err)
	}
	if !dryRun {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE`, name)); err != nil {
			return v, fmt.Errorf("partition: lock %s: %w", p.Name, err)
		}
	}
	var est float64
	if _, err := driver.QueryRow(ctx, tx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, []any{name}, &est); err != nil {
		return v, fmt.Errorf("partition: %s: %w", p.Name, err)
	}
	v.RowsEstimate = max(0, int64(est))
	if !g.Unguarded {
		var kept string
		switch tb {
		case Outbox:
			kept, err = outboxGuard(ctx, tx, t, name, g)
		case Inbox:
			kept, err = inboxGuard(ctx, tx, name, g.Cutoff)
		default:
			err = fmt.Errorf("no guard for table %q", tb)
		}
		if err != nil {
			return v, fmt.Errorf("partition: check %s: %w", p.Name, err)
		}
		if kept != "" {
			v.Kept = kept
			return v, nil
		}
	}
	if dryRun {
		v.Dropped = true // would be
		return v, nil
	}
	// The detach commits on its own so the table's exclusive lock lasts
	// only as long as the catalog change; dropping the detached table
	// (unlinking its files, which takes a while for a large one) then
	// locks nothing producers, the relay or consumers use. A detached partition
	// whose drop did not happen is dropped by the next DropDetached.
	t0 := time.Now()
	if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, t.Name(string(tb)), name)); err != nil {
		return v, fmt.Errorf("partition: detach %s: %w", p.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return v, fmt.Errorf("partition: commit detach of %s: %w", p.Name, err)
	}
	v.ExclusiveMillis = float64(time.Since(t0).Microseconds()) / 1000
	v.Dropped = true
	if _, err := db.Executor().Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s`, name)); err != nil {
		return v, fmt.Errorf("partition: drop detached %s (dropped by the next cleanup): %w", p.Name, err)
	}
	return v, nil
}

// DropDetached drops tables named like tb's partitions that are no
// longer attached to it: partitions Drop detached whose own drop did not
// happen (a crash between the two). It returns their names.
func DropDetached(ctx context.Context, exec driver.Executor, t ferry.Tables, tb Table) ([]string, error) {
	if exec.Dialect() != driver.Postgres {
		return nil, nil
	}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE s.nspname = %s AND c.relkind = 'r' AND c.relname ~ $1
  AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)`, schemaExpr(t)), "^"+t.Bare(string(tb))+`_p[0-9]{8}_[0-9]{6}$`)
	if err != nil {
		return nil, fmt.Errorf("partition: list detached: %w", err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, err := exec.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s`, qualify(t, n))); err != nil {
			return nil, fmt.Errorf("partition: drop detached %s: %w", n, err)
		}
	}
	return names, nil
}

// outboxGuard says why an outbox partition must stay ("" when it may go):
// a row that is not sent (pending, or a dead letter not discarded before
// g.DiscardedBefore), or one published at or after g.Cutoff.
func outboxGuard(ctx context.Context, tx driver.Tx, t ferry.Tables, name string, g Guard) (string, error) {
	// Both checks read partial indexes of the partition
	// (outbox_unsent_id_idx, outbox_sent_idx), not its rows.
	discarded, args := "false", []any{}
	if g.DiscardedBefore != nil {
		discarded, args = "(status = 'dead' AND discarded_at IS NOT NULL AND discarded_at < $1)", []any{*g.DiscardedBefore}
	}
	unsentSQL := fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE status <> 'sent' AND NOT %s)`, name, discarded)
	var hasWM bool
	if _, err := driver.QueryRow(ctx, tx, `SELECT to_regclass($1) IS NOT NULL`, []any{t.Name("relay_watermarks")}, &hasWM); err != nil {
		return "", err
	}
	if hasWM {
		// The watermark design (relay.WithSentWatermark) leaves sent
		// rows 'pending': a shard's pending rows are sent up to the
		// highest watermark recorded before the cutoff (so also
		// published before it). Per shard, the partition's highest
		// pending id (outbox_claim_idx, read backwards) must be at or
		// below that.
		n := len(args) + 1
		unsentSQL = fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s WHERE status NOT IN ('sent', 'pending') AND NOT %[2]s)
    OR EXISTS (SELECT 1 FROM generate_series(0, COALESCE((SELECT max(shard) FROM %[1]s WHERE status = 'pending'), -1)) AS s(shard)
        WHERE (SELECT max(x.id) FROM %[1]s x WHERE x.status = 'pending' AND x.shard = s.shard) > %[3]s)`,
			name, discarded, outboxstate.SentBefore(t, "s.shard", fmt.Sprintf("$%d", n)))
		args = append(args, g.Cutoff)
	}
	var unsent bool
	if _, err := driver.QueryRow(ctx, tx, unsentSQL, args, &unsent); err != nil {
		return "", err
	}
	if unsent {
		return "holds a row that is not sent (pending, or a dead letter not discarded)", nil
	}
	var late bool
	if _, err := driver.QueryRow(ctx, tx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE status = 'sent' AND published_at >= $1)`, name), []any{g.Cutoff}, &late); err != nil {
		return "", err
	}
	if late {
		return "holds a row published inside the retention", nil
	}
	return "", nil
}

// inboxGuard says why an inbox partition must stay ("" when it may go):
// a claim applied at or after cutoff — an event of the partition's old
// range delivered or replayed inside the retention, whose dedup row must
// absorb the next redelivery. It reads each consumer's newest claim on
// the partition's (consumer, applied_at) index, hopping from consumer to
// consumer (a loose index scan), instead of every row.
func inboxGuard(ctx context.Context, tx driver.Tx, name string, cutoff time.Time) (string, error) {
	var late bool
	_, err := driver.QueryRow(ctx, tx, fmt.Sprintf(`WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM %[1]s ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT x.consumer FROM %[1]s x WHERE x.consumer > c.consumer ORDER BY x.consumer LIMIT 1) FROM c WHERE c.consumer IS NOT NULL
)
SELECT EXISTS (SELECT 1 FROM c WHERE c.consumer IS NOT NULL
    AND (SELECT max(y.applied_at) FROM %[1]s y WHERE y.consumer = c.consumer) >= $1)`, name), []any{cutoff}, &late)
	if err != nil {
		return "", err
	}
	if late {
		return "holds a claim applied inside the retention (an old event delivered or replayed recently: its dedup row stays)", nil
	}
	return "", nil
}

// UUIDv7At is a random UUIDv7 whose time is at's millisecond: an event id
// as a producer with that clock makes it. Tests and benchmarks use it to
// put claims into a chosen inbox partition; Ferry's writers use
// uuid.NewV7.
func UUIDv7At(at time.Time) (uuid.UUID, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return id, fmt.Errorf("partition: %w", err)
	}
	ms := max(at.UnixMilli(), 0)
	for i := 5; i >= 0; i-- {
		id[i] = byte(ms)
		ms >>= 8
	}
	return id, nil
}
