package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/statebench"
	"github.com/ferryhq/ferry/internal/testenv"
)

// claimPlan is what EXPLAIN (ANALYZE, BUFFERS) says of one claim.
type claimPlan struct {
	indexes []string // every index a node of the plan scans
	buffers int64    // shared buffers hit + read
}

func explainClaim(t *testing.T, s *store, sql string) claimPlan {
	t.Helper()
	shards := make([]int, ferry.DefaultShardCount)
	for i := range shards {
		shards[i] = i
	}
	var raw []byte
	if err := s.pool.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, shards, 125).Scan(&raw); err != nil {
		t.Fatalf("explain claim: %v", err)
	}
	var p claimPlan
	root := walkPlan(t, raw, func(n map[string]any) {
		if ix, ok := n["Index Name"].(string); ok {
			p.indexes = append(p.indexes, ix)
		}
	})
	hit, _ := root["Shared Hit Blocks"].(float64)
	read, _ := root["Shared Read Blocks"].(float64)
	p.buffers = int64(hit + read)
	return p
}

// walkPlan is testenv.WalkPlan (kept for this package's plan tests).
func walkPlan(t *testing.T, raw []byte, visit func(node map[string]any)) map[string]any {
	t.Helper()
	return testenv.WalkPlan(t, raw, visit)
}

// TestClaimPlanIgnoresStaleStatistics: a backlog is analysed while every
// row is pending, then drained (every row sent) before the statistics
// catch up — a relay that just worked off an outage. The claim must still
// read outbox_claim_idx and touch a few buffers, not walk the primary key
// over every sent row. Negative control: the claim as it was (shard pinned
// by equality, ordered by id) takes the primary key under the same
// statistics and reads orders of magnitude more.
func TestClaimPlanIgnoresStaleStatistics(t *testing.T) {
	s := newPGStore(t, ferry.DefaultShardCount)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// No autovacuum on this scratch table: it would refresh the statistics
	// mid-test and hide what the test is about.
	exec("ALTER TABLE ferry_outbox SET (autovacuum_enabled = false)")
	if err := statebench.Prefill(ctx, s.pool, ferry.Tables{}, statebench.Fill{
		Topic: "order.events", Pending: 40000, Aggregates: 500, PayloadBytes: 64,
	}); err != nil {
		t.Fatal(err)
	}
	exec("ANALYZE ferry_outbox")
	exec("UPDATE ferry_outbox SET status = 'sent', published_at = now() WHERE status = 'pending'")

	q, err := newQueries(driver.Postgres, ferry.Tables{}, DeadHold, queryOpts{discarded: true})
	if err != nil {
		t.Fatal(err)
	}
	// The first claim after the drain visits each dead claim-index entry
	// once (and marks it dead); the next one reads almost nothing. An
	// entry is marked only once its row is dead to every snapshot: a
	// transaction open elsewhere in the cluster (another package's test)
	// delays that, so the later claims are retried for a while.
	first := explainClaim(t, s, q.claim)
	got := explainClaim(t, s, q.claim)
	for deadline := time.Now().Add(30 * time.Second); got.buffers > 2000 && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		got = explainClaim(t, s, q.claim)
	}
	t.Logf("claim: indexes %v, %d buffers (first after the drain %d)", got.indexes, got.buffers, first.buffers)
	if !containsSuffix(got.indexes, "outbox_claim_idx") || containsSuffix(got.indexes, "outbox_pkey") {
		t.Errorf("claim scans %v; want outbox_claim_idx and not the primary key", got.indexes)
	}
	if got.buffers > 2000 {
		t.Errorf("claim of a drained outbox read %d buffers", got.buffers)
	}

	old := strings.NewReplacer(
		">= s.shard AND (o.shard, o.id) > (s.shard, 0) AND (o.shard, o.id) < (s.shard + 1, 0)", "= s.shard",
		"ORDER BY o.shard, o.id LIMIT", "ORDER BY o.id LIMIT").Replace(q.claim)
	if old == q.claim {
		t.Fatal("negative control: the claim's shard bounds were not found to replace")
	}
	ctl := explainClaim(t, s, old)
	t.Logf("control (shard = s.shard, ORDER BY o.id): indexes %v, %d buffers", ctl.indexes, ctl.buffers)
	if !containsSuffix(ctl.indexes, "outbox_pkey") || ctl.buffers < 10*first.buffers {
		t.Errorf("negative control: the old claim scanned %v reading %d buffers (new: %d); the statistics did not mislead it, so this test shows nothing",
			ctl.indexes, ctl.buffers, first.buffers)
	}
}

func containsSuffix(list []string, suffix string) bool {
	for _, s := range list {
		if strings.HasSuffix(s, suffix) {
			return true
		}
	}
	return false
}
