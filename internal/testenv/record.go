package testenv

import (
	"context"
	"sync"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// Statement is one statement a Recorder saw.
type Statement struct {
	SQL  string
	Args []any
	Took time.Duration // until Query returned (the first rows), or Exec
}

// Recorder keeps the statements run through the executors it wraps, so a
// test can run each again under EXPLAIN with the same arguments.
// Transactions are not recorded.
type Recorder struct {
	mu    sync.Mutex
	stmts []Statement
}

// Wrap returns x recording every Exec and Query into r.
func (r *Recorder) Wrap(x driver.Executor) driver.Executor { return recordingExec{x, r} }

// Take returns the statements recorded since the last Take.
func (r *Recorder) Take() []Statement {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.stmts
	r.stmts = nil
	return out
}

func (r *Recorder) add(sql string, args []any, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stmts = append(r.stmts, Statement{sql, append([]any(nil), args...), took})
}

type recordingExec struct {
	driver.Executor
	r *Recorder
}

func (x recordingExec) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	t0 := time.Now()
	n, err := x.Executor.Exec(ctx, sql, args...)
	x.r.add(sql, args, time.Since(t0))
	return n, err
}

func (x recordingExec) Query(ctx context.Context, sql string, args ...any) (driver.Rows, error) {
	t0 := time.Now()
	rows, err := x.Executor.Query(ctx, sql, args...)
	x.r.add(sql, args, time.Since(t0))
	return rows, err
}
