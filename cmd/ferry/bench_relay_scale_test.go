package main

import (
	"context"
	"encoding/json"
	"math"
	"path/filepath"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/testenv"
)

// `ferry bench relay --backlog N --table-rows M` pre-fills a scratch outbox,
// drains it and prints every figure of #17 item 4, each present and
// positive; the scratch schema is gone afterwards.
func TestBenchRelayBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills and drains a 22,000-row outbox")
	}
	pg := testenv.PostgresURL(t)
	nats := testenv.NATSURL(t)
	out, err := runCLI(t, "bench", "relay", "--database-url", pg, "--broker-url", nats,
		"--backlog", "2000", "--table-rows", "20000", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep scaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not a report: %v\n%s", err, out)
	}
	positive := map[string]float64{
		"drain_events_per_sec":          rep.DrainPerSec,
		"broker_events_per_sec":         rep.BrokerPerSec,
		"drain_over_broker":             rep.Ratio,
		"wal_bytes_per_event":           rep.WALBytesPerEvent,
		"outbox n_tup_upd per event":    rep.Table.Updates,
		"claim_at_backlog execution_ms": rep.ClaimAtBacklog.ExecutionMS,
		"claim_at_backlog buffers":      float64(rep.ClaimAtBacklog.SharedHit + rep.ClaimAtBacklog.SharedRead),
		"claim_at_backlog rows":         float64(rep.ClaimAtBacklog.Rows),
		"claim_drained execution_ms":    rep.ClaimDrained.ExecutionMS,
		"claims timed during the drain": float64(rep.Claims.Count),
		"marks timed during the drain":  float64(rep.Marks.Count),
		"mean mark ms":                  rep.Marks.MeanMS,
		"peak_rss_mb":                   rep.PeakRSSMB,
		"client_cpu_us_per_event":       rep.ClientCPUus,
		"indexes reported":              float64(len(rep.Indexes)),
	}
	for name, v := range positive {
		if !(v > 0) {
			t.Errorf("%s = %v, want > 0\n%s", name, v, out)
		}
	}
	// Every pending row was marked exactly once, by a non-HOT update
	// (status is in partial-index predicates): today's design, measured.
	if rep.Table.Updates < 1 || rep.Table.Updates > 1.01 {
		t.Errorf("n_tup_upd per event = %v, want 1 (one mark per event)", rep.Table.Updates)
	}
	if rep.Table.HOTUpdates > 0.01 {
		t.Errorf("n_tup_hot_upd per event = %v: the status mark is not expected to be HOT", rep.Table.HOTUpdates)
	}
	if rep.ClaimAtBacklog.Rows <= rep.ClaimDrained.Rows {
		t.Errorf("claim at backlog returned %d rows, drained %d: want more at the backlog", rep.ClaimAtBacklog.Rows, rep.ClaimDrained.Rows)
	}
	if rep.Backlog != 2000 || rep.TableRows != 20000 || rep.LoadStart == "" {
		t.Errorf("report conditions %+v", rep)
	}

	pool, err := pgxpool.New(context.Background(), pg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var left int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, rep.Schema).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if rep.Schema == "" || left != 0 {
		t.Errorf("scratch schema %q left behind (%d)", rep.Schema, left)
	}

	text, err := runCLI(t, "bench", "relay", "--database-url", pg, "--broker-url", nats, "--backlog", "300", "--aggregates", "30")
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	for _, want := range []string{"drain ", "broker ", "ratio ", "claim     at backlog", "wal ", "n_tup_hot_upd", "peak RSS", "load average at end"} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}
	if _, err := runCLI(t, "bench", "relay", "--database-url", "mysql://root@127.0.0.1:3306/test", "--backlog", "10"); err == nil || !strings.Contains(err.Error(), "--backlog") {
		t.Errorf("--backlog on mysql: err = %v, want a refusal naming the flag", err)
	}
}

