// Package partition manages the time-range partitions of a partitioned
// outbox on Postgres (opt-in at migration time, see migrate.WithPartitionedOutbox
// and docs/PARTITIONING.md): it lists them, creates them ahead of time and
// detaches and drops one whose rows have all been sent, under a guard
// checked while the partition is locked.
//
// It is shared by migrate (the first partitions), the relay (creates
// ahead while it runs) and ops (cleanup), so there is one way to name,
// create and drop a partition.
package partition

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

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
// outbox when the outbox is a plain table.
var ErrNotPartitioned = errors.New("partition: the outbox is not partitioned")

// Part is one partition: rows with From <= created_at < To.
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

// IsPartitioned reports whether the outbox is a partitioned table.
func IsPartitioned(ctx context.Context, exec driver.Executor, t ferry.Tables) (bool, error) {
	if exec.Dialect() != driver.Postgres {
		return false, nil
	}
	var n int64
	_, err := driver.QueryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM pg_partitioned_table pt
JOIN pg_class c ON c.oid = pt.partrelid JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE c.relname = $1 AND s.nspname = %s`, schemaExpr(t)), []any{t.Bare("outbox")}, &n)
	if err != nil {
		return false, fmt.Errorf("partition: is the outbox partitioned: %w", err)
	}
	return n > 0, nil
}

// List returns the outbox's range partitions in bound order. The bounds
// are read from the catalog and cast by the server, so they do not depend
// on the session's time zone. A partition without two timestamp bounds
// (a DEFAULT partition or one FROM MINVALUE a user added) is not listed:
// Ferry neither extends nor drops it.
func List(ctx context.Context, exec driver.Executor, t ferry.Tables) ([]Part, error) {
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT c.relname, b[1]::timestamptz, b[2]::timestamptz
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace s ON s.oid = p.relnamespace,
LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), $$FROM \('([^']+)'\) TO \('([^']+)'\)$$) AS b
WHERE p.relname = $1 AND s.nspname = %s AND b IS NOT NULL
ORDER BY 2`, schemaExpr(t)), t.Bare("outbox"))
	if err != nil {
		return nil, fmt.Errorf("partition: list: %w", err)
	}
	defer rows.Close()
	var out []Part
	for rows.Next() {
		var p Part
		if err := rows.Scan(&p.Name, &p.From, &p.To); err != nil {
			return nil, fmt.Errorf("partition: list: %w", err)
		}
		p.From, p.To = p.From.UTC(), p.To.UTC()
		out = append(out, p)
	}
	return out, rows.Err()
}

// Name is the partition of the outbox starting at from:
// <prefix>outbox_pYYYYMMDD_HHMMSS (UTC).
func Name(t ferry.Tables, from time.Time) string {
	return t.Bare("outbox") + "_p" + from.UTC().Format("20060102_150405")
}

// Interval is the width of the newest partition: the deployment's
// partition interval (set when the outbox was created).
func Interval(parts []Part) (time.Duration, bool) {
	if len(parts) == 0 {
		return 0, false
	}
	last := parts[len(parts)-1]
	return last.To.Sub(last.From), true
}

