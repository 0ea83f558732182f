package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/outboxstate"
	"github.com/ferryhq/ferry/internal/producebench"
	"github.com/ferryhq/ferry/internal/statebench"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/relay"
)

// The large-table drain (#17 item 4): `ferry bench relay --backlog N
// --table-rows M` fills a scratch outbox server-side with M sent rows and
// N pending ones, drains the pending ones with one relay at default
// settings and reports what each event cost Postgres. The relay's own SQL
// is observed through a pgx tracer on its pool, so the claim that is
// EXPLAINed and the phases that are timed are the relay's real statements,
// not copies of them.

// scaleReport is what the large-table drain prints (--json: as is).
type scaleReport struct {
	Broker    string `json:"broker"`
	Schema    string `json:"scratch_schema"` // dropped when the bench ends
	Backlog   int    `json:"backlog"`
	TableRows int    `json:"table_rows"`
	// PartitionSeconds: the outbox's partition interval (0: a plain table).
	PartitionSeconds float64 `json:"partition_interval_seconds,omitempty"`
	// Prototype: the drain ran statebench.WatermarkDrain, not the relay.
	Prototype string `json:"prototype,omitempty"`
	// SentWatermark: the relay ran WithSentWatermark (--sent-watermark).
	SentWatermark bool `json:"sent_watermark,omitempty"`
	// ShardPipeline: relay.WithShardPipeline (--shard-pipeline); Shards:
	// the outbox's and relay's shard count (--shards).
	ShardPipeline int `json:"shard_pipeline"`
	Shards        int `json:"shards"`
	// PrototypeMarks: the watermark UPDATE statements the prototype ran.
	PrototypeMarks int64  `json:"prototype_marks,omitempty"`
	Payload        int    `json:"payload_bytes"`
	Aggregates     int    `json:"aggregates"`
	Workers        int    `json:"workers"`
	Batch          int    `json:"batch_size"`
	BatchBytes     int    `json:"max_batch_bytes"`
	LoadStart      string `json:"load_start"`
	LoadEnd        string `json:"load_end"`

	PrefillSeconds float64 `json:"prefill_seconds"`
	DrainSeconds   float64 `json:"drain_seconds"`
	DrainPerSec    float64 `json:"drain_events_per_sec"`
	BrokerPerSec   float64 `json:"broker_events_per_sec"`
	Ratio          float64 `json:"drain_over_broker"`

	// The relay's claim, EXPLAIN (ANALYZE, BUFFERS) with the arguments of
	// the relay's own first claim: at the full backlog and once drained.
	ClaimAtBacklog explainFigures `json:"claim_at_backlog"`
	ClaimDrained   explainFigures `json:"claim_drained"`
	// The relay's statements during the drain, timed client-side.
	Claims phaseFigures `json:"claims"`
	Marks  phaseFigures `json:"marks"`

	// Per drained event. WAL figures are cluster-wide (see the caveat).
	WALBytesPerEvent float64                 `json:"wal_bytes_per_event"`
	WALRecsPerEvent  float64                 `json:"wal_records_per_event"`
	WALFPIPerEvent   float64                 `json:"wal_fpi_per_event"`
	Table            tableFigures            `json:"outbox_per_event"`
	Indexes          map[string]indexFigures `json:"indexes_per_event"`
	ClientCPUus      float64                 `json:"client_cpu_us_per_event"`
	ServerCPUus      float64                 `json:"server_cpu_us_per_event"`
	// Peak RSS of this process during the drain (VmHWM, reset before it).
	PeakRSSMB float64 `json:"peak_rss_mb"`
}

