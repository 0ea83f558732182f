// Package databasesql is Ferry's driver core for database/sql: *sql.DB and
// *sql.Tx in any dialect Ferry speaks. It links no database driver itself,
// so a service links only the one it uses:
//
//   - Postgres: register a database/sql driver yourself, e.g.
//     import _ "github.com/jackc/pgx/v5/stdlib" and sql.Open("pgx", url),
//     then New(db, driver.Postgres).
//   - SQLite: package [github.com/ferryhq/ferry/driver/sqlite] opens the file
//     with the settings Ferry needs (modernc.org/sqlite) and builds the driver.
//
// Unique violations are recognised through the methods the drivers' error
// types have (SQLState() for Postgres drivers, Code() for SQLite), so the
// core needs none of their packages.
package databasesql

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"regexp"
	"strings"

	"github.com/ferryhq/ferry/driver"
)

// Driver implements driver.Driver[*sql.Tx].
type Driver struct {
	db      *sql.DB
	dialect driver.Dialect
	mapErr  func(error) error
	// binds caches the MySQL rewrites of statements ($n → ?).
	binds bindCache
}

var _ driver.Driver[*sql.Tx] = (*Driver)(nil)

// New returns a driver over db speaking dialect (driver.Postgres,
// driver.SQLite or driver.MySQL; for MySQL use package driver/mysql, which
// adds its error mapping). With driver.MySQL every statement's $n
// placeholders and "quoted" identifiers are rewritten to ? (arguments
// reordered) and `backticks`, cached per Driver. db may be nil when only UnwrapExecutor is used.
func New(db *sql.DB, dialect driver.Dialect, opts ...Option) *Driver {
	d := &Driver{db: db, dialect: dialect}
	for _, o := range opts {
		o(d)
	}
	return d
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
func (d *Driver) Executor() driver.Executor { return &executor{q: d.db, dialect: d.dialect, d: d} }

// UnwrapExecutor runs inside tx.
func (d *Driver) UnwrapExecutor(tx *sql.Tx) driver.Executor {
	return &executor{q: tx, dialect: d.dialect, d: d}
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
		return nil, nil, d.mapError(err)
	}
	return tx, &txExecutor{executor: executor{q: tx, dialect: d.dialect, d: d}, tx: tx}, nil
}

type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type executor struct {
	q       querier
	dialect driver.Dialect
	d       *Driver
}

func (e *executor) Dialect() driver.Dialect { return e.dialect }

// rebind rewrites query and args for MySQL (see bindMySQL); other
// dialects take them as they are.
func (e *executor) rebind(query string, args []any) (string, []any, error) {
	if e.dialect != driver.MySQL {
		return query, args, nil
	}
	b, err := e.d.binds.get(query)
	if err != nil {
		return "", nil, err
	}
	args, err = b.args(args)
	return b.sql, args, err
}

func (e *executor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	query, args, err := e.rebind(query, args)
	if err != nil {
		return 0, err
	}
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, e.d.mapError(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, nil //nolint:nilerr // drivers that cannot count still executed
	}
	return n, nil
}

// ExecResult runs a statement and returns database/sql's result, for the
// MySQL writer, which reads the LAST_INSERT_ID(expr) its sequence upsert
// sets from the statement's reply instead of asking in another round trip.
func (e *executor) ExecResult(ctx context.Context, query string, args ...any) (sql.Result, error) {
	query, args, err := e.rebind(query, args)
	if err != nil {
		return nil, err
	}
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, e.d.mapError(err)
	}
	return res, nil
}

func (e *executor) Query(ctx context.Context, query string, args ...any) (driver.Rows, error) {
	query, args, err := e.rebind(query, args)
	if err != nil {
		return nil, err
	}
	rows, err := e.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, e.d.mapError(err)
	}
	return &sqlRows{Rows: rows, d: e.d}, nil
}

type sqlRows struct {
	*sql.Rows
	d *Driver
}

func (r *sqlRows) Close()     { _ = r.Rows.Close() }
func (r *sqlRows) Err() error { return r.d.mapError(r.Rows.Err()) }

type txExecutor struct {
	executor
	tx *sql.Tx
}

func (t *txExecutor) Commit(ctx context.Context) error { return t.d.mapError(t.tx.Commit()) }

func (t *txExecutor) Rollback(ctx context.Context) error {
	err := t.tx.Rollback()
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// Option configures New.
type Option func(*Driver)

// WithErrorMapper adds a dialect package's own error mapping (a driver whose
// error type has no method the core recognises, e.g. MySQL's error numbers).
// It runs before the core's mapping; it returns err unchanged when it does
// not recognise it.
func WithErrorMapper(m func(error) error) Option {
	return func(d *Driver) { d.mapErr = m }
}

// The codes the core recognises without importing the drivers.
const (
	pgUniqueViolation    = "23505" // SQLSTATE unique_violation
	sqliteConstraintUniq = 2067    // SQLITE_CONSTRAINT_UNIQUE
	sqliteConstraintPKey = 1555    // SQLITE_CONSTRAINT_PRIMARYKEY
)

func (d *Driver) mapError(err error) error {
	if err == nil {
		return nil
	}
	if d != nil && d.mapErr != nil {
		if m := d.mapErr(err); m != err {
			return m
		}
	}
	return MapError(err)
}

// MapError maps a unique violation from a Postgres driver (an error with
// SQLState() "23505": pgx's *pgconn.PgError, lib/pq's *pq.Error) or from
// SQLite (an error with Code() 2067 or 1555: modernc's *sqlite.Error) to a
// *driver.UniqueViolationError naming the constraint; other errors are
// returned unchanged.
func MapError(err error) error {
	if err == nil {
		return nil
	}
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) && pg.SQLState() == pgUniqueViolation {
		c, detail := pgErrorFields(pg)
		if c == "" {
			if m := pgConstraintRE.FindStringSubmatch(err.Error()); m != nil {
				c = m[1]
			}
		}
		return &driver.UniqueViolationError{Constraint: c, Detail: detail, Err: err}
	}
	var sq interface{ Code() int }
	if errors.As(err, &sq) {
		switch sq.Code() {
		case sqliteConstraintUniq, sqliteConstraintPKey:
			return &driver.UniqueViolationError{Constraint: constraintFromMessage(err.Error()), Err: err}
		}
	}
	return err
}

// pgErrorFields reads the constraint name and the detail ("Key
// (event_id)=(…) already exists.") from a Postgres driver's error struct by
// field name (pgx's PgError: ConstraintName, Detail; lib/pq's Error:
// Constraint, Detail), so the core does not import either driver.
func pgErrorFields(e any) (constraint, detail string) {
	v := reflect.ValueOf(e)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "", ""
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return "", ""
	}
	str := func(names ...string) string {
		for _, n := range names {
			if f := v.FieldByName(n); f.IsValid() && f.Kind() == reflect.String {
				return f.String()
			}
		}
		return ""
	}
	return str("ConstraintName", "Constraint"), str("Detail")
}

// pgConstraintRE reads the constraint from Postgres's message
// `duplicate key value violates unique constraint "name"`.
var pgConstraintRE = regexp.MustCompile(`unique constraint "([^"]+)"`)

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
