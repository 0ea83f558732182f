package relay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/statebench"
	"github.com/ferryhq/ferry/outbox"
)

// newPGPipelineStore is newPGStore whose relays keep up to three batches
// of a shard in flight (WithShardPipeline(3)).
func newPGPipelineStore(t testing.TB, shards int, extra ...outbox.Option) *store {
	t.Helper()
	s := newPGStoreMigrated(t, shards, nil, extra...)
	s.pipeline = 3
	return s
}

// brokerOrderViolations counts messages stored after a later event of
// their aggregate.
func brokerOrderViolations(msgs []streamMsg) int {
	last := map[string]int64{}
	n := 0
	for _, m := range msgs {
		k := ferry.AggregateKey(m.ev.TenantID, m.ev.AggregateType, m.ev.AggregateID)
		if m.ev.AggregateSeq <= last[k] {
			n++
			continue
		}
		last[k] = m.ev.AggregateSeq
	}
	return n
}

// TestShardPipelineKeepsAggregateOrder: one shard, four workers, up to
// four batches of it in flight, a broker that takes up to 30 ms per batch
// (at random, so batches overtake each other) and fails every fourth event
// of an aggregate once. No later event may be marked sent ahead of an
// earlier one or stored on the broker before it, nothing may be lost, and
// batches of the shard must really have overlapped. Negative controls:
// batches that mark without waiting for the batch holding their
// aggregate's earlier rows mark later events sent while an earlier one
// failed; batches that publish without waiting for it store later events
// first.
func TestShardPipelineKeepsAggregateOrder(t *testing.T) {
	for _, c := range []struct {
		name                 string
		noMarkOrder, noPubOr bool
	}{{"guarded", false, false}, {"control_marks_without_waiting", true, false}, {"control_publishes_without_waiting", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newPGStore(t, 1)
			n := startEmbeddedNATS(t)
			want := s.produce(t, 480, 24)
			pub := &countingPublisher{Publisher: n.publisher(t), delay: 30 * time.Millisecond, jitter: true, failWith: failEveryFourthOnce()}
			// The failed row must still be unsent when the later row's
			// mark is checked: a long backoff.
			r, err := s.newRelay(pub, fastOpts(1, WithBatchSize(20), WithWorkers(4), WithShardPipeline(4),
				WithBackoff(2*time.Second, 4*time.Second))...)
			if err != nil {
				t.Fatal(err)
			}
			r.cfg.noMarkOrder, r.cfg.noPublishOrder = c.noMarkOrder, c.noPubOr
			seen := watchOrder(t, s, r)
			runRelay(t, r)
			waitFor(t, 60*time.Second, "all sent", func() bool { return s.count(t, "sent") == len(want) })
			violations := seen()
			msgs := n.read(t)
			pub.mu.Lock()
			overlap := pub.maxActive
			pub.mu.Unlock()
			if overlap < 2 || r.Status().Pipelined == 0 {
				t.Fatalf("at most %d batch of the one shard was in flight at a time, %d claimed beside another: the pipeline was not exercised",
					overlap, r.Status().Pipelined)
			}
			switch {
			case c.noMarkOrder:
				if len(violations) == 0 {
					t.Fatal("marking without waiting for the earlier batch broke no mark order: the test does not exercise the rule")
				}
				t.Logf("control: %d mark-order violations (%d batches overlapped)", len(violations), overlap)
				return
			case c.noPubOr:
				if brokerOrderViolations(msgs) == 0 {
					t.Fatal("publishing without waiting for the earlier batch stored nothing out of order: the test does not exercise the rule")
				}
				t.Logf("control: %d events stored after a later one of their aggregate (%d batches overlapped)", brokerOrderViolations(msgs), overlap)
				return
			}
			if len(violations) > 0 {
				t.Fatalf("a later event was marked sent ahead of an earlier unsent one: %v", violations[:min(5, len(violations))])
			}
			if r.Status().Retries == 0 {
				t.Fatal("no retries happened: the failures were not exercised")
			}
			checkBroker(t, msgs, want) // no loss, stored once, in order
			t.Logf("%d batches of one shard in flight at most, %d claimed beside another; %d retries", overlap, r.Status().Pipelined, r.Status().Retries)
		})
	}
}

