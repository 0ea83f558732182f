// Package driver is the seam between Ferry's core and a database library.
//
// Ferry's SQL lives in the core packages (outbox, relay, inbox, …), written
// once per [Dialect]; a driver only moves statements and rows. That keeps the
// pgx, database/sql and SQLite paths on one core, as river's riverdriver does:
//
//   - [github.com/ferryhq/ferry/driver/pgxv5]: pgx v5 pool and pgx.Tx.
//   - [github.com/ferryhq/ferry/driver/databasesql]: *sql.DB and *sql.Tx in
//     any dialect; it links no database client (register your own).
//   - [github.com/ferryhq/ferry/driver/sqlite]: SQLite through
//     modernc.org/sqlite, over the databasesql core.
//   - [github.com/ferryhq/ferry/driver/mysql]: MySQL 8 and MariaDB 10.6+
//     through github.com/go-sql-driver/mysql, over the databasesql core.
//
// Statements use $1, $2… placeholders and "double-quoted" identifiers in
// every dialect; for MySQL the databasesql core rewrites them to ? (with the
// arguments reordered) and `backticks` before sending.
package driver

import (
	"context"
	"errors"
)

// Dialect selects which SQL the core sends.
type Dialect string

// The dialects Ferry speaks.
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
	// MySQL is MySQL 8 and MariaDB 10.6+ (one dialect; the differences
	// live in driver/mysql and the migrations).
	MySQL Dialect = "mysql"
)

// Executor runs statements, either on a pool or inside a transaction.
type Executor interface {
	Dialect() Dialect
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// Query runs a statement that returns rows. The caller must Close them.
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Rows is the narrow row iterator Ferry needs.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Tx is an Executor bound to a transaction the core started itself.
// Rollback after Commit is a no-op, so `defer tx.Rollback(ctx)` is the idiom.
type Tx interface {
	Executor
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Driver adapts one database library. TTx is that library's transaction
// type (pgx.Tx or *sql.Tx), so callers pass their own transaction as is.
type Driver[TTx any] interface {
	Dialect() Dialect
	// Executor runs statements on the pool, each in its own transaction.
	Executor() Executor
	// UnwrapExecutor runs statements inside the caller's transaction.
	UnwrapExecutor(tx TTx) Executor
	// Begin starts a transaction owned by the core.
	Begin(ctx context.Context) (Tx, error)
	// BeginTx starts a transaction and also returns it as the caller's
	// type, for APIs that hand the transaction to user code (handlers).
	BeginTx(ctx context.Context) (TTx, Tx, error)
}

// PoolSizer is implemented by drivers that know their pool's connection
// cap (pgxv5: pgxpool's MaxConns; databasesql: SetMaxOpenConns). The inbox
// and the relay read it at start to warn when the pool cannot serve their
// workers.
type PoolSizer interface {
	// MaxConns is the most connections the pool opens; 0 means no cap.
	MaxConns() int
}

// MaxConns returns d's pool cap when d reports one (a PoolSizer with a
// non-zero cap).
func MaxConns(d any) (int, bool) {
	ps, ok := d.(PoolSizer)
	if !ok {
		return 0, false
	}
	n := ps.MaxConns()
	return n, n > 0
}

// ErrUniqueViolation is wrapped by drivers when a statement broke a unique
// constraint; the core maps it to a domain error (e.g. duplicate event id).
var ErrUniqueViolation = errors.New("driver: unique constraint violated")

// UniqueViolationError carries the constraint name when the database names
// it: Postgres's constraint name, or SQLite's "table.column, …" list.
type UniqueViolationError struct {
	Constraint string
	// Detail is the database's description of the conflicting key when it
	// gives one (Postgres: "Key (event_id)=(…) already exists.").
	Detail string
	Err    error
}

func (e *UniqueViolationError) Error() string {
	if e.Constraint == "" {
		return "driver: unique constraint violated: " + e.Err.Error()
	}
	return "driver: unique constraint " + e.Constraint + " violated: " + e.Err.Error()
}

// Unwrap returns the database's own error.
func (e *UniqueViolationError) Unwrap() error { return e.Err }

// Is reports ErrUniqueViolation.
func (e *UniqueViolationError) Is(target error) bool { return target == ErrUniqueViolation }

// Rebind turns $n placeholders into the form a dialect wants. Postgres and
// SQLite accept $n, so it returns sql unchanged. MySQL's ? placeholders
// cannot say which argument they take, so its rewrite also reorders the
// arguments: the databasesql core does it for every MySQL statement (cached
// per Driver), and Rebind leaves sql unchanged for MySQL too.
func Rebind(_ Dialect, sql string) string { return sql }

// ErrDeadlock is wrapped by drivers when the database chose the statement's
// transaction as a deadlock victim (MySQL/MariaDB error 1213). InnoDB has
// rolled the whole transaction back: the caller retries it from the start.
var ErrDeadlock = errors.New("driver: deadlock, transaction rolled back")

// ErrLockTimeout is wrapped by drivers when a statement waited longer than
// the database's lock wait timeout (MySQL/MariaDB error 1205,
// innodb_lock_wait_timeout). InnoDB rolls back only the statement unless
// innodb_rollback_on_timeout is on; the transaction may be retried.
var ErrLockTimeout = errors.New("driver: lock wait timeout")

// QueryRow runs sql on exec and scans its first row into dest. found is
// false, and dest untouched, when there is no row; further rows are
// ignored. The rows are closed before their error is read, so an error the
// statement raised after its first row (a data-modifying statement) is
// returned too.
func QueryRow(ctx context.Context, exec Executor, sql string, args []any, dest ...any) (found bool, err error) {
	rows, err := exec.Query(ctx, sql, args...)
	if err != nil {
		return false, err
	}
	found = rows.Next()
	if found {
		err = rows.Scan(dest...)
	}
	rows.Close()
	if err != nil {
		return found, err
	}
	return found, rows.Err()
}