// `--prototype watermark` drains the same pre-filled backlog with the
// prototype of #17's recommended design: every row ends at or below its
// shard's watermark (the bench checks it and fails otherwise), no event row
// is updated, and a watermark UPDATE ran per batch. An unknown prototype is
// refused, naming the flag.
func TestBenchRelayPrototypeWatermark(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills and drains a 7,000-row outbox")
	}
	pg := testenv.PostgresURL(t)
	nats := testenv.NATSURL(t)
	out, err := runCLI(t, "bench", "relay", "--database-url", pg, "--broker-url", nats,
		"--backlog", "2000", "--table-rows", "5000", "--prototype", "watermark", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep scaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not a report: %v\n%s", err, out)
	}
	if rep.Prototype != "watermark" || !(rep.DrainPerSec > 0) || rep.PrototypeMarks < 1 {
		t.Errorf("prototype report %+v", rep)
	}
	if rep.Table.Updates != 0 {
		t.Errorf("n_tup_upd per event = %v, want 0: the prototype never updates an event row", rep.Table.Updates)
	}
	out, err = runCLI(t, "bench", "relay", "--database-url", pg, "--broker-url", nats, "--backlog", "10", "--prototype", "hot")
	if err == nil || !strings.Contains(err.Error()+out, "--prototype") {
		t.Errorf("--prototype hot: %v\n%s", err, out)
	}
}

// TestBenchRelaySQLite: `ferry bench relay --database-url sqlite:` drains
// a scratch SQLite file (#17 item 5: SQLite's figures are reported),
// measures the broker alone in the same run, and says NOTIFY does not
// apply; the large-table runs refuse it, naming the flags.
func TestBenchRelaySQLite(t *testing.T) {
	dir := t.TempDir()
	out, err := runCLI(t, "bench", "relay", "--database-url", "sqlite:"+dir, "--broker-url", "kfake",
		"--events", "400", "--latency-events", "50", "--rate", "200", "--aggregates", "20")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"drain          400 events", "ratio     drain / broker = ", "NOTIFY       n/a: SQLite", "latency   poll ", "split: commit→claimed p50 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("scratch files left behind: %v", left)
	}
	if _, err := runCLI(t, "bench", "relay", "--database-url", "sqlite:"+dir, "--backlog", "10"); err == nil || !strings.Contains(err.Error(), "--backlog") {
		t.Errorf("--backlog on SQLite: %v, want an error naming it", err)
	}
}

// TestLatencySplit: the split's tail is the slowest 1 % by commit→ack,
// and its medians come from those events' own parts, not the whole run's.
func TestLatencySplit(t *testing.T) {
	var s latencySplit
	for i := 1; i <= 200; i++ {
		w := time.Duration(i) * time.Microsecond
		if i > 198 { // the two slowest wait 10 ms for a claim
			w = 10 * time.Millisecond
		}
		s.events = append(s.events, latencyParts{wait: w, publish: time.Millisecond})
	}
	s.commits = []time.Duration{time.Millisecond, 3 * time.Millisecond}
	got := s.line()
	for _, want := range []string{"slowest 1% (2, ≥ 11.00 ms): medians 10.00 ms to the claim, 1.00 ms to the ack", "claimed→ack p50 1.00 p99 1.00 ms", "producer commit p99 3.00 ms"} {
		if !strings.Contains(got, want) {
			t.Errorf("split %q lacks %q", got, want)
		}
	}
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, time.Duration(i))
	}
	for p, want := range map[float64]time.Duration{0.5: 50, 0.99: 99, 1: 100, 0: 1} {
		if got := quantile(hundred, p); got != want {
			t.Errorf("quantile(1..100, %v) = %d, want %d (nearest rank)", p, got, want)
		}
	}
	if quantile(nil, 0.99) != 0 {
		t.Errorf("quantile of nothing is not 0")
	}
	before := &metrics.Float64Histogram{Counts: []uint64{5, 0, 0}, Buckets: []float64{0, 0.001, 0.002, 0.004}}
	after := &metrics.Float64Histogram{Counts: []uint64{5 + 98, 1, 1}, Buckets: before.Buckets}
	if p := histP99(before, after); p != 2*time.Millisecond {
		t.Errorf("histP99 = %v, want 2ms (the 99th of 100 new counts is in the second bucket)", p)
	}
	open := &metrics.Float64Histogram{Counts: []uint64{0, 1}, Buckets: []float64{0, 0.003, math.Inf(1)}}
	if p := histP99(&metrics.Float64Histogram{Counts: []uint64{0, 0}, Buckets: open.Buckets}, open); p != 3*time.Millisecond {
		t.Errorf("histP99 in the unbounded last bucket = %v, want its lower bound 3ms", p)
	}
	if p := histP99(before, &metrics.Float64Histogram{Counts: []uint64{1}}); p != 0 {
		t.Errorf("histP99 of mismatched histograms = %v, want 0", p)
	}
}