type explainFigures struct {
	ExecutionMS  float64 `json:"execution_ms"` // median of 3
	PlanningMS   float64 `json:"planning_ms"`
	SharedHit    int64   `json:"shared_hit_blocks"`
	SharedRead   int64   `json:"shared_read_blocks"`
	SharedDirty  int64   `json:"shared_dirtied_blocks"`
	Rows         int64   `json:"rows"`
	ClaimShards  int     `json:"shards_in_claim"`
	ClaimPerShrd int64   `json:"rows_per_shard_limit"`
	// Plan: the plan's nodes, outermost first ("Index Scan ferry_outbox_claim_idx", …).
	Plan []string `json:"plan"`
}

type phaseFigures struct {
	Count  int     `json:"count"`
	MeanMS float64 `json:"mean_ms"`
	P99MS  float64 `json:"p99_ms"`
}

// statementsLine is how every bench report prints the relay's claim and
// mark (watermark design: advance) statement timings.
func statementsLine(claims, marks phaseFigures) string {
	return fmt.Sprintf("%d claims mean %.2f ms p99 %.2f ms; %d marks/advances mean %.2f ms p99 %.2f ms",
		claims.Count, claims.MeanMS, claims.P99MS, marks.Count, marks.MeanMS, marks.P99MS)
}

type tableFigures struct {
	Updates    float64 `json:"n_tup_upd"`
	HOTUpdates float64 `json:"n_tup_hot_upd"`
	SeqTupRead float64 `json:"seq_tup_read"`
	IdxScans   float64 `json:"idx_scan"`
	IdxFetch   float64 `json:"idx_tup_fetch"`
	HeapBytes  float64 `json:"heap_bytes"`
}

type indexFigures struct {
	Scans     float64 `json:"idx_scan"`
	TupRead   float64 `json:"idx_tup_read"`
	TupFetch  float64 `json:"idx_tup_fetch"`
	SizeBytes float64 `json:"size_bytes"`
}

// relayTracer records the relay's claim (first SQL and arguments) and
// times every claim and mark statement.
type relayTracer struct {
	mu        sync.Mutex
	claimSQL  string
	claimArgs []any
	claims    []time.Duration
	marks     []time.Duration
}

type tracerStart struct{}

type tracedQuery struct {
	kind  byte // 'c' claim, 'm' mark
	start time.Time
}

func (t *relayTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	var kind byte
	switch {
	case strings.Contains(d.SQL, "WITH blocked AS"):
		kind = 'c'
		t.mu.Lock()
		if t.claimSQL == "" {
			t.claimSQL, t.claimArgs = d.SQL, append([]any(nil), d.Args...)
		}
		t.mu.Unlock()
	case strings.Contains(d.SQL, "SET status = 'sent'"), strings.Contains(d.SQL, "SET sent_up_to"):
		kind = 'm'
	default:
		return ctx
	}
	return context.WithValue(ctx, tracerStart{}, tracedQuery{kind: kind, start: time.Now()})
}

func (t *relayTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	q, ok := ctx.Value(tracerStart{}).(tracedQuery)
	if !ok {
		return
	}
	d := time.Since(q.start)
	t.mu.Lock()
	defer t.mu.Unlock()
	if q.kind == 'c' {
		t.claims = append(t.claims, d)
	} else {
		t.marks = append(t.marks, d)
	}
}

func (t *relayTracer) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.claims, t.marks = nil, nil
}

func (t *relayTracer) claim() (string, []any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.claimSQL, t.claimArgs
}

