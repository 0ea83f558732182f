// Package outboxstate is the one definition of an outbox row's relay
// state when a relay may keep it out of the row (relay.WithSentWatermark):
// a row is sent when its status says so, or when it is 'pending' at or
// below its shard's watermark (relay_leases.sent_up_to). A 'retry' row is
// unsent, exactly like a 'pending' row backing off under the status
// design. Readers that must be right in both designs read the state
// through Expr instead of the status column. Postgres only: the
// watermark design runs nowhere else.
package outboxstate

import (
	"fmt"

	"github.com/ferryhq/ferry"
)

// BelowWatermark is a Postgres condition: the row aliased alias lies at or
// below its shard's watermark (0 without a lease row). One primary-key
// lookup of the lease per row.
func BelowWatermark(t ferry.Tables, alias string) string {
	return fmt.Sprintf(`%[1]s.id <= COALESCE((SELECT wm.sent_up_to FROM %[2]s wm WHERE wm.shard = %[1]s.shard), 0)`, alias, t.Name("relay_leases"))
}

// Expr is a Postgres expression giving the row aliased alias the status it
// has in the status design: 'pending', 'sent' or 'dead'.
func Expr(t ferry.Tables, alias string) string {
	return fmt.Sprintf(`(CASE WHEN %[1]s.status = 'pending' AND %[2]s THEN 'sent'
  WHEN %[1]s.status = 'retry' THEN 'pending' ELSE %[1]s.status END)`, alias, BelowWatermark(t, alias))
}

// InUse is a Postgres query returning one boolean: has a watermark relay
// written state (a watermark above 0, or a 'retry' row)? Until then every
// row's state is its status column.
func InUse(t ferry.Tables) string {
	return fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE sent_up_to > 0) OR EXISTS (SELECT 1 FROM %s WHERE status = 'retry')`,
		t.Name("relay_leases"), t.Name("outbox"))
}

// SentBefore is a Postgres expression: the highest id of shard (an SQL
// expression) the watermark had passed before the time in placeholder
// (e.g. "$1"), from relay_watermarks — so every 'pending' row of the
// shard at or below it was published before then (0 when none). Cleanup's
// retention and its partition-drop guard read it: rows passed by the
// watermark carry no published_at.
func SentBefore(t ferry.Tables, shard, placeholder string) string {
	return fmt.Sprintf(`COALESCE((SELECT max(h.sent_up_to) FROM %s h WHERE h.shard = %s AND h.at < %s), 0)`,
		t.Name("relay_watermarks"), shard, placeholder)
}

// ShardsWithPending is a recursive CTE term s(shard): the shards with
// 'pending' rows, one outbox_claim_idx probe each (a loose index scan), or
// none unless cond.
func ShardsWithPending(t ferry.Tables, cond string) string {
	return fmt.Sprintf(`s(shard) AS (
    (SELECT shard FROM %[1]s WHERE status = 'pending' AND %[2]s ORDER BY shard LIMIT 1)
  UNION ALL
    SELECT n.shard FROM s CROSS JOIN LATERAL
      (SELECT shard FROM %[1]s WHERE status = 'pending' AND shard > s.shard ORDER BY shard LIMIT 1) n
)`, t.Name("outbox"), cond)
}

// AboveWatermark is a FROM item: the pending rows (x) of the shards in s
// above their shard's watermark, each shard a range of outbox_claim_idx
// from (shard, sent_up_to). The bounds on (shard, id) keep the planner on
// that range, and the watermark is a column of the shard list so the range
// is not read before it is known.
func AboveWatermark(t ferry.Tables, cols string) string {
	return fmt.Sprintf(`(SELECT s.shard, COALESCE((SELECT l.sent_up_to FROM %[2]s l WHERE l.shard = s.shard), 0) AS wm FROM s) s
    CROSS JOIN LATERAL (SELECT %[3]s FROM %[1]s x
        WHERE x.status = 'pending' AND (x.shard, x.id) > (s.shard, s.wm) AND (x.shard, x.id) < (s.shard + 1, 0)) x`,
		t.Name("outbox"), t.Name("relay_leases"), cols)
}
