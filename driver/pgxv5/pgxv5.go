// Package pgxv5 is Ferry's driver for pgx v5: a *pgxpool.Pool for work Ferry
// does on its own and a pgx.Tx for work done in the caller's transaction.
package pgxv5

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/driver"
)

// Driver implements driver.Driver[pgx.Tx].
type Driver struct {
	pool *pgxpool.Pool
}

var _ driver.Driver[pgx.Tx] = (*Driver)(nil)

// New returns a driver over pool. The pool may be nil when only
// UnwrapExecutor is used (writing in callers' transactions).
func New(pool *pgxpool.Pool) *Driver { return &Driver{pool: pool} }

// Pool returns the pool the driver was built with.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// MaxConns is the pool's MaxConns (pool_max_conns; pgxpool's default is
// max(4, CPUs)), or 0 without a pool.
func (d *Driver) MaxConns() int {
	if d.pool == nil {
		return 0
	}
	return int(d.pool.Config().MaxConns)
}

// Dialect is always Postgres.
func (d *Driver) Dialect() driver.Dialect { return driver.Postgres }

// Executor runs on the pool.
func (d *Driver) Executor() driver.Executor { return &executor{q: d.pool} }

// UnwrapExecutor runs inside tx.
func (d *Driver) UnwrapExecutor(tx pgx.Tx) driver.Executor { return &executor{q: tx} }

// Begin starts a transaction on the pool.
func (d *Driver) Begin(ctx context.Context) (driver.Tx, error) {
	_, tx, err := d.BeginTx(ctx)
	return tx, err
}

// BeginTx starts a transaction and returns it both as pgx.Tx and driver.Tx.
func (d *Driver) BeginTx(ctx context.Context) (pgx.Tx, driver.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return tx, &txExecutor{executor: executor{q: tx}, tx: tx}, nil
}

type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type executor struct{ q querier }

func (e *executor) Dialect() driver.Dialect { return driver.Postgres }

func (e *executor) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := e.q.Exec(ctx, sql, args...)
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

func (e *executor) Query(ctx context.Context, sql string, args ...any) (driver.Rows, error) {
	rows, err := e.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, MapError(err)
	}
	return &pgxRows{rows}, nil
}

type pgxRows struct{ pgx.Rows }

func (r *pgxRows) Err() error { return MapError(r.Rows.Err()) }

type txExecutor struct {
	executor
	tx pgx.Tx
}

func (t *txExecutor) Commit(ctx context.Context) error { return MapError(t.tx.Commit(ctx)) }

func (t *txExecutor) Rollback(ctx context.Context) error {
	err := t.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

// MapError wraps Postgres unique violations (SQLSTATE 23505) as
// *driver.UniqueViolationError and returns other errors unchanged.
func MapError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return &driver.UniqueViolationError{Constraint: pgErr.ConstraintName, Detail: pgErr.Detail, Err: err}
	}
	return err
}
