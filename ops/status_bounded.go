package ops

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// StatusOption changes how Status reads.
type StatusOption func(*statusOptions)

type statusOptions struct{ countCap int64 }

// WithCountCap counts the outbox's pending, dead and discarded rows of
// each (topic, shard) up to n (n > 0; Postgres; elsewhere counts stay
// exact). A shard that reaches it is marked CountsCapped, and so are its
// topic and the totals: the numbers are then lower bounds (and, under a
// watermark relay, so is that shard's oldest pending age). The metrics
// collector and ferry status read exact counts.
func WithCountCap(n int64) StatusOption {
	return func(s *statusOptions) { s.countCap = n }
}

// outboxStatusBounded is outboxStatus with each count bounded: the
// (topic, shard) pairs with unsent rows are found by a loose index scan of
// outbox_unsent_status_idx (topic, shard, status, created_at,
// discarded_at), one index probe per pair, and each count reads at most
// capN+1 entries of that index (index-only): pending, open dead, and all
// dead (discarded is their difference); the oldest pending row is the
// first entry of its range. The cost is bounded by pairs × 3 × capN
// instead of growing with every unsent row.
func (o *Ops) outboxStatusBounded(ctx context.Context, exec driver.Executor, now time.Time, st *Status, capN int64) error {
	wm, err := o.watermarked(ctx, exec)
	if err != nil {
		return err
	}
	t := o.t("outbox")
	count := func(cond string) string {
		return fmt.Sprintf(`(SELECT count(*) FROM (SELECT 1 FROM %s x WHERE x.status <> 'sent' AND x.topic = k.topic AND x.shard = k.shard AND %s LIMIT %d) c)`,
			t, cond, capN+1)
	}
	q := fmt.Sprintf(`WITH RECURSIVE k(topic, shard) AS (
    (SELECT topic, shard FROM %[1]s WHERE status <> 'sent' ORDER BY topic, shard LIMIT 1)
  UNION ALL
    SELECT n.topic, n.shard FROM k CROSS JOIN LATERAL
      (SELECT topic, shard FROM %[1]s WHERE status <> 'sent' AND (topic, shard) > (k.topic, k.shard) ORDER BY topic, shard LIMIT 1) n
)
SELECT k.topic, k.shard, %[2]s,
    (SELECT min(x.created_at) FROM %[1]s x WHERE x.status <> 'sent' AND x.topic = k.topic AND x.shard = k.shard AND x.status = 'pending'),
    %[3]s, %[4]s
FROM k ORDER BY k.topic, k.shard`, t, count("x.status = 'pending'"), count("x.status = 'dead' AND x.discarded_at IS NULL"),
		count("x.status = 'dead'"))
	if wm {
		q = o.outboxStatusBoundedWatermarkSQL(capN)
	}
	rows, err := exec.Query(ctx, q)
	if err != nil {
		return fmt.Errorf("ops: outbox status: %w", err)
	}
	defer rows.Close()
	topics := map[string]*TopicStatus{}
	for rows.Next() {
		var s ShardStatus
		var oldest nullTime
		var allDead int64
		if err := rows.Scan(&s.Topic, &s.Shard, &s.Pending, &oldest, &s.Dead, &allDead); err != nil {
			return fmt.Errorf("ops: outbox status: %w", err)
		}
		if s.Pending == 0 && allDead == 0 {
			continue // every row sent, by the watermark
		}
		// Discarded is all dead minus open dead: exact while all dead
		// are under the cap, else a lower bound. (discarded_at follows
		// created_at in the index, so counting it directly would read every
		// dead entry of the shard.)
		discarded := max(0, min(allDead, capN)-min(s.Dead, capN))
		for _, n := range []*int64{&s.Pending, &s.Dead, &allDead} {
			if *n > capN {
				*n, s.CountsCapped = capN, true
			}
		}
		s.OldestPendingAge = oldest.age(now)
		st.Shards = append(st.Shards, s)
		tp := topics[s.Topic]
		if tp == nil {
			tp = &TopicStatus{Topic: s.Topic}
			topics[s.Topic] = tp
		}
		tp.Pending += s.Pending
		tp.Dead += s.Dead
		tp.OldestPendingAge = max(tp.OldestPendingAge, s.OldestPendingAge)
		tp.CountsCapped = tp.CountsCapped || s.CountsCapped
		st.Outbox.Pending += s.Pending
		st.Outbox.Dead += s.Dead
		st.Outbox.Discarded += discarded
		st.Outbox.OldestPendingAge = max(st.Outbox.OldestPendingAge, s.OldestPendingAge)
		st.Outbox.CountsCapped = st.Outbox.CountsCapped || s.CountsCapped
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ops: outbox status: %w", err)
	}
	st.Topics = make([]TopicStatus, 0, len(topics))
	for _, tp := range topics {
		st.Topics = append(st.Topics, *tp)
	}
	sort.Slice(st.Topics, func(i, j int) bool { return st.Topics[i].Topic < st.Topics[j].Topic })
	return nil
}

