package ops_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
)

// TestEvidenceParkedPlan (Postgres): evidence by event id finds a parked
// message through inbox_parked_event_idx (migration 0013), not by reading
// the parked table, which keeps resolved rows as evidence and can grow
// large. With 100,000 parked rows, EXPLAIN ANALYZE of the statement
// Evidence ran on inbox_parked visits one row by that index. Control: with
// the index dropped, the same statement reads the whole table.
func TestEvidenceParkedPlan(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 100,000-row parked table; not with -short")
	}
	ctx := context.Background()
	pg := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(pg.Pool)
	if _, err := migrate.Up(ctx, drv, tables); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO ferry_inbox_parked (consumer, reason, park_key, first_seen, last_seen, resolved_at, resolution, event_id, payload)
SELECT 'c' || (g % 3), 'poison', 'k' || g, now(), now(), CASE WHEN g % 10 = 0 THEN NULL ELSE now() END, CASE WHEN g % 10 = 0 THEN '' ELSE 'replayed' END,
    md5(g::text)::uuid, '\x00'
FROM generate_series(1, 100000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, `VACUUM ANALYZE ferry_inbox_parked`); err != nil {
		t.Fatal(err)
	}
	var id string
	if err := pg.Pool.QueryRow(ctx, `SELECT event_id::text FROM ferry_inbox_parked WHERE park_key = 'k77777'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	rec := &recordDB{DB: drv}
	o, err := ops.New(rec, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := o.Evidence(ctx, id, ops.KindEventID)
	if err != nil || len(ev.Events) != 1 || len(ev.Events[0].Parked) != 1 || ev.Events[0].Parked[0].Resolution != "replayed" {
		t.Fatalf("evidence of %s: %+v %v", id, ev, err)
	}
	var stmt *testenv.Statement
	for _, st := range rec.Take() {
		if strings.Contains(st.SQL, "ferry_inbox_parked") && !strings.Contains(st.SQL, "information_schema") {
			stmt = &st
		}
	}
	if stmt == nil {
		t.Fatal("evidence ran no statement on ferry_inbox_parked")
	}
	r := explainReads(t, pg.Pool, "ferry_inbox_parked", stmt.SQL, stmt.Args...)
	if r.rows != 1 || !strings.Contains(r.plan, "inbox_parked_event_idx") {
		t.Errorf("evidence's parked lookup read %d rows, want 1 by inbox_parked_event_idx\n%s\n%s", r.rows, r.plan, stmt.SQL)
	}

	// Control: without the index the lookup reads every parked row.
	if _, err := pg.Pool.Exec(ctx, `DROP INDEX ferry_inbox_parked_event_idx`); err != nil {
		t.Fatal(err)
	}
	if r := explainReads(t, pg.Pool, "ferry_inbox_parked", stmt.SQL, stmt.Args...); r.rows < 100000 {
		t.Errorf("control: without the index the lookup read %d rows, want the whole table\n%s", r.rows, r.plan)
	}
}
