package ops

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/outboxstate"
)

// A relay in the watermark design (relay.WithSentWatermark, Postgres,
// migration 0012) leaves an acked row 'pending' and moves its shard's
// relay_leases.sent_up_to instead, and gives a row it could not send the
// status 'retry'. A row's state is then not its status column
// (internal/outboxstate): readers below use the watermark on Postgres once
// the column exists. SQLite and MySQL have no such relay.

// watermarked reports whether a row's state may differ from its status:
// Postgres with relay_leases.sent_up_to. A yes is remembered (the column
// is not dropped again); a no is asked again, so a migration applied while
// ops runs is seen.
func (o *Ops) watermarked(ctx context.Context, exec driver.Executor) (bool, error) {
	if !o.pg() {
		return false, nil
	}
	if o.wm.Load() {
		return true, nil
	}
	ok, err := watermarkColumn(ctx, exec, o.cfg.tables)
	if ok {
		o.wm.Store(true)
	}
	return ok, err
}

// watermarkColumn reports whether relay_leases has sent_up_to (Postgres),
// resolving the table as the statements do (schema, or search_path).
func watermarkColumn(ctx context.Context, exec driver.Executor, t ferry.Tables) (bool, error) {
	var ok bool
	err := queryRow(ctx, exec, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'sent_up_to' AND NOT attisdropped)`,
		[]any{t.Name("relay_leases")}, &ok)
	if err != nil {
		return false, fmt.Errorf("ops: look up relay_leases.sent_up_to: %w", err)
	}
	return ok, nil
}

// watermarkInUse is outboxstate.InUse: true once a watermark relay has
// written state. Until then every row's state is its status, and the
// status design's queries are exact; they also stay cheap there (an
// index-only or sequential read of the unsent rows instead of a heap
// fetch per pending row).
func watermarkInUse(t ferry.Tables) string { return outboxstate.InUse(t) }

// shardsWithPending and aboveWatermark: see outboxstate.
func shardsWithPending(t ferry.Tables, cond string) string {
	return outboxstate.ShardsWithPending(t, cond)
}
func aboveWatermark(t ferry.Tables, cols string) string { return outboxstate.AboveWatermark(t, cols) }

// stateExpr is the state of the outbox row read without an alias:
// 'pending', 'sent' or 'dead' as the status design would have it.
func (o *Ops) stateExpr() string {
	return outboxstate.Expr(o.cfg.tables, o.t("outbox"))
}

// outboxSetSQL is set's condition as a statement on the outbox must read
// it: "sent" includes the rows at or below their shard's watermark.
func (o *Ops) outboxSetSQL(ctx context.Context, exec driver.Executor, set outboxSet) (string, error) {
	if set != setSent {
		return string(set), nil
	}
	wm, err := o.watermarked(ctx, exec)
	if err != nil || !wm {
		return string(set), err
	}
	return o.stateExpr() + " = 'sent'", nil
}

// requeueStatus is the status a row put back for the relay (dead-letter
// retry, replay) gets: 'pending' — or 'retry' when the row lies at or
// below its shard's watermark, where 'pending' reads as sent and a
// watermark relay would never claim it again.
func (o *Ops) requeueStatus(ctx context.Context, exec driver.Executor) (string, error) {
	wm, err := o.watermarked(ctx, exec)
	if err != nil || !wm {
		return "'pending'", err
	}
	return "CASE WHEN " + outboxstate.BelowWatermark(o.cfg.tables, o.t("outbox")) + " THEN 'retry' ELSE 'pending' END", nil
}
