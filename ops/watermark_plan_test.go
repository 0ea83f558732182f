package ops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
)

// recordDB is a real database whose executor also records each statement.
type recordDB struct {
	ops.DB
	testenv.Recorder
}

func (r *recordDB) Executor() driver.Executor { return r.Wrap(r.DB.Executor()) }

// tableReads is what EXPLAIN (ANALYZE, BUFFERS) says a statement read of
// one table: the rows its scans of the table visited (returned, or removed
// by a filter or recheck, over all loops), the shared buffers the whole
// statement touched, and the plan, one node a line.
type tableReads struct {
	rows    int64
	buffers int64
	plan    string
}

// explainReads runs EXPLAIN (ANALYZE, BUFFERS) of sql and counts the reads
// of relation.
func explainReads(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, relation, sql string, args ...any) tableReads {
	t.Helper()
	var raw []byte
	if err := pool.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		t.Fatalf("explain %s: %v", sql, err)
	}
	var doc []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc) != 1 {
		t.Fatalf("explain output: %v %s", err, raw)
	}
	var r tableReads
	num := func(n map[string]any, k string) float64 { v, _ := n[k].(float64); return v }
	var lines []string
	var walk func(n map[string]any, depth int)
	walk = func(n map[string]any, depth int) {
		if n["Relation Name"] == relation {
			loops := num(n, "Actual Loops")
			r.rows += int64(loops * (num(n, "Actual Rows") + num(n, "Rows Removed by Filter") + num(n, "Rows Removed by Index Recheck")))
		}
		ix, _ := n["Index Name"].(string)
		lines = append(lines, fmt.Sprintf("%s%v %s rows=%.0f loops=%.0f removed=%.0f", strings.Repeat("  ", depth), n["Node Type"], ix,
			num(n, "Actual Rows"), num(n, "Actual Loops"), num(n, "Rows Removed by Filter")))
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				walk(m, depth+1)
			}
		}
	}
	walk(doc[0].Plan, 0)
	r.buffers = int64(num(doc[0].Plan, "Shared Hit Blocks") + num(doc[0].Plan, "Shared Read Blocks"))
	r.plan = strings.Join(lines, "\n")
	return r
}

