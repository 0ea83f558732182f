package relay

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/statebench"
)

// advanceWork runs the watermark advance under EXPLAIN ANALYZE (rolled
// back) and returns the rows its plan nodes produced, summed over their
// loops, and the rows its joins read and threw away: the work the
// statement did, which a nested loop over the table or over the acked ids
// multiplies.
func advanceWork(t *testing.T, s *store, sql string, args ...any) (rows, removed float64, plan string) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain advance: %v", err)
	}
	walkPlan(t, raw, func(n map[string]any) {
		r, _ := n["Actual Rows"].(float64)
		l, _ := n["Actual Loops"].(float64)
		rows += r * l
		for _, k := range []string{"Rows Removed by Join Filter", "Rows Removed by Filter"} {
			v, _ := n[k].(float64)
			removed += v
		}
	})
	return rows, removed, string(raw)
}

// TestWatermarkAdvancePlan: the advance's work is proportional to the rows
// it passes, not to the table nor to rows × acked ids — under statistics
// that mislead it as they do in production: every row the watermark design
// sent stays 'pending', and a table analysed young calls 'pending' rare.
// 8,000 rows below the watermark (sent), 1,500 above it claimed in one
// candidate, 1,000 of them acked: the advance holds the other 500.
// Negative control: the statement as it was (the update joined to the
// unacked rows, the acked ids excluded by NOT EXISTS) does over ten times
// the work on the same data — it took 150–415 ms per advance in
// `ferry bench relay --sent-watermark` (docs/PERFORMANCE.md).
func TestWatermarkAdvancePlan(t *testing.T) {
	s := newPGWatermarkStore(t, 1)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("ALTER TABLE ferry_outbox SET (autovacuum_enabled = false)")
	exec("ANALYZE ferry_outbox") // young: empty
	if err := statebench.Prefill(ctx, s.pool, ferry.Tables{}, statebench.Fill{
		Topic: "order.events", Pending: 9500, Aggregates: 200, PayloadBytes: 64,
	}); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE ferry_outbox SET shard = 0, shard_count = 1`) // the store has one shard
	var lo, hi int64
	if err := s.pool.QueryRow(ctx, `SELECT min(id), max(id) FROM ferry_outbox`).Scan(&lo, &hi); err != nil {
		t.Fatal(err)
	}
	wm := lo + 8000 - 1
	exec(`INSERT INTO ferry_relay_leases (shard, owner, fence, expires_at, sent_up_to) VALUES (0, 'plan', 1, now() + interval '1 hour', $1)
ON CONFLICT (shard) DO UPDATE SET owner = excluded.owner, fence = excluded.fence, expires_at = excluded.expires_at, sent_up_to = excluded.sent_up_to`, wm)
	// The claim's horizon: an xid of its own, as the claim takes one.
	var snap string
	if err := s.pool.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&snap); err != nil {
		t.Fatal(err)
	}
	// The advance passes a claim only once every transaction with a lower
	// xid has ended. Those are the whole server's: under the CI's -p 4
	// other packages' tests have transactions open here, and an advance
	// run at once passed nothing (CI: "advance held 0 rows"). Wait for
	// the condition the advance checks.
	deadline := time.Now().Add(time.Minute)
	for {
		var ended bool
		if err := s.pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot()) > $1::xid8`, snap).Scan(&ended); err != nil {
			t.Fatal(err)
		}
		if ended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("transactions with an xid below the claim's %s still open after a minute", snap)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cand, _ := json.Marshal([]map[string]any{{"shard": 0, "fence": 1, "upto": hi, "snap": snap}})
	var acked []int64
	for id := wm + 1; id <= hi && len(acked) < 1000; id++ {
		acked = append(acked, id)
	}
	q, err := newQueries(driver.Postgres, ferry.Tables{}, DeadHold, queryOpts{discarded: true, watermark: true})
	if err != nil {
		t.Fatal(err)
	}
	rows, removed, plan := advanceWork(t, s, q.advance, "plan", string(cand), acked, []int64{})
	t.Logf("advance: %.0f rows produced over all loops, %.0f read and removed", rows, removed)
	if !strings.Contains(plan, `"Relation Name": "ferry_outbox"`) {
		t.Fatalf("advance plan does not touch the outbox:\n%s", plan)
	}
	if rows+removed > 20000 {
		t.Errorf("advance did %.0f rows of work for 1,500 rows above the watermark (1,000 acked): it scales with the table or with rows × acked ids\n%s", rows+removed, plan)
	}
	// The held rows: the advance run for real holds exactly the 500.
	var held int64
	r, err := s.pool.Query(ctx, q.advance, "plan", string(cand), acked, []int64{})
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var sh int
		var w, h int64
		var lost bool
		if err := r.Scan(&sh, &w, &h, &lost); err != nil {
			t.Fatal(err)
		}
		if lost || w != hi {
			t.Errorf("advance: shard %d to %d (lost %v), want %d", sh, w, lost, hi)
		}
		held += h
	}
	r.Close()
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	var retry int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM ferry_outbox WHERE status = 'retry' AND id > $1 + 1000`, wm).Scan(&retry); err != nil {
		t.Fatal(err)
	}
	if held != 500 || retry != 500 {
		t.Errorf("advance held %d rows (%d of the unacked ones are 'retry'), want 500", held, retry)
	}
	exec(`UPDATE ferry_outbox SET status = 'pending' WHERE status = 'retry'`)
	exec(`UPDATE ferry_relay_leases SET sent_up_to = $1 WHERE shard = 0`, wm)

	old := strings.Replace(q.advance, `unacked AS MATERIALIZED (
    SELECT x.id FROM ok CROSS JOIN LATERAL (
        SELECT x.id FROM "ferry_outbox" x
        WHERE x.shard = ok.shard AND x.id > ok.wm AND x.id <= ok.upto AND x.status = 'pending'
        ORDER BY x.shard, x.id) x
  EXCEPT
    SELECT a.id FROM unnest($3::bigint[]) AS a(id)
),
held AS (
    UPDATE "ferry_outbox" o SET status = 'retry', next_attempt_at = now()
    WHERE o.id = ANY(ARRAY(SELECT id FROM unacked)) AND o.status = 'pending'
    RETURNING o.shard
),`, `held AS (
    UPDATE "ferry_outbox" o SET status = 'retry', next_attempt_at = now()
    FROM (SELECT x.id FROM ok CROSS JOIN LATERAL (
            SELECT x.id FROM "ferry_outbox" x
            WHERE x.shard = ok.shard AND x.id > ok.wm AND x.id <= ok.upto AND x.status = 'pending'
            ORDER BY x.shard, x.id) x
          WHERE NOT EXISTS (SELECT 1 FROM unnest($3::bigint[]) AS a(id) WHERE a.id = x.id)) unacked
    WHERE o.id = unacked.id AND o.status = 'pending'
    RETURNING o.shard
),`, 1)
	if old == q.advance {
		t.Fatal("negative control: the advance's held rows were not found to replace")
	}
	orows, oremoved, _ := advanceWork(t, s, old, "plan", string(cand), acked, []int64{})
	t.Logf("control (join from the outbox, NOT EXISTS over the acked ids): %.0f rows produced, %.0f removed", orows, oremoved)
	if orows+oremoved < 10*(rows+removed) {
		t.Errorf("negative control: the old advance did %.0f rows of work against %.0f: the statistics did not mislead it, so this test shows nothing", orows+oremoved, rows+removed)
	}
}