func phase(ds []time.Duration) phaseFigures {
	if len(ds) == 0 {
		return phaseFigures{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return phaseFigures{Count: len(s), MeanMS: ms(sum) / float64(len(s)), P99MS: ms(quantile(s, 0.99))}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func runBenchRelayScale(ctx context.Context, out io.Writer, f *benchRelayFlags) error {
	if !strings.HasPrefix(f.dbURL, "postgres") {
		return errors.New("--backlog: the large-table drain runs on Postgres only (--database-url postgres://…)")
	}
	if f.backlog < 1 {
		return fmt.Errorf("--backlog must be >= 1 with --table-rows or --json (got %d)", f.backlog)
	}
	if f.tableRows < 0 || f.aggs < 1 || f.payload < 2 {
		return errors.New("--table-rows must be >= 0, --aggregates >= 1, --payload-bytes >= 2")
	}
	if f.prototype != "" && f.prototype != "watermark" {
		return fmt.Errorf(`--prototype must be "" or "watermark" (got %q)`, f.prototype)
	}
	rep := scaleReport{Broker: f.brokerURL, Backlog: f.backlog, TableRows: f.tableRows, Payload: f.payload, Aggregates: f.aggs,
		Workers: f.workers, Batch: f.batch, BatchBytes: f.batchBytes, LoadStart: loadAvg(), Prototype: f.prototype}
	if !f.asJSON {
		fmt.Fprintf(out, "ferry bench relay --backlog %d --table-rows %d: broker %s, %d-byte payloads over %d aggregates, workers %d, batch %d (at most %d payload bytes)\nload average at start: %s\n",
			f.backlog, f.tableRows, f.brokerURL, f.payload, f.aggs, f.workers, f.batch, f.batchBytes, rep.LoadStart)
	}
	suffix := benchRandHex()
	schema := "ferry_bench_" + suffix
	rep.Schema = schema
	tr := &relayTracer{}
	pool, drop, err := benchPGScratch(ctx, f.dbURL, schema, func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = tr
		c.MaxConns = int32(f.workers + 4)
	})
	if err != nil {
		return err
	}
	defer drop()
	drv := pgxv5.New(pool)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}, partitionOpts(f.partition, 0)...); err != nil {
		return relayFlagError(err)
	}
	rep.PartitionSeconds = f.partition.Seconds()
	prefix := "ferrybench" + suffix
	pub, cleanup, err := benchPublisher(ctx, f.brokerURL, prefix)
	if err != nil {
		return err
	}
	defer cleanup()
	ropts := f.relayOptions()
	rep.SentWatermark, rep.ShardPipeline, rep.Shards = f.sentWatermark, f.shardPipeline, f.shards

	// 1. The relay's claim as it sends it: a relay polling the empty outbox.
	if err := scaleRelay(ctx, drv, pub, ropts, func(*relay.Relay) bool { s, _ := tr.claim(); return s != "" }); err != nil {
		return fmt.Errorf("bench relay: capture the claim: %w", err)
	}
	// 2. Pre-fill server-side, then VACUUM ANALYZE as autovacuum would have.
	t0 := time.Now()
	// Sent rows first (lower ids), then the backlog; see statebench.Fill.
	if err := statebench.Prefill(ctx, pool, ferry.Tables{}, statebench.Fill{Topic: prefix + ".order", Marked: f.tableRows,
		Pending: f.backlog, Aggregates: f.aggs, PayloadBytes: f.payload, MarkedStatus: true, Shards: f.shards}); err != nil {
		return fmt.Errorf("bench relay: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+ferry.Tables{}.Name("outbox")); err != nil {
		return fmt.Errorf("bench relay: vacuum: %w", err)
	}
	rep.PrefillSeconds = time.Since(t0).Seconds()
	claimSQL, claimArgs := tr.claim()
	if rep.ClaimAtBacklog, err = explainClaim(ctx, pool, claimSQL, claimArgs); err != nil {
		return err
	}

	// 3. The drain, on a fresh pool whose backends exit afterwards (a
	// backend reports its table statistics at the latest when it exits).
	dpool, err := pgxpool.NewWithConfig(ctx, pool.Config())
	if err != nil {
		return err
	}
	before, err := scaleSnapshot(ctx, pool, schema)
	if err != nil {
		dpool.Close()
		return err
	}
	tr.reset()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // resets VmHWM (Linux)
	cpu0 := producebench.ReadCPU()
	start := time.Now()
	want := uint64(f.backlog)
	proto := statebench.WatermarkDrain{Pool: dpool, Publisher: pub, Workers: f.workers, Batch: f.batch}
	if f.prototype == "" {
		err = scaleRelay(ctx, pgxv5.New(dpool), pub, ropts, func(r *relay.Relay) bool { return r.Status().Published >= want })
	} else {
		_, rep.PrototypeMarks, err = proto.Run(ctx, f.backlog)
	}
	elapsed := time.Since(start)
	cpu1 := producebench.ReadCPU()
	rep.PeakRSSMB = float64(benchPeakRSS()) / (1 << 20)
	dpool.Close()
	if err != nil {
		return fmt.Errorf("bench relay: drain: %w", err)
	}
	rep.DrainSeconds, rep.DrainPerSec = elapsed.Seconds(), float64(f.backlog)/elapsed.Seconds()
	tr.mu.Lock()
	rep.Claims, rep.Marks = phase(tr.claims), phase(tr.marks)
	tr.mu.Unlock()
	n := float64(f.backlog)
	if cpu0.Client >= 0 && cpu1.Client >= 0 {
		rep.ClientCPUus = float64((cpu1.Client-cpu0.Client)/time.Microsecond) / n
	}
	if cpu0.Server >= 0 && cpu1.Server >= 0 {
		rep.ServerCPUus = float64((cpu1.Server-cpu0.Server)/time.Microsecond) / n
	}
	wantUpd := before.upd + int64(f.backlog)
	if f.prototype != "" || f.sentWatermark {
		wantUpd = before.upd // neither updates an event row it publishes at the first try
	}
	after, err := scaleSnapshotSettled(ctx, pool, schema, wantUpd)
	if err != nil {
		return err
	}
	var sent, total int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE `+outboxstate.Expr(ferry.Tables{}, "o")+` = 'sent'), count(*) FROM `+ferry.Tables{}.Name("outbox")+` o`).Scan(&sent, &total); err != nil {
		return err
	}
	if f.prototype != "" {
		proto.Pool = pool
		covered, err := proto.WatermarkCovers(ctx)
		if err != nil {
			return err
		}
		sent += covered - int64(f.tableRows) // the table's sent rows lie below the watermark too
	}
	if sent != int64(f.backlog+f.tableRows) || total != sent {
		return fmt.Errorf("bench relay: %d of %d rows sent after the drain, want all %d", sent, total, f.backlog+f.tableRows)
	}
	rep.WALBytesPerEvent = float64(after.lsnBytes(before)) / n
	rep.WALRecsPerEvent = float64(after.walRecords-before.walRecords) / n
	rep.WALFPIPerEvent = float64(after.walFPI-before.walFPI) / n
	rep.Table = tableFigures{Updates: float64(after.upd-before.upd) / n, HOTUpdates: float64(after.hot-before.hot) / n,
		SeqTupRead: float64(after.seqRead-before.seqRead) / n, IdxScans: float64(after.idxScan-before.idxScan) / n,
		IdxFetch: float64(after.idxFetch-before.idxFetch) / n, HeapBytes: float64(after.heapBytes-before.heapBytes) / n}
	rep.Indexes = map[string]indexFigures{}
	for name, a := range after.indexes {
		b := before.indexes[name]
		rep.Indexes[name] = indexFigures{Scans: float64(a[0]-b[0]) / n, TupRead: float64(a[1]-b[1]) / n,
			TupFetch: float64(a[2]-b[2]) / n, SizeBytes: float64(a[3]-b[3]) / n}
	}
	if rep.ClaimDrained, err = explainClaim(ctx, pool, claimSQL, claimArgs); err != nil {
		return err
	}

	// 4. The broker's own limit, now, with the same number of messages.
	ref, err := benchBrokerReference(ctx, f.brokerURL, f.backlog, f.payload, f.aggs)
	if err != nil {
		return err
	}
	rep.BrokerPerSec = n / ref.Seconds()
	rep.Ratio = rep.DrainPerSec / rep.BrokerPerSec
	rep.LoadEnd = loadAvg()
	if f.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printScale(out, &rep)
	return nil
}

// scaleRelay runs a relay on db until done reports true (checked every
// 2 ms), then stops it gracefully.
func scaleRelay(ctx context.Context, db relay.DB, pub broker.Publisher, opts []relay.Option, done func(*relay.Relay) bool) error {
	r, err := relay.New(db, pub, opts...)
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	exited := make(chan error, 1)
	go func() { exited <- r.Run(rctx) }()
	deadline := time.Now().Add(10 * time.Minute)
	for !done(r) {
		select {
		case err := <-exited:
			stop()
			return fmt.Errorf("relay stopped early: %w", err)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			<-exited
			return fmt.Errorf("%d published before giving up", r.Status().Published)
		}
	}
	stop()
	if err := <-exited; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// explainClaim runs EXPLAIN (ANALYZE, BUFFERS) of the relay's claim three
// times and keeps the run with the median execution time.
func explainClaim(ctx context.Context, pool *pgxpool.Pool, sql string, args []any) (explainFigures, error) {
	if sql == "" || len(args) < 2 {
		return explainFigures{}, errors.New("bench relay: the relay's claim was not captured")
	}
	var runs []explainFigures
	for i := 0; i < 3; i++ {
		e, err := explainJSON(ctx, pool, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...)
		if err != nil {
			return explainFigures{}, fmt.Errorf("bench relay: explain the claim: %w", err)
		}
		runs = append(runs, e)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].ExecutionMS < runs[j].ExecutionMS })
	r := runs[1]
	if sh, ok := args[0].([]int32); ok {
		r.ClaimShards = len(sh)
	}
	switch per := args[1].(type) {
	case int:
		r.ClaimPerShrd = int64(per)
	case int64:
		r.ClaimPerShrd = per
	}
	return r, nil
}

// explainJSON runs an EXPLAIN … FORMAT JSON statement and reads the top
// plan node's totals (buffers are inclusive of the node's children).
func explainJSON(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) (explainFigures, error) {
	var raw []byte
	if err := q.QueryRow(ctx, sql, args...).Scan(&raw); err != nil {
		return explainFigures{}, err
	}
	var plans []struct {
		Plan struct {
			planNode
			Rows  int64 `json:"Actual Rows"`
			Hit   int64 `json:"Shared Hit Blocks"`
			Read  int64 `json:"Shared Read Blocks"`
			Dirty int64 `json:"Shared Dirtied Blocks"`
		} `json:"Plan"`
		Planning  float64 `json:"Planning Time"`
		Execution float64 `json:"Execution Time"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		return explainFigures{}, fmt.Errorf("unexpected EXPLAIN output: %v", err)
	}
	p := plans[0]
	return explainFigures{ExecutionMS: p.Execution, PlanningMS: p.Planning, SharedHit: p.Plan.Hit, SharedRead: p.Plan.Read,
		SharedDirty: p.Plan.Dirty, Rows: p.Plan.Rows, Plan: p.Plan.planNode.flatten(nil)}, nil
}