// outboxStatusBoundedWatermarkSQL is outboxStatusBounded's statement when
// a watermark relay may have kept sent rows 'pending' (see watermarked).
// The (topic, shard) pairs and the dead counts are read as before; a pair
// whose rows are all sent reads as zeros and is skipped. Pending is two
// counts of at most capN+1 each: the pair's 'retry' entries of the
// unsent-row index, and its pending rows above the shard's watermark, in
// id order from outbox_claim_idx starting at (shard, sent_up_to), so the
// rows below the watermark, the bulk, are never read (at most the shard's
// rows above it are). OFFSET 0 keeps the topic out of that scan: with it
// the planner reads the pair's unsent-row index entries, every row of the
// pair. The oldest is the oldest of those capN+1 rows, exact unless the
// count is capped. Until a watermark relay has written state
// (watermarkInUse) pending is the status design's 'pending' entries.
func (o *Ops) outboxStatusBoundedWatermarkSQL(capN int64) string {
	t := o.t("outbox")
	count := func(cond string) string {
		return fmt.Sprintf(`(SELECT count(*) FROM (SELECT 1 FROM %s x WHERE x.status <> 'sent' AND x.topic = k.topic AND x.shard = k.shard AND %s LIMIT %d) c)`,
			t, cond, capN+1)
	}
	return fmt.Sprintf(`WITH RECURSIVE w(used) AS (%[5]s),
k(topic, shard) AS (
    (SELECT topic, shard FROM %[1]s WHERE status <> 'sent' ORDER BY topic, shard LIMIT 1)
  UNION ALL
    SELECT n.topic, n.shard FROM k CROSS JOIN LATERAL
      (SELECT topic, shard FROM %[1]s WHERE status <> 'sent' AND (topic, shard) > (k.topic, k.shard) ORDER BY topic, shard LIMIT 1) n
),
kw(topic, shard, wm) AS (
    SELECT k.topic, k.shard, COALESCE((SELECT l.sent_up_to FROM %[2]s l WHERE l.shard = k.shard), 0) FROM k
)
SELECT k.topic, k.shard, p.n + a.n, LEAST(p.oldest, a.oldest), %[3]s, %[4]s
FROM kw k
CROSS JOIN LATERAL (SELECT count(*) AS n, min(c.created_at) AS oldest FROM (SELECT x.created_at FROM %[1]s x
    WHERE x.status <> 'sent' AND x.topic = k.topic AND x.shard = k.shard
      AND x.status = (CASE WHEN (SELECT used FROM w) THEN 'retry' ELSE 'pending' END)
    ORDER BY x.created_at LIMIT %[6]d) c) p
CROSS JOIN LATERAL (SELECT count(*) AS n, min(c.created_at) AS oldest FROM (SELECT r.created_at FROM (SELECT x.topic, x.created_at FROM %[1]s x
    WHERE x.status = 'pending' AND (x.shard, x.id) > (k.shard, k.wm) AND (x.shard, x.id) < (k.shard + 1, 0) AND (SELECT used FROM w)
    ORDER BY x.shard, x.id OFFSET 0) r WHERE r.topic = k.topic LIMIT %[6]d) c) a
ORDER BY k.topic, k.shard`, t, o.t("relay_leases"), count("x.status = 'dead' AND x.discarded_at IS NULL"), count("x.status = 'dead'"),
		watermarkInUse(o.cfg.tables), capN+1)
}