// Ensure creates the partitions the outbox needs from now on: contiguous
// after the newest one (or, with none yet, from now rounded down to the
// interval) until one ends more than ahead intervals past now. interval 0
// takes the newest partition's width. It is idempotent and safe to run
// from several processes at once: a partition another process created
// meanwhile is not an error. It returns the names it created.
func Ensure(ctx context.Context, exec driver.Executor, t ferry.Tables, now time.Time, interval time.Duration, ahead int) ([]string, error) {
	if exec.Dialect() != driver.Postgres {
		return nil, nil
	}
	parts, err := List(ctx, exec, t)
	if err != nil {
		return nil, err
	}
	if interval == 0 {
		var ok bool
		if interval, ok = Interval(parts); !ok {
			return nil, fmt.Errorf("partition: the outbox has no partition to take the interval from: %w", ErrNotPartitioned)
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
	for ; !from.After(until); from = from.Add(interval) {
		ok, err := Create(ctx, exec, t, from, interval)
		if err != nil {
			return created, err
		}
		if ok {
			created = append(created, Name(t, from))
		}
	}
	return created, nil
}

// Create makes the partition [from, from+interval) unless it (or one
// overlapping it, made by a concurrent creator) exists; created reports
// whether this call made it. Ensure calls it for the partitions ahead;
// it is exported for tools that need a past range (bench cleanup).
func Create(ctx context.Context, exec driver.Executor, t ferry.Tables, from time.Time, interval time.Duration) (created bool, err error) {
	from = from.UTC()
	name := Name(t, from)
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
	q := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
		qualify(t, name), t.Name("outbox"), from.Format(time.RFC3339Nano), from.Add(interval).Format(time.RFC3339Nano))
	if _, err := exec.Exec(ctx, q); err != nil {
		if raced(err) {
			return false, nil // another relay or cleanup created it (or an overlapping one) meanwhile
		}
		return false, fmt.Errorf("partition: create %s: %w", name, err)
	}
	return true, nil
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
	// Cutoff: the partition must end at or before it, and every sent row
	// in it must have been published before it (now minus the retention,
	// which cleanup has already checked against the replay window).
	Cutoff time.Time
	// DiscardedBefore, when set, lets discarded dead letters whose discard
	// is older than it go with the partition; otherwise any dead row keeps
	// the partition (a dead letter is work for an operator).
	DiscardedBefore *time.Time
	// Unguarded skips the row checks (unsent rows, publication inside the
	// window): the negative control of the guard's tests, never set by
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
	// ExclusiveMillis is how long the outbox was locked exclusively for
	// the detach and drop: from the DETACH statement (its lock wait
	// included) to the commit. Producers wait this long at most.
	ExclusiveMillis float64 `json:"exclusive_ms,omitempty"`
}

// DB is what Drop needs: transactions and a plain executor (both
// Postgres drivers satisfy it).
type DB interface {
	Begin(ctx context.Context) (driver.Tx, error)
	Executor() driver.Executor
}

// LockTimeout bounds how long Drop waits for the locks it needs: the
// detach takes an ACCESS EXCLUSIVE lock on the outbox for a moment, and a
// lock request that waits blocks every producer queued behind it. A
// partition whose lock is not granted in time is left for the next run.
const LockTimeout = 2 * time.Second

// Drop detaches and drops partition p if the guard holds: in one
// transaction the partition is locked against writers first (SHARE ROW
// EXCLUSIVE: an operator's replay or retry cannot change a row between
// the check and the detach; readers are not blocked), checked, and
// detached; the detached table is dropped after that commit. With dryRun it only checks. A partition that
// does not pass is kept, with the reason; that is not an error.
func Drop(ctx context.Context, db DB, t ferry.Tables, p Part, g Guard, dryRun bool) (Verdict, error) {
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
		// Both checks read partial indexes of the partition
		// (outbox_unsent_id_idx, outbox_sent_idx), not its rows.
		discarded, args := "false", []any{}
		if g.DiscardedBefore != nil {
			discarded, args = "(status = 'dead' AND discarded_at IS NOT NULL AND discarded_at < $1)", []any{*g.DiscardedBefore}
		}
		unsentSQL := fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE status <> 'sent' AND NOT %s)`, name, discarded)
		var hasWM bool
		if _, err := driver.QueryRow(ctx, tx, `SELECT to_regclass($1) IS NOT NULL`, []any{t.Name("relay_watermarks")}, &hasWM); err != nil {
			return v, fmt.Errorf("partition: check %s: %w", p.Name, err)
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
			return v, fmt.Errorf("partition: check %s: %w", p.Name, err)
		}
		if unsent {
			v.Kept = "holds a row that is not sent (pending, or a dead letter not discarded)"
			return v, nil
		}
		var late bool
		if _, err := driver.QueryRow(ctx, tx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE status = 'sent' AND published_at >= $1)`, name), []any{g.Cutoff}, &late); err != nil {
			return v, fmt.Errorf("partition: check %s: %w", p.Name, err)
		}
		if late {
			v.Kept = "holds a row published inside the retention"
			return v, nil
		}
	}
	if dryRun {
		v.Dropped = true // would be
		return v, nil
	}
	// The detach commits on its own so the outbox's exclusive lock lasts
	// only as long as the catalog change; dropping the detached table
	// (unlinking its files, which takes a while for a large one) then
	// locks nothing producers or the relay use. A detached partition
	// whose drop did not happen is dropped by the next DropDetached.
	t0 := time.Now()
	if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, t.Name("outbox"), name)); err != nil {
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

// DropDetached drops tables named like the outbox's partitions that are
// no longer attached to it: partitions Drop detached whose own drop did
// not happen (a crash between the two). It returns their names.
func DropDetached(ctx context.Context, exec driver.Executor, t ferry.Tables) ([]string, error) {
	if exec.Dialect() != driver.Postgres {
		return nil, nil
	}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE s.nspname = %s AND c.relkind = 'r' AND c.relname ~ $1
  AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)`, schemaExpr(t)), "^"+t.Bare("outbox")+`_p[0-9]{8}_[0-9]{6}$`)
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