// planNode is the part of an EXPLAIN (FORMAT JSON) node the report names.
type planNode struct {
	Type  string     `json:"Node Type"`
	Index string     `json:"Index Name"`
	Plans []planNode `json:"Plans"`
}

func (n planNode) flatten(out []string) []string {
	s := n.Type
	if n.Index != "" {
		s += " " + n.Index
	}
	out = append(out, s)
	for _, c := range n.Plans {
		out = c.flatten(out)
	}
	return out
}

// scaleStats is a snapshot of the outbox's statistics and the WAL position.
type scaleStats struct {
	lsn                          string
	walRecords, walFPI           int64
	upd, hot, seqRead            int64
	idxScan, idxFetch, heapBytes int64
	indexes                      map[string][4]int64 // idx_scan, idx_tup_read, idx_tup_fetch, size
	lsnDiff                      func(a, b string) int64
}

func (s scaleStats) lsnBytes(before scaleStats) int64 { return s.lsnDiff(s.lsn, before.lsn) }

// outboxRels is the outbox and, when it is partitioned, its partitions:
// a partitioned table's own statistics stay zero, its partitions' add up.
const outboxRels = `WITH rel AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2
    UNION ALL
    SELECT i.inhrelid FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhparent JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND c.relname = $2)
`

func scaleSnapshot(ctx context.Context, pool *pgxpool.Pool, schema string) (scaleStats, error) {
	s := scaleStats{indexes: map[string][4]int64{}}
	err := pool.QueryRow(ctx, outboxRels+`SELECT pg_current_wal_insert_lsn()::text, w.wal_records, w.wal_fpi,
    sum(t.n_tup_upd)::bigint, sum(t.n_tup_hot_upd)::bigint, sum(t.seq_tup_read)::bigint, sum(COALESCE(t.idx_scan, 0))::bigint,
    sum(COALESCE(t.idx_tup_fetch, 0))::bigint, sum(pg_relation_size(t.relid))::bigint
FROM pg_stat_user_tables t JOIN rel ON rel.oid = t.relid, pg_stat_wal w GROUP BY 1, 2, 3`, schema, ferry.Tables{}.Bare("outbox")).
		Scan(&s.lsn, &s.walRecords, &s.walFPI, &s.upd, &s.hot, &s.seqRead, &s.idxScan, &s.idxFetch, &s.heapBytes)
	if err != nil {
		return s, fmt.Errorf("bench relay: statistics: %w", err)
	}
	// A partition's index counts under its partitioned index's name.
	rows, err := pool.Query(ctx, outboxRels+`SELECT COALESCE(pc.relname, ic.relname), sum(s.idx_scan)::bigint, sum(s.idx_tup_read)::bigint,
    sum(s.idx_tup_fetch)::bigint, sum(pg_relation_size(s.indexrelid))::bigint
FROM pg_stat_user_indexes s JOIN rel ON rel.oid = s.relid JOIN pg_class ic ON ic.oid = s.indexrelid
LEFT JOIN pg_inherits ii ON ii.inhrelid = s.indexrelid LEFT JOIN pg_class pc ON pc.oid = ii.inhparent
GROUP BY 1`, schema, ferry.Tables{}.Bare("outbox"))
	if err != nil {
		return s, fmt.Errorf("bench relay: index statistics: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var v [4]int64
		if err := rows.Scan(&name, &v[0], &v[1], &v[2], &v[3]); err != nil {
			return s, err
		}
		s.indexes[name] = v
	}
	s.lsnDiff = func(a, b string) int64 {
		var d int64
		_ = pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, a, b).Scan(&d)
		return d
	}
	return s, rows.Err()
}

