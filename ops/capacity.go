package ops

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
)

// CapacityGuard makes producers fail fast with ErrOutboxFull when the
// outbox holds HardCap pending rows or more, instead of filling the disk
// while the relay is down. Call Check before (or inside) the producer's
// transaction and fail the command on error:
//
//	guard, _ := ops.NewCapacityGuard(drv.Executor(), 1_000_000)
//	if err := guard.Check(ctx); err != nil {
//		return err // errors.Is(err, ops.ErrOutboxFull)
//	}
//	_, err := writer.InsertTx(ctx, tx, ev)
//
// The count is bounded (it never reads more than HardCap+1 index entries)
// and cached for the refresh interval, so a busy producer pays one bounded
// count per interval, not one per event. The cap is a safety valve, not an
// exact limit: concurrent producers may overshoot it by what they write
// within one interval.
type CapacityGuard struct {
	exec    driver.Executor
	tables  ferry.Tables
	cap     int64
	refresh time.Duration
	now     func() time.Time

	mu      sync.Mutex
	checked time.Time
	pending int64
}

// CapacityOption configures a CapacityGuard.
type CapacityOption func(*CapacityGuard)

// WithCapacityTables sets the table names (default "ferry_" prefix).
func WithCapacityTables(t ferry.Tables) CapacityOption {
	return func(g *CapacityGuard) { g.tables = t }
}

// WithCapacityRefresh sets how long a count is reused (default 1 s).
func WithCapacityRefresh(d time.Duration) CapacityOption {
	return func(g *CapacityGuard) { g.refresh = d }
}

// WithCapacityClock overrides time.Now (tests).
func WithCapacityClock(now func() time.Time) CapacityOption {
	return func(g *CapacityGuard) { g.now = now }
}

// NewCapacityGuard returns a guard with hard cap hardCap (>= 1).
func NewCapacityGuard(exec driver.Executor, hardCap int64, opts ...CapacityOption) (*CapacityGuard, error) {
	if exec == nil {
		return nil, &ArgError{Field: "exec", Reason: "must not be nil"}
	}
	if hardCap < 1 {
		return nil, &ArgError{Field: "hard_cap", Reason: "must be >= 1"}
	}
	g := &CapacityGuard{exec: exec, cap: hardCap, refresh: time.Second, now: time.Now}
	for _, o := range opts {
		o(g)
	}
	if err := g.tables.Check(); err != nil {
		return nil, err
	}
	if g.refresh < 0 {
		return nil, &ArgError{Field: "refresh", Reason: "must be >= 0"}
	}
	return g, nil
}

// Check returns a *OutboxFullError (ErrOutboxFull) when at least HardCap
// rows are pending.
func (g *CapacityGuard) Check(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if g.checked.IsZero() || now.Sub(g.checked) >= g.refresh {
		n, err := CountPending(ctx, g.exec, g.tables, g.cap)
		if err != nil {
			return err
		}
		g.pending, g.checked = n, now
	}
	if g.pending >= g.cap {
		return &OutboxFullError{Pending: g.pending, Cap: g.cap}
	}
	return nil
}

// CheckCapacity is the one-shot form of CapacityGuard.Check: it counts (at
// most hardCap) pending rows through exec — which may be the producer's
// own transaction — and returns ErrOutboxFull when the cap is reached.
func CheckCapacity(ctx context.Context, exec driver.Executor, tables ferry.Tables, hardCap int64) error {
	if hardCap < 1 {
		return &ArgError{Field: "hard_cap", Reason: "must be >= 1"}
	}
	n, err := CountPending(ctx, exec, tables, hardCap)
	if err != nil {
		return err
	}
	if n >= hardCap {
		return &OutboxFullError{Pending: n, Cap: hardCap}
	}
	return nil
}

// CountPending counts pending outbox rows, stopping at limit (the count
// reads at most limit entries of the pending index). Under a watermark
// relay (relay.WithSentWatermark) those are the rows not sent yet: 'retry'
// ones and 'pending' ones above their shard's watermark.
func CountPending(ctx context.Context, exec driver.Executor, tables ferry.Tables, limit int64) (int64, error) {
	if err := tables.Check(); err != nil {
		return 0, err
	}
	q := fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s WHERE status = 'pending' LIMIT $1) p`, tables.Name("outbox"))
	if exec.Dialect() == driver.Postgres {
		wm, err := watermarkColumn(ctx, exec, tables)
		if err != nil {
			return 0, err
		}
		if wm {
			q = countPendingWatermarkSQL(tables)
		}
	}
	var n int64
	err := queryRow(ctx, exec, q, []any{limit}, &n)
	if err != nil {
		return 0, fmt.Errorf("ops: count pending outbox rows: %w", err)
	}
	return n, nil
}

// countPendingWatermarkSQL is CountPending's statement when a watermark
// relay may have kept sent rows 'pending' (every sent row, so status =
// 'pending' is the whole table): the 'retry' rows and the pending rows
// above their shard's watermark (index-only ranges of outbox_claim_idx),
// up to $1; until a watermark is in use, the status design's count.
func countPendingWatermarkSQL(t ferry.Tables) string {
	return fmt.Sprintf(`WITH RECURSIVE w(used) AS (%[2]s),
%[3]s
SELECT count(*) FROM (
    SELECT 1 FROM %[1]s WHERE status = 'pending' AND NOT (SELECT used FROM w)
  UNION ALL
    SELECT 1 FROM %[1]s WHERE status = 'retry' AND (SELECT used FROM w)
  UNION ALL
    SELECT 1 FROM %[4]s
  LIMIT $1) p`, t.Name("outbox"), watermarkInUse(t), shardsWithPending(t, "(SELECT used FROM w)"), aboveWatermark(t, "1"))
}