// TestShardPipelinePublishesOnce: with no fault, a pipelined relay
// publishes every event exactly once although batches of its one shard
// overlap. Negative control: without the one-claim-per-shard rule two
// claims of the shard run at once, read the same rows and publish them
// twice.
func TestShardPipelinePublishesOnce(t *testing.T) {
	for _, control := range []bool{false, true} {
		name := "guarded"
		if control {
			name = "control_concurrent_claims"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newPGStore(t, 1)
			n := startEmbeddedNATS(t)
			want := s.produce(t, 2000, 400)
			pub := &countingPublisher{Publisher: n.publisher(t), delay: 20 * time.Millisecond, perEvent: map[string]int{}}
			r, err := s.newRelay(pub, fastOpts(1, WithBatchSize(50), WithWorkers(4), WithShardPipeline(4))...)
			if err != nil {
				t.Fatal(err)
			}
			r.cfg.noClaimLock = control
			runRelay(t, r)
			waitFor(t, 60*time.Second, "all sent", func() bool { return s.count(t, "sent") == len(want) })
			pub.mu.Lock()
			twice, overlap := 0, pub.maxActive
			for _, c := range pub.perEvent {
				if c > 1 {
					twice++
				}
			}
			pub.mu.Unlock()
			if overlap < 2 || r.Status().Pipelined == 0 {
				t.Fatalf("at most %d batch of the one shard was in flight at a time, %d claimed beside another: the pipeline was not exercised",
					overlap, r.Status().Pipelined)
			}
			if control {
				if twice == 0 {
					t.Fatal("concurrent claims of one shard published nothing twice: the test does not exercise the rule")
				}
				t.Logf("control: %d events published more than once", twice)
				return
			}
			if twice > 0 {
				t.Fatalf("%d events published more than once in a run without faults", twice)
			}
			checkBroker(t, n.read(t), want)
			t.Logf("%d batches of one shard in flight at most", overlap)
		})
	}
}

// TestShardPipelineClaimPlan: the pipelined claim leaves the rows in
// flight out with a hashed subplan (one hash per claim, not a scan of the
// list per row) and still reads outbox_claim_idx in order (filtered inside
// the LIMIT, the planner read and sorted whole shards instead).
func TestShardPipelineClaimPlan(t *testing.T) {
	s := newPGStore(t, ferry.DefaultShardCount)
	ctx := context.Background()
	if err := statebench.Prefill(ctx, s.pool, ferry.Tables{}, statebench.Fill{
		Topic: "relaytest.order", Pending: 20000, Aggregates: 2000, PayloadBytes: 64,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, "ANALYZE ferry_outbox"); err != nil {
		t.Fatal(err)
	}
	var inFlight []int64
	// The first 125 rows of each shard are in flight: the next claim of
	// 125 per shard must return the 125 after them.
	if err := s.pool.QueryRow(ctx, `SELECT array_agg(id) FROM (
    SELECT id, row_number() OVER (PARTITION BY shard ORDER BY id) AS n FROM ferry_outbox) x WHERE n <= 125`).Scan(&inFlight); err != nil {
		t.Fatal(err)
	}
	q, err := newQueries(driver.Postgres, ferry.Tables{}, DeadHold, queryOpts{pipeline: true})
	if err != nil {
		t.Fatal(err)
	}
	shards := make([]int32, ferry.DefaultShardCount)
	perShard := make([]int32, len(shards))
	for i := range shards {
		shards[i], perShard[i] = int32(i), 125
	}
	var raw []byte
	if err := s.pool.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q.claim, shards, 125, inFlight, perShard).Scan(&raw); err != nil {
		t.Fatalf("explain: %v", err)
	}
	var indexes, filters []string
	walkPlan(t, raw, func(n map[string]any) {
		if ix, ok := n["Index Name"].(string); ok {
			indexes = append(indexes, ix)
		}
		if f, ok := n["Filter"].(string); ok {
			filters = append(filters, f)
		}
	})
	// And it leaves them out: a claim of every shard returns none of them.
	rows, err := s.pool.Query(ctx, q.claim, shards, 125, inFlight, perShard)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]bool{}
	for _, id := range inFlight {
		out[id] = true
	}
	got := 0
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		if id := vals[0].(int64); out[id] {
			t.Fatalf("the claim returned row %d, which is in flight", id)
		}
		got++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !containsSuffix(indexes, "outbox_claim_idx") {
		t.Fatalf("the pipelined claim reads %v, not outbox_claim_idx", indexes)
	}
	if !strings.Contains(strings.Join(filters, " "), "hashed SubPlan") {
		t.Fatalf("the rows in flight are not left out by a hashed subplan; filters: %v", filters)
	}
	if got != 125*ferry.DefaultShardCount {
		t.Fatalf("claim returned %d rows, want %d", got, 125*ferry.DefaultShardCount)
	}
}

// TestShardPipelineOptions: the option's bounds, and the designs it does
// not apply to, are refused with the field named.
func TestShardPipelineOptions(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithShardPipeline(0)}, "must be in 1..8"},
		{[]Option{WithShardPipeline(9)}, "must be in 1..8"},
		{[]Option{WithShardPipeline(2), WithSentWatermark()}, "needs the status design"},
	} {
		err := CheckOptions(c.opts...)
		var ce *ferry.ConfigError
		if !errors.As(err, &ce) || ce.Field != "shard_pipeline" || !strings.Contains(ce.Reason, c.want) {
			t.Errorf("CheckOptions: %v, want shard_pipeline: %s", err, c.want)
		}
	}
	if err := CheckOptions(WithShardPipeline(8)); err != nil {
		t.Errorf("depth 8: %v", err)
	}
	s := newSQLiteStore(t, 1)
	_, err := New(s.db, &countingPublisher{}, WithShardPipeline(2))
	var ce *ferry.ConfigError
	if !errors.As(err, &ce) || ce.Field != "shard_pipeline" || !strings.Contains(ce.Reason, "needs Postgres") {
		t.Errorf("New on SQLite with a pipeline: %v, want shard_pipeline: needs Postgres", err)
	}
}