// scaleSnapshotSettled waits (up to 15 s) until the relay backends'
// statistics arrived, i.e. n_tup_upd reached wantUpd, then snapshots. The
// WAL position is taken first, so waiting adds none of its own.
func scaleSnapshotSettled(ctx context.Context, pool *pgxpool.Pool, schema string, wantUpd int64) (scaleStats, error) {
	var lsn string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		return scaleStats{}, err
	}
	var w [2]int64
	if err := pool.QueryRow(ctx, `SELECT wal_records, wal_fpi FROM pg_stat_wal`).Scan(&w[0], &w[1]); err != nil {
		return scaleStats{}, err
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		s, err := scaleSnapshot(ctx, pool, schema)
		if err != nil || s.upd >= wantUpd || time.Now().After(deadline) {
			s.lsn, s.walRecords, s.walFPI = lsn, w[0], w[1]
			return s, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func printScale(out io.Writer, r *scaleReport) {
	fmt.Fprintf(out, "prefill   %d sent + %d pending rows in %.1fs (INSERT … SELECT generate_series, VACUUM ANALYZE)\n", r.TableRows, r.Backlog, r.PrefillSeconds)
	fmt.Fprintf(out, "drain     %8d events in %6.2fs %8.0f events/s\n", r.Backlog, r.DrainSeconds, r.DrainPerSec)
	if r.SentWatermark {
		fmt.Fprintln(out, "relay     WithSentWatermark: acked rows are passed by a per-shard watermark, not updated")
	}
	if r.ShardPipeline > 1 {
		fmt.Fprintf(out, "relay     WithShardPipeline(%d): up to %d batches of a shard in flight (%d shards)\n", r.ShardPipeline, r.ShardPipeline, r.Shards)
	}
	if r.Prototype != "" {
		fmt.Fprintf(out, "prototype %s: not the relay (no leases, fences, failures or late commits); %d watermark UPDATEs, event rows never updated\n",
			r.Prototype, r.PrototypeMarks)
	}
	fmt.Fprintf(out, "broker    %8.0f events/s (plain async publisher, same payloads, no database)\n", r.BrokerPerSec)
	fmt.Fprintf(out, "ratio     drain / broker = %.2f\n", r.Ratio)
	for _, c := range []struct {
		name string
		e    explainFigures
	}{{"at backlog", r.ClaimAtBacklog}, {"drained", r.ClaimDrained}} {
		fmt.Fprintf(out, "claim     %-10s EXPLAIN (ANALYZE, BUFFERS): %.2f ms execution, %.2f ms planning, shared hit %d read %d dirtied %d, %d rows (%d shards × %d)\n",
			c.name, c.e.ExecutionMS, c.e.PlanningMS, c.e.SharedHit, c.e.SharedRead, c.e.SharedDirty, c.e.Rows, c.e.ClaimShards, c.e.ClaimPerShrd)
		fmt.Fprintf(out, "          plan: %s\n", strings.Join(c.e.Plan, " > "))
	}
	if r.Prototype == "" { // the prototype's statements are not the relay's
		fmt.Fprintf(out, "phases    during the drain: %s\n", statementsLine(r.Claims, r.Marks))
	}
	fmt.Fprintf(out, "wal       %.1f bytes/event, %.2f records/event, %.3f full-page images/event (cluster-wide: includes other sessions' WAL)\n",
		r.WALBytesPerEvent, r.WALRecsPerEvent, r.WALFPIPerEvent)
	t := r.Table
	fmt.Fprintf(out, "outbox    per event: n_tup_upd %.2f, n_tup_hot_upd %.2f, idx_scan %.3f, idx_tup_fetch %.2f, seq_tup_read %.2f, heap +%.0f bytes\n",
		t.Updates, t.HOTUpdates, t.IdxScans, t.IdxFetch, t.SeqTupRead, t.HeapBytes)
	names := make([]string, 0, len(r.Indexes))
	for n := range r.Indexes {
		names = append(names, n)
	}
	sort.Strings(names)
	grown := 0
	for _, n := range names {
		i := r.Indexes[n]
		if i.SizeBytes > 0 {
			grown++
		}
		fmt.Fprintf(out, "index     %-32s per event: idx_scan %.3f, idx_tup_read %.2f, idx_tup_fetch %.2f, size +%.1f bytes\n", n, i.Scans, i.TupRead, i.TupFetch, i.SizeBytes)
	}
	fmt.Fprintf(out, "indexes   %d of %d grew during the drain (a non-HOT mark inserts an entry into each index whose predicate the sent row satisfies)\n", grown, len(names))
	fmt.Fprintf(out, "cpu       relay process %.1f µs/event; every local postgres process %.1f µs/event (includes other sessions)\n", r.ClientCPUus, r.ServerCPUus)
	fmt.Fprintf(out, "peak RSS  %.1f MB during the drain (this process's VmHWM, reset before the drain; the Go heap kept from the pre-fill counts too)\n", r.PeakRSSMB)
	fmt.Fprintf(out, "load average at end: %s\n", r.LoadEnd)
}
