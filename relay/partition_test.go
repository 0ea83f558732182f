package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
)

// TestPartitionBoundary: with the outbox partitioned in 1-second ranges
// (migrate makes the first ones, DefaultAhead = 7 s ahead), producers
// commit without pause for 10 s — past what migrate made — while the relay
// drains and creates partitions ahead (every 200 ms): rows land in at
// least eight partitions, the relay runs across every boundary, and every event is on
// the broker exactly once, in per-aggregate order, and marked sent in
// the partition it was written to. Without the relay's maintenance the
// producers run out of partitions (the control half: an insert past the
// last partition fails, the row is not written anywhere — a producer
// error, never a silent loss).
//
// In the watermark design (WithSentWatermark) the same run follows, and
// then `ferry cleanup` past the retention drops every partition whose rows
// lie at or below the watermarks recorded before the cutoff, and keeps the
// one holding a row no relay sent.
func TestPartitionBoundary(t *testing.T) {
	t.Run("status", func(t *testing.T) { testPartitionBoundary(t, false) })
	t.Run("watermark", func(t *testing.T) { testPartitionBoundary(t, true) })
}

func testPartitionBoundary(t *testing.T, watermark bool) {
	ctx := context.Background()
	s := newPGStoreMigrated(t, 4, []migrate.Option{migrate.WithPartitionedOutbox(time.Second)})
	s.watermark = watermark
	n := startEmbeddedNATS(t)
	r, err := s.newRelay(n.publisher(t), fastOpts(4, WithPartitionMaintenance(200*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, r)

	var mu sync.Mutex
	var produced []ferry.Event
	var wg sync.WaitGroup
	deadline := time.Now().Add(10 * time.Second)
	for p := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				evs, err := s.insert(ctx, ev(fmt.Sprintf("agg-%d-%d", p, i%5), "x"), ev(fmt.Sprintf("agg-%d-%d", p, (i+1)%5), "y"))
				if err != nil {
					t.Errorf("producer %d: %v", p, err)
					return
				}
				mu.Lock()
				produced = append(produced, evs...)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	waitFor(t, 30*time.Second, "every row sent", func() bool { return s.count(t, "sent") == len(produced) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if lost := checkBroker(t, n.read(t), produced); len(lost) > 0 {
		explainLost(t, s, lost)
	}

	var used int
	if err := s.pool.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM ferry_outbox`).Scan(&used); err != nil {
		t.Fatal(err)
	}
	if used < 8 {
		t.Fatalf("rows landed in %d partitions, want >= 8 (did the test cross boundaries?)", used)
	}
	t.Logf("%d events over %d partitions, all sent and on the broker", len(produced), used)
	if watermark {
		checkWatermarkPartitionDrop(t, s, used)
		return
	}

	// Control: with no relay keeping partitions ahead, a write past the
	// last partition is refused by Postgres, loudly.
	parts, err := partition.List(ctx, s.db.Executor(), ferry.Tables{}, partition.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	last := parts[len(parts)-1]
	_, err = s.pool.Exec(ctx, `UPDATE ferry_outbox SET created_at = $1 WHERE id = (SELECT min(id) FROM ferry_outbox)`, last.To.Add(time.Hour))
	if err == nil || !strings.Contains(err.Error(), "no partition") {
		t.Fatalf("a row past the last partition: %v, want Postgres' 'no partition of relation' error", err)
	}
}

// TestPartitionedPlansAreIndexDriven: on a partitioned outbox with rows
// in several partitions and statistics taken, the relay's claim and marks
// read indexes, never a sequential scan of a partition, and each mark
// row's update is pruned to its own partition at run time (created_at in
// the mark) instead of probing every partition.
func TestPartitionedPlansAreIndexDriven(t *testing.T) {
	ctx := context.Background()
	s := newPGStoreMigrated(t, 16, []migrate.Option{migrate.WithPartitionedOutbox(time.Hour)})
	s.produce(t, 12000, 600)
	// Spread the rows over three partitions and mark all but 2 % sent:
	// an outbox is mostly sent rows, and the pending ones are few.
	if _, err := s.pool.Exec(ctx, `UPDATE ferry_outbox SET created_at = created_at + (id % 3) * interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE ferry_outbox SET status = 'sent', published_at = now() WHERE id % 50 <> 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `VACUUM ANALYZE ferry_outbox`); err != nil {
		t.Fatal(err)
	}
	q, err := newQueries(s.db.Dialect(), ferry.Tables{}, DeadHold, queryOpts{discarded: true, partitioned: true})
	if err != nil {
		t.Fatal(err)
	}
	shards := make([]int32, 16)
	for i := range shards {
		shards[i] = int32(i)
	}
	plan := explain(t, s, q.claim, shards, 125)
	// Every partition holding rows is read through one of its (shard, …)
	// partial indexes (the claim's or the pending one), never sequentially
	// or through a full scan of another index. A partition the statistics
	// know to be empty may show a sequential scan: it reads no page.
	var nonEmpty []string
	nrow, err := s.pool.Query(ctx, `SELECT DISTINCT tableoid::regclass::text FROM ferry_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for nrow.Next() {
		var n string
		_ = nrow.Scan(&n)
		nonEmpty = append(nonEmpty, n)
	}
	nrow.Close()
	if len(nonEmpty) != 3 {
		t.Fatalf("rows in %d partitions, want 3", len(nonEmpty))
	}
	for _, part := range nonEmpty {
		if !strings.Contains(plan, part+"_shard_") {
			t.Errorf("claim plan does not read partition %s through its shard index:\n%s", part, plan)
		}
		for _, l := range strings.Split(plan, "\n") {
			l = strings.TrimSpace(l)
			bad := strings.Contains(l, "Seq Scan on "+part+" ") ||
				(strings.Contains(l, " on "+part+" ") && strings.Contains(l, "Index Scan using ") && !strings.Contains(l, part+"_shard_"))
			if bad {
				t.Errorf("claim reads partition %s without its shard index: %s\n%s", part, l, plan)
			}
		}
	}

	// A mark of 50 pending rows (of all three partitions) finds them
	// through indexes too.
	var ids []sentRow
	rows, err := s.pool.Query(ctx, `SELECT id, created_at FROM ferry_outbox WHERE status = 'pending' ORDER BY id LIMIT 50`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var sr sentRow
		var at time.Time
		if err := rows.Scan(&sr.ID, &at); err != nil {
			t.Fatal(err)
		}
		sr.CreatedAt = &at
		ids = append(ids, sr)
	}
	rows.Close()
	p, _ := json.Marshal(ids)
	// Without the fence (no lease rows here): the plan of the row match.
	qn, _ := newQueries(s.db.Dialect(), ferry.Tables{}, DeadHold, queryOpts{discarded: true, partitioned: true, noFence: true, syncMarks: true})
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var lines []string
	prow, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+qn.markSent, "x", string(p))
	if err != nil {
		t.Fatal(err)
	}
	for prow.Next() {
		var l string
		_ = prow.Scan(&l)
		lines = append(lines, l)
	}
	prow.Close()
	mark := strings.Join(lines, "\n")
	for _, part := range nonEmpty {
		if strings.Contains(mark, "Seq Scan on "+part+" ") {
			t.Errorf("mark scans partition %s sequentially:\n%s", part, mark)
		}
	}
	if !strings.Contains(mark, "Update on ferry_outbox") {
		t.Fatalf("mark plan:\n%s", mark)
	}
}

func explain(t *testing.T, s *store, q string, args ...any) string {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), "EXPLAIN (COSTS OFF) "+q, args...)
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}

// checkWatermarkPartitionDrop: past the retention, cleanup drops the
// partitions of rows the watermark design sent (their rows are 'pending'
// below the recorded watermarks) and keeps the one holding an unsent row.
func checkWatermarkPartitionDrop(t *testing.T, s *store, used int) {
	t.Helper()
	ctx := context.Background()
	unsent := s.produce(t, 1, 1)[0] // no relay runs now
	var unsentPart string
	if err := s.pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM ferry_outbox WHERE event_id = $1`, unsent.ID).Scan(&unsentPart); err != nil {
		t.Fatal(err)
	}
	// A replay window of a second (the partitions are one-second ranges;
	// moving the clock a week on would create a week of them ahead).
	o, err := ops.New(s.db, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	approve := ops.Approval{Approve: true, Actor: "test", Reason: "partition drop"}
	if _, err := o.SetReplayWindow(ctx, ops.Window{BrokerDedupWindow: time.Second, InboxReplayHorizon: time.Second}, approve); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // the last partition with rows ends 2 s before now
	res, err := o.Cleanup(ctx, ops.CleanupOptions{Retention: time.Second}, approve)
	if err != nil {
		t.Fatal(err)
	}
	dropped, keptUnsent := 0, false
	for _, p := range res.OutboxPartitions {
		switch {
		case p.Dropped:
			dropped++
			if strings.HasSuffix(unsentPart, p.Name) {
				t.Fatalf("partition %s holding an unsent row was dropped", p.Name)
			}
		case strings.HasSuffix(unsentPart, p.Name):
			keptUnsent = strings.Contains(p.Kept, "not sent")
		}
	}
	if dropped < used-1 || !keptUnsent {
		t.Fatalf("cleanup dropped %d partitions (rows in %d), kept the unsent row's %s: %v; verdicts %+v", dropped, used, unsentPart, keptUnsent, res.OutboxPartitions)
	}
	if got := s.rows(t); len(got) == 0 || got[unsent.ID.String()].status != "pending" {
		t.Fatalf("the unsent row is gone or not pending after cleanup: %+v", got[unsent.ID.String()])
	}
}

// explainLost logs what the tables say about events the broker does not
// hold: each row's partition, shard, state and the shard's lease row, so a
// loss (which CI saw once in the watermark design: 1 of 5,392) says
// whether the row was passed by a watermark or marked sent.
func explainLost(t *testing.T, s *store, ids []string) {
	t.Helper()
	ctx := context.Background()
	if len(ids) > 5 {
		ids = ids[:5]
	}
	for _, id := range ids {
		var part, status, state string
		var rowID, shard int64
		var created time.Time
		err := s.pool.QueryRow(ctx, `SELECT tableoid::regclass::text, id, shard, status, `+s.statusOf("o")+`, created_at FROM ferry_outbox o WHERE event_id = $1`, id).
			Scan(&part, &rowID, &shard, &status, &state, &created)
		if err != nil {
			t.Logf("lost %s: row: %v", id, err)
			continue
		}
		t.Logf("lost %s: row id %d in %s, shard %d, status %q, state %q, created %s", id, rowID, part, shard, status, state, created.Format(time.RFC3339Nano))
		rows, err := s.pool.Query(ctx, `SELECT to_jsonb(l) FROM ferry_relay_leases l WHERE shard = $1`, shard)
		if err != nil {
			t.Logf("lost %s: lease: %v", id, err)
			continue
		}
		for rows.Next() {
			var j []byte
			if rows.Scan(&j) == nil {
				t.Logf("lost %s: lease row %s", id, j)
			}
		}
		rows.Close()
	}
}
