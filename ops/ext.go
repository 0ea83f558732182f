package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// inboxCleanupTargets returns the inbox tables' eligible rows when the
// inbox is installed: dedup claims applied before now-InboxRetention and
// parked rows resolved before then. Cursors are never deleted: they are
// what tells a very late redelivery that it is stale.
func (o *Ops) inboxCleanupTargets(ctx context.Context, opts CleanupOptions, now time.Time, res *CleanupResult) []cleanupTarget {
	ok, err := o.tableExists(ctx, o.db.Executor(), "inbox")
	if err != nil || !ok {
		res.Skipped = append(res.Skipped, "inbox")
		return nil
	}
	cut := now.Add(-opts.InboxRetention)
	out := []cleanupTarget{{table: "inbox", key: "(consumer, tenant_id, event_id)", sel: "consumer, tenant_id, event_id",
		cond: "applied_at < $1", args: []any{cut}, count: &res.Inbox}}
	if ok, err := o.tableExists(ctx, o.db.Executor(), "inbox_parked"); err == nil && ok {
		out = append(out, cleanupTarget{table: "inbox_parked", key: "id", cond: "resolved_at IS NOT NULL AND resolved_at < $1",
			args: []any{cut}, count: &res.ResolvedParked})
	}
	return out
}

// effectCleanupTargets returns finished effect-ledger rows (succeeded or
// failed) completed before now-EffectRetention. Open intents — pending,
// in_flight and above all unknown — are never deleted.
func (o *Ops) effectCleanupTargets(ctx context.Context, opts CleanupOptions, now time.Time, res *CleanupResult) []cleanupTarget {
	ok, err := o.tableExists(ctx, o.db.Executor(), "effects")
	if err != nil || !ok {
		res.Skipped = append(res.Skipped, "effects")
		return nil
	}
	return []cleanupTarget{{table: "effects", key: "id", cond: "state IN ('succeeded', 'failed') AND completed_at IS NOT NULL AND completed_at < $1",
		args: []any{now.Add(-opts.EffectRetention)}, count: &res.Effects}}
}

func (o *Ops) effectStatus(ctx context.Context, exec driver.Executor, now time.Time, st *Status) error {
	// Open intents only: they are what needs attention, and the partial
	// index effects_due_idx holds exactly them, so finished rows (the bulk,
	// until cleanup) are never scanned. Finished outcomes are in evidence
	// and in the worker's ferry_effect_* metrics.
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT consumer, state, count(*), MIN(unknown_since) FROM %s
WHERE state IN ('pending', 'unknown', 'in_flight') GROUP BY consumer, state ORDER BY consumer, state`, o.t("effects")))
	if err != nil {
		return fmt.Errorf("ops: effect status: %w", err)
	}
	defer rows.Close()
	idx := map[string]int{}
	for rows.Next() {
		var consumer, state string
		var n int64
		var unk nullTime
		if err := rows.Scan(&consumer, &state, &n, &unk); err != nil {
			return fmt.Errorf("ops: effect status: %w", err)
		}
		i, ok := idx[consumer]
		if !ok {
			i = len(st.Effects)
			idx[consumer] = i
			st.Effects = append(st.Effects, EffectStatus{Consumer: consumer, ByState: map[string]int64{
				"pending": 0, "in_flight": 0, "unknown": 0}})
		}
		st.Effects[i].ByState[state] = n
		if state == "unknown" {
			st.Effects[i].OldestUnknownAge = unk.age(now)
		}
	}
	return rows.Err()
}
