package cdc

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

// On a partitioned outbox the marking statement looks each row up in its
// own partition only (run-time pruning on created_at): the scans of the
// outbox's partitions run about once per row, not once per row and
// partition. The control is the statement without created_at, as built
// for a plain outbox, on the same table: it probes every partition for
// every row.
func TestRecordPrunesPartitions(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	tables := ferry.Tables{Schema: s.Schema}
	db := pgxv5.New(s.Pool)
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedOutbox(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Seven days back as well as the week ahead migrate made.
	now := time.Now().UTC()
	for d := 1; d <= 7; d++ {
		if _, err := partition.Create(ctx, db.Executor(), tables, partition.Outbox, now.Truncate(24*time.Hour).Add(-time.Duration(d)*24*time.Hour), 24*time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	parts, err := partition.List(ctx, db.Executor(), tables, partition.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	// 10,000 rows a day, of which 300 are marked: a table large enough
	// that the planner looks rows up by index, as it does in production.
	const total, rows = 70000, 300
	if _, err := s.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type,
    schema_version, topic, shard, shard_count, content_type, payload, occurred_at, created_at)
SELECT gen_random_uuid(), 't', 'order', 'a' || g, 1, 'e', 1, 'order.events', 0, 16, 'application/json', '\x7b7d', now(),
    now() - (g %% 7) * interval '1 day'
FROM generate_series(1, %d) g`, tables.Name("outbox"), total)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, "ANALYZE "+tables.Name("outbox")); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var receipts []string
	var at []time.Time
	r, err := s.Pool.Query(ctx, fmt.Sprintf(`SELECT event_id::text, created_at FROM %s ORDER BY random() LIMIT %d`, tables.Name("outbox"), rows))
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id string
		var ts time.Time
		if err := r.Scan(&id, &ts); err != nil {
			t.Fatal(err)
		}
		ids, receipts, at = append(ids, id), append(receipts, "r"), append(at, ts)
	}
	r.Close()
	if err := r.Err(); err != nil || len(ids) != rows {
		t.Fatalf("read %d rows: %v", len(ids), err)
	}
	tgt := target{qualified: tables.Name("outbox"), partitioned: true}
	pruned, marked := scanLoops(t, s, recordSQL(tgt), ids, receipts, []string{uuid.NewString()}, []string{"x"}, at, []time.Time{now})
	tgt.partitioned = false
	unpruned, _ := scanLoops(t, s, recordSQL(tgt), ids, receipts, []string{uuid.NewString()}, []string{"x"})
	t.Logf("%d partitions, %d rows: partition scans ran %d times with created_at, %d without", len(parts), rows, pruned, unpruned)
	if marked != rows {
		t.Fatalf("the statement marked %d rows, want %d", marked, rows)
	}
	// Once per row for the mark and once for the visibility check, plus
	// the dead row's two lookups.
	if pruned > 2*(rows+1) {
		t.Fatalf("with created_at the partitions were scanned %d times for %d rows: not pruned", pruned, rows)
	}
	if unpruned < 2*rows*len(parts)/2 {
		t.Fatalf("control: without created_at the partitions were scanned only %d times (%d partitions, %d rows): the check cannot tell", unpruned, len(parts), rows)
	}
}

// scanLoops runs q under EXPLAIN ANALYZE in a rolled-back transaction and
// returns how often scans of outbox partitions ran in total and how many
// rows the statement's mark updated.
func scanLoops(t *testing.T, s *testenv.PostgresSchema, q string, args ...any) (loops, marked int) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Row lookups, as the planner chooses on a production-sized outbox
	// (on this small one it would rather hash every partition whole).
	if _, err := tx.Exec(ctx, "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off"); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q, args...).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan node `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
		t.Fatalf("plan: %v", err)
	}
	var walk func(n node)
	walk = func(n node) {
		if strings.HasPrefix(n.Relation, "ferry_outbox_p") && strings.Contains(n.Type, "Scan") {
			loops += n.Loops
		}
		if n.Type == "ModifyTable" && n.Subplan == "CTE sent" {
			marked = n.Rows
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(plan[0].Plan)
	return loops, marked
}

type node struct {
	Type     string `json:"Node Type"`
	Relation string `json:"Relation Name"`
	Subplan  string `json:"Subplan Name"`
	Loops    int    `json:"Actual Loops"`
	Rows     int    `json:"Actual Rows"`
	Plans    []node `json:"Plans"`
}