// TestStatusWatermarkPlan (Postgres): on a 200,000-row outbox of which
// 199,000 rows are 'pending' at or below their shard's watermark (sent),
// the statements of Status (exact and bounded), CountPending and a pending
// search read
// the rows above the watermark, the retry and the dead rows, and not the
// sent bulk: EXPLAIN ANALYZE counts the outbox rows their scans visit.
// Negative control: the status design's statement (status <> 'sent')
// visits every row, and its count includes the sent ones.
func TestStatusWatermarkPlan(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 200,000-row outbox; not with -short")
	}
	e := newPostgres(t)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := e.pg.Pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	const rows, shards, wmBelow = 200_000, 16, 199_400
	exec(fmt.Sprintf(`INSERT INTO %[1]s (event_id, tenant_id, aggregate_type, aggregate_id, aggregate_seq, event_type, schema_version,
    topic, shard, shard_count, content_type, payload, occurred_at, created_at)
SELECT gen_random_uuid(), 'acme', 'order', 'agg-' || i, 1, 'order.created', 1,
    CASE WHEN i %% 3 = 0 THEN 'user.events' ELSE 'order.events' END, i %% %[2]d, %[2]d, 'application/json', '\x7b7d',
    now(), now() - make_interval(secs => %[3]d - i)
FROM generate_series(1, %[3]d) i`, tn("outbox"), shards, rows))
	// Below the watermark: 300 retry rows, 100 dead (20 discarded), and
	// 199,000 sent rows left 'pending'. Above it: 600 pending rows.
	exec(fmt.Sprintf(`UPDATE %s SET status = 'retry' WHERE id %% 600 = 7 AND id <= 180000`, tn("outbox")))
	exec(fmt.Sprintf(`UPDATE %s SET status = 'dead', discarded_at = CASE WHEN (id / 1800) %% 5 = 0 THEN now() END WHERE id %% 1800 = 11 AND id <= 180000`, tn("outbox")))
	exec(fmt.Sprintf(`INSERT INTO %[1]s (shard, sent_up_to) SELECT s, (SELECT max(id) FROM %[2]s WHERE shard = s AND id <= %[3]d)
FROM generate_series(0, %[4]d) s`, tn("relay_leases"), tn("outbox"), wmBelow, shards-1))
	exec("VACUUM ANALYZE " + tn("outbox"))
	exec("ANALYZE " + tn("relay_leases"))
	if n := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s o JOIN %s l ON l.shard = o.shard WHERE o.status = 'pending' AND o.id <= l.sent_up_to`,
		tn("outbox"), tn("relay_leases"))); n != 199_000 {
		t.Fatalf("%d pending rows at or below the watermark, want 199,000", n)
	}

	rec := &recordDB{DB: e.db}
	o, err := ops.New(rec, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	outboxStatements := func() []testenv.Statement {
		var out []testenv.Statement
		for _, s := range rec.Take() {
			if strings.Contains(s.SQL, tn("outbox")) && !strings.Contains(s.SQL, "information_schema") {
				out = append(out, s)
			}
		}
		if len(out) == 0 {
			t.Fatal("no statement read the outbox")
		}
		return out
	}
	check := func(what string) {
		t.Helper()
		for _, s := range outboxStatements() {
			r := explainReads(t, e.pg.Pool, tables.Bare("outbox"), s.SQL, s.Args...)
			t.Logf("%s: %d outbox rows visited, %d buffers", what, r.rows, r.buffers)
			if r.rows > 5_000 {
				t.Errorf("%s visits %d outbox rows of %d (199,000 of them sent):\n%s\n%s", what, r.rows, rows, s.SQL, r.plan)
			}
		}
	}

	for _, c := range []struct {
		what string
		opts []ops.StatusOption
	}{{"status", nil}, {"status, count cap 1000", []ops.StatusOption{ops.WithCountCap(1000)}}} {
		st, err := o.Status(ctx, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if st.Outbox.Pending != 900 || st.Outbox.Dead != 80 || st.Outbox.Discarded != 20 || st.Outbox.CountsCapped {
			t.Fatalf("%s: %+v, want 900 pending (600 above the watermark, 300 retry), 80 dead, 20 discarded", c.what, st.Outbox)
		}
		check(c.what)
	}
	p, err := o.SearchOutbox(ctx, ops.OutboxQuery{Status: "pending", TenantID: "acme", Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 50 || p.NextCursor == "" {
		t.Fatalf("search pending: %d rows, cursor %q", len(p.Rows), p.NextCursor)
	}
	check("search pending")
	// A page past every pending row above the watermark.
	if _, err := o.SearchOutbox(ctx, ops.OutboxQuery{Status: "pending", Limit: 50, After: fmt.Sprint(wmBelow - 1000)}); err != nil {
		t.Fatal(err)
	}
	check("search pending, past the rows above the watermark")

	if n, err := ops.CountPending(ctx, rec.Executor(), tables, 1_000_000); err != nil || n != 900 {
		t.Fatalf("CountPending: %d, %v; want 900", n, err)
	}
	check("CountPending")

	ctl := explainReads(t, e.pg.Pool, tables.Bare("outbox"), fmt.Sprintf(`SELECT topic, shard,
    SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END), MIN(CASE WHEN status = 'pending' THEN created_at END)
FROM %s WHERE status <> 'sent' GROUP BY topic, shard`, tn("outbox")))
	t.Logf("control (status <> 'sent'): %d outbox rows visited, %d buffers", ctl.rows, ctl.buffers)
	if ctl.rows < 199_000 {
		t.Errorf("negative control: the status design's statement visits %d rows; the measure does not see a full read\n%s", ctl.rows, ctl.plan)
	}
}
