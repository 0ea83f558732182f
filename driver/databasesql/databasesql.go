// Package databasesql is Ferry's driver for database/sql: Postgres through
// pgx's stdlib driver ("pgx") and SQLite through modernc.org/sqlite ("sqlite").
//
// For SQLite, open the database with a busy timeout and immediate
// transactions so concurrent writers queue instead of failing, e.g.
// "file:app.db?_pragma=busy_timeout(60000)&_pragma=journal_mode(WAL)&_txlock=immediate&_time_format=sqlite".
// [OpenSQLite] does that for you.
package databasesql

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/ferryhq/ferry/driver"
)

// Driver implements driver.Driver[*sql.Tx].
type Driver struct {
	db      *sql.DB
	dialect driver.Dialect
}

var _ driver.Driver[*sql.Tx] = (*Driver)(nil)

// New returns a driver over db speaking dialect (driver.Postgres or
// driver.SQLite). db may be nil when only UnwrapExecutor is used.
func New(db *sql.DB, dialect driver.Dialect) *Driver {
	return &Driver{db: db, dialect: dialect}
}

// SQLiteBusyTimeout is how long a SQLite connection opened by [OpenSQLite]
// waits for a lock held by another connection or process before it fails
// with SQLITE_BUSY: SQLite's busy timeout, and the bound on retrying a
// connection's opening.
const SQLiteBusyTimeout = 60 * time.Second

// OpenSQLite opens (creating if needed) the SQLite file at path with the
// settings Ferry relies on: WAL, a busy timeout, immediate transactions
// (writers serialise at BEGIN, which is what makes per-aggregate sequencing
// safe) and a sortable time format.
//
// Opening a connection to a fresh file switches it to WAL, a write that
// SQLite refuses with SQLITE_BUSY at once, without waiting for the busy
// timeout, when another connection switches it at the same moment (two
// `ferry migrate up` processes on a new file). Such openings are retried
// until SQLiteBusyTimeout; by then the other connection has made the file
// WAL and the retry finds nothing to switch.
func OpenSQLite(path string) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", SQLiteBusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	q.Set("_time_format", "sqlite")
	c, err := sqlite.NewConnector("file:" + path + "?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("databasesql: open sqlite %s: %w", path, err)
	}
	return sql.OpenDB(&busyRetryConnector{Connector: c, wait: SQLiteBusyTimeout}), nil
}

// busyRetryConnector retries opening a connection that failed with
// SQLITE_BUSY, backing off, until wait has passed or ctx is done.
type busyRetryConnector struct {
	sqldriver.Connector
	wait time.Duration
}

func (c *busyRetryConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	deadline := time.Now().Add(c.wait)
	delay := time.Millisecond
	for {
		conn, err := c.Connector.Connect(ctx)
		var sqErr *sqlite.Error
		if err == nil || !errors.As(err, &sqErr) || sqErr.Code()&0xff != sqlite3.SQLITE_BUSY || time.Now().Add(delay).After(deadline) {
			return conn, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(err, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}

// DB returns the *sql.DB the driver was built with.
func (d *Driver) DB() *sql.DB { return d.db }

// MaxConns is the *sql.DB's SetMaxOpenConns cap (0: unlimited, the
// database/sql default).
func (d *Driver) MaxConns() int {
	if d.db == nil {
		return 0
	}
	return d.db.Stats().MaxOpenConnections
}

// Dialect returns the dialect given to New.
func (d *Driver) Dialect() driver.Dialect { return d.dialect }

// Executor runs on the pool.
func (d *Driver) Executor() driver.Executor { return &executor{q: d.db, dialect: d.dialect} }

// UnwrapExecutor runs inside tx.
func (d *Driver) UnwrapExecutor(tx *sql.Tx) driver.Executor {
	return &executor{q: tx, dialect: d.dialect}
}

// Begin starts a transaction.
func (d *Driver) Begin(ctx context.Context) (driver.Tx, error) {
	_, tx, err := d.BeginTx(ctx)
	return tx, err
}

// BeginTx starts a transaction and returns it both as *sql.Tx and driver.Tx.
func (d *Driver) BeginTx(ctx context.Context) (*sql.Tx, driver.Tx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, mapError(err)
	}
	return tx, &txExecutor{executor: executor{q: tx, dialect: d.dialect}, tx: tx}, nil
}

type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type executor struct {
	q       querier
	dialect driver.Dialect
}

func (e *executor) Dialect() driver.Dialect { return e.dialect }

func (e *executor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, mapError(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, nil //nolint:nilerr // drivers that cannot count still executed
	}
	return n, nil
}

func (e *executor) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	rows, err := e.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, mapError(err)
	}
	return &sqlRows{rows}, nil
}

type sqlRows struct{ *sql.Rows }

func (r *sqlRows) Close()     { _ = r.Rows.Close() }
func (r *sqlRows) Err() error { return mapError(r.Rows.Err()) }

type txExecutor struct {
	executor
	tx *sql.Tx
}

func (t *txExecutor) Commit(ctx context.Context) error { return mapError(t.tx.Commit()) }

func (t *txExecutor) Rollback(ctx context.Context) error {
	err := t.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

func mapError(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return &driver.UniqueViolationError{Constraint: pgErr.ConstraintName, Detail: pgErr.Detail, Err: err}
	}
	var sqErr *sqlite.Error
	if errors.As(err, &sqErr) {
		switch sqErr.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return &driver.UniqueViolationError{Constraint: constraintFromMessage(sqErr.Error()), Err: err}
		}
	}
	return err
}

// constraintFromMessage extracts the "table.column" list from modernc's
// message "constraint failed: UNIQUE constraint failed: t.a, t.b (2067)":
// the text after the last "constraint failed: ", without the result code.
func constraintFromMessage(msg string) string {
	i := strings.LastIndex(msg, "constraint failed: ")
	if i < 0 {
		return ""
	}
	return strings.TrimSpace(resultCodeRE.ReplaceAllString(msg[i+len("constraint failed: "):], ""))
}

// resultCodeRE matches the " (2067)" result code modernc appends.
var resultCodeRE = regexp.MustCompile(`\s*\(\d+\)\s*$`)
