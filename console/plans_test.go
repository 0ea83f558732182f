package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
)

// recDB is a real database whose executor also records each statement
// (transactions are not recorded: no page runs one).
type recDB struct {
	ops.DB
	rec *testenv.Recorder
}

func (d recDB) Executor() driver.Executor { return d.rec.Wrap(d.DB.Executor()) }

// TestConsolePagePlans: every page of the scale benchmark (200,000-row
// outbox by default, FERRY_SCALE_ROWS overrides; 10% dead), through the
// HTTP handlers; each statement ops sent that reads the outbox is run
// again under EXPLAIN ANALYZE with the same arguments, and a plan with a
// sequential scan of the outbox fails the test. The plans of the overview
// and of the dead-letter pages are logged with their timings.
func TestConsolePagePlans(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 200,000-row outbox; not with -short")
	}
	rows := 200_000
	if v := os.Getenv("FERRY_SCALE_ROWS"); v != "" {
		fmt.Sscan(v, &rows)
	}
	e := newScaleEnv(t, rows)
	checkPagePlans(t, e, scalePages(t, e, rows))

	// The overview's counts stop at the cap (2,500 dead letters per shard
	// here), the dead-letter list's total at ops.CountCap.
	_, b, _ := call(t, e, "GET", "/api/v1/status", viewerToken, nil)
	var st console.StatusResponse
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if !st.Status.Outbox.CountsCapped || st.CountCap != console.OverviewCountCap || len(st.Status.Shards) == 0 {
		t.Fatalf("overview at scale: %+v", st.Status.Outbox)
	}
	for _, sh := range st.Status.Shards {
		if sh.Dead > console.OverviewCountCap || (sh.Dead == console.OverviewCountCap) != sh.CountsCapped {
			t.Fatalf("shard %d: dead %d capped %v", sh.Shard, sh.Dead, sh.CountsCapped)
		}
	}
	_, b, _ = call(t, e, "GET", "/api/v1/dead?limit=1", viewerToken, nil)
	var dead ops.Page[ops.OutboxMessage]
	if err := json.Unmarshal(b, &dead); err != nil || dead.Total != ops.CountCap || !dead.TotalCapped {
		t.Fatalf("dead letters at scale: total %d capped %v, %v", dead.Total, dead.TotalCapped, err)
	}
}

// TestConsolePagePlansPartitioned: the same pages over a partitioned
// outbox (migrate.WithPartitionedOutbox, daily partitions; the rows spread
// over the last days): no statement reads a partition sequentially.
func TestConsolePagePlansPartitioned(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a 200,000-row outbox; not with -short")
	}
	rows := 200_000
	e := newScaleEnvOn(t, "postgres-partitioned", rows)
	var parts int
	if err := e.pg.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT tableoid) FROM ferry_outbox`).Scan(&parts); err != nil || parts < 3 {
		t.Fatalf("rows in %d partitions (%v), want >= 3", parts, err)
	}
	checkPagePlans(t, e, scalePages(t, e, rows))
}

func checkPagePlans(t testing.TB, e *env, pages []scalePage) {
	t.Helper()
	ctx := context.Background()
	rec := &testenv.Recorder{}
	o, err := ops.New(recDB{e.db, rec}, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := console.New(o, console.Config{Auth: testTokens(t), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	defer srv.Close()
	pe := *e
	pe.srv = srv
	checked := 0
	// On a partitioned outbox a sequential scan of a partition that holds
	// no row reads no page, and one of a partition of a few rows reads a
	// page or two, which is the plan the planner should choose (a CI run
	// just after midnight UTC met today's partition holding the 25 rows the
	// pages wrote, read sequentially); one of a partition holding more
	// fails like one of the plain table.
	const fewRows = 1000
	var nonEmpty []string
	nrows, err := e.pg.Pool.Query(ctx, `SELECT tableoid::regclass::text FROM ferry_outbox GROUP BY tableoid HAVING count(*) > $1`, fewRows)
	if err != nil {
		t.Fatal(err)
	}
	for nrows.Next() {
		var n string
		_ = nrows.Scan(&n)
		nonEmpty = append(nonEmpty, n)
	}
	nrows.Close()
	seqScanned := func(plan string) bool {
		for _, n := range nonEmpty {
			if strings.Contains(plan, "Seq Scan on "+n+" ") {
				return true
			}
		}
		return false
	}
	for _, p := range pages {
		rec.Take()
		if code, body, _ := call(t, &pe, "GET", p.path, viewerToken, nil); code != 200 {
			t.Fatalf("%s: %d %s", p.path, code, body)
		}
		for _, st := range rec.Take() {
			if p.name == "overview" {
				t.Logf("overview statement took %s: %.160s", st.Took.Round(10*time.Microsecond), strings.Join(strings.Fields(st.SQL), " "))
			}
			if !strings.Contains(st.SQL, "ferry_outbox") {
				continue
			}
			rows, err := e.pg.Pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+st.SQL, st.Args...)
			if err != nil {
				t.Fatalf("%s: explain %s: %v", p.name, st.SQL, err)
			}
			var plan []string
			for rows.Next() {
				var l string
				if err := rows.Scan(&l); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, l)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Fatalf("%s: explain %s: %v", p.name, st.SQL, err)
			}
			checked++
			text := strings.Join(plan, "\n")
			if seqScanned(text) {
				t.Errorf("%s: sequential scan of the outbox:\n%s\n%s", p.name, st.SQL, text)
			}
			if p.name == "overview" || strings.HasPrefix(p.name, "dead_") {
				t.Logf("%s:\n%s\n%s", p.name, st.SQL, text)
			}
		}
	}
	if checked < len(pages)-3 { // parked, effects and audit pages need not read the outbox
		t.Fatalf("only %d outbox statements checked for %d pages: the recorder misses them", checked, len(pages))
	}
}
