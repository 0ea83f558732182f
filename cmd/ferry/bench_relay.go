package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

type benchRelayFlags struct {
	dbURL     string
	brokerURL string
	events    int
	rate      int
	latencyN  int
	payload   int
	aggs      int
	workers   int
	batch     int
	// --max-batch-bytes: relay.WithMaxBatchBytes
	batchBytes int
	// --backlog / --table-rows: the large-table drain (bench_relay_scale.go)
	backlog       int
	tableRows     int
	partition     time.Duration // --partition-outbox: the outbox partitioned by created_at
	prototype     string        // --prototype: "watermark" drains with statebench.WatermarkDrain
	sentWatermark bool          // --sent-watermark: the relay runs WithSentWatermark
	shardPipeline int           // --shard-pipeline: relay.WithShardPipeline
	shards        int           // --shards: the writer's and relay's shard count
	asJSON        bool
}

func newBenchRelayCmd() *cobra.Command {
	f := &benchRelayFlags{}
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Relay benchmark: drain rate Postgres → broker, commit→ack latency with and without NOTIFY, peak RSS",
		Long: `Creates a scratch schema in the Postgres database (MySQL: a scratch
database; SQLite: a scratch file; dropped afterwards), then:

  drain    pre-fills --events events and measures how fast one relay with
           default settings publishes them (events/s);
  broker   the broker's own limit in the same run: a plain async publisher
           of the same number and size of messages (no database), and the
           ratio drain / broker;
  latency  writes --latency-events events at --rate per second, once with the
           producer's NOTIFY + the relay's LISTEN and once polling at the
           default interval, and reports commit→broker-ack p50/p99.

Broker: nats://… (a scratch stream, deleted afterwards) or kfake (an
in-process Kafka speaking the wire protocol). Peak RSS is this process's
high-water mark, producer included: an upper bound for the relay's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			return runBenchRelay(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dbURL, "database-url", "", "postgres://… (a scratch schema is created in it), mysql://… (a scratch database is created on the server: needs CREATE and DROP) or sqlite:DIR (a scratch file in DIR; sqlite: alone, a temp dir)")
	fl.StringVar(&f.brokerURL, "broker-url", "nats://127.0.0.1:4222", "nats://… or kfake")
	fl.IntVar(&f.events, "events", 50000, "events to pre-fill for the drain measurement")
	fl.IntVar(&f.rate, "rate", 1000, "events per second for the latency measurement")
	fl.IntVar(&f.latencyN, "latency-events", 5000, "events written for each latency measurement")
	fl.IntVar(&f.payload, "payload-bytes", 300, "payload size")
	fl.IntVar(&f.aggs, "aggregates", 1000, "aggregates the events are spread over")
	fl.IntVar(&f.workers, "workers", relay.DefaultWorkers, "relay workers")
	fl.IntVar(&f.batch, "batch-size", relay.DefaultBatchSize, "relay batch size")
	fl.IntVar(&f.batchBytes, "max-batch-bytes", relay.DefaultMaxBatchBytes, "relay payload bytes per batch (relay.WithMaxBatchBytes)")
	fl.IntVar(&f.backlog, "backlog", 0, "large-table drain instead of the default runs: pre-fill this many pending rows with one INSERT … SELECT generate_series (Postgres only)")
	fl.IntVar(&f.tableRows, "table-rows", 0, "with --backlog: sent rows already in the outbox (ids below the backlog's)")
	fl.DurationVar(&f.partition, "partition-outbox", 0, "with --backlog: a partitioned outbox in ranges of this length (migrate --partition-outbox)")
	fl.BoolVar(&f.asJSON, "json", false, "with --backlog: print one JSON object")
	fl.BoolVar(&f.sentWatermark, "sent-watermark", false, "the relay keeps its state out of the event row (relay.WithSentWatermark, Postgres)")
	fl.IntVar(&f.shardPipeline, "shard-pipeline", 1, "batches of one shard in flight at once (relay.WithShardPipeline, Postgres, status design)")
	fl.IntVar(&f.shards, "shards", ferry.DefaultShardCount, "shard count of the writer and the relay")
	fl.StringVar(&f.prototype, "prototype", "", `with --backlog: "watermark" drains with a prototype of #17's recommended design (claim from a per-shard watermark, one watermark UPDATE per batch, event rows never updated; no leases, fences or failure handling) instead of the relay`)
	return cmd
}

// relayOptions are the relay options the flags set, in every mode.
func (f *benchRelayFlags) relayOptions() []relay.Option {
	ropts := []relay.Option{relay.WithWorkers(f.workers), relay.WithBatchSize(f.batch), relay.WithMaxBatchBytes(f.batchBytes),
		relay.WithShardCount(f.shards), relay.WithShardPipeline(f.shardPipeline)}
	if f.sentWatermark {
		ropts = append(ropts, relay.WithSentWatermark())
	}
	return ropts
}

func runBenchRelay(ctx context.Context, out io.Writer, f *benchRelayFlags) error {
	mysqlDB := strings.HasPrefix(f.dbURL, "mysql://")
	sqliteDB := strings.HasPrefix(f.dbURL, "sqlite:")
	if !strings.HasPrefix(f.dbURL, "postgres") && !mysqlDB && !sqliteDB {
		return errors.New("--database-url must be a postgres://, mysql:// or sqlite:DIR URL")
	}
	if err := relay.CheckOptions(f.relayOptions()...); err != nil {
		return relayFlagError(err)
	}
	if f.backlog > 0 || f.tableRows > 0 || f.asJSON {
		if sqliteDB {
			return errors.New("--backlog, --table-rows, --json: Postgres or MySQL only (the large-table runs pre-fill with server-side SQL); without them sqlite: runs drain, broker and latency")
		}
		return runBenchRelayScale(ctx, out, f)
	}
	if f.events < 1 || f.rate < 1 || f.latencyN < 1 || f.aggs < 1 || f.payload < 0 {
		return errors.New("--events, --rate, --latency-events, --aggregates must be >= 1")
	}
	fmt.Fprintf(out, "ferry bench relay: broker %s, %d-byte payloads over %d aggregates, workers %d, batch %d\n",
		f.brokerURL, f.payload, f.aggs, f.workers, f.batch)
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(out, "load average at start: %s", load)
	}

	drain, err := benchRelayRun(ctx, f, "drain", false)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "drain     %8d events in %-8s %8.0f events/s\n", f.events, drain.elapsed.Round(time.Millisecond), float64(f.events)/drain.elapsed.Seconds())
	if drain.claims.Count > 0 {
		fmt.Fprintf(out, "          statements: %s\n", statementsLine(drain.claims, drain.marks))
	}
	// The broker's own limit, measured now on the same machine state.
	ref, err := benchBrokerReference(ctx, f.brokerURL, f.events, f.payload, f.aggs)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "broker    %8d events in %-8s %8.0f events/s (plain async publisher, same payloads, no database)\n",
		f.events, ref.Round(time.Millisecond), float64(f.events)/ref.Seconds())
	fmt.Fprintf(out, "ratio     drain / broker = %.2f\n", ref.Seconds()/drain.elapsed.Seconds())
	for _, notify := range []bool{true, false} {
		if notify && mysqlDB {
			fmt.Fprintf(out, "latency   NOTIFY       n/a: MySQL has no LISTEN/NOTIFY, the relay polls\n")
			continue
		}
		if notify && sqliteDB {
			fmt.Fprintf(out, "latency   NOTIFY       n/a: SQLite has no LISTEN/NOTIFY (an in-process producer calls Relay.Notify()), the relay polls\n")
			continue
		}
		res, err := benchRelayRun(ctx, f, "latency", notify)
		if err != nil {
			return err
		}
		mode := "NOTIFY"
		if !notify {
			mode = "poll " + relay.DefaultPollInterval.String()
		}
		fmt.Fprintf(out, "latency   %-12s %d events at %d/s: commit→ack p50 %6.2f ms  p99 %7.2f ms  max %7.2f ms\n",
			mode, len(res.lat), f.rate, ms(res.q(0.5)), ms(res.q(0.99)), ms(res.q(1)))
		if res.claims.Count > 0 {
			fmt.Fprintf(out, "          statements: %s\n", statementsLine(res.claims, res.marks))
		}
		if l := res.split.line(); l != "" {
			fmt.Fprintf(out, "          split: %s\n", l)
		}
	}
	fmt.Fprintf(out, "peak RSS  %.1f MB (whole process)\n", float64(benchPeakRSS())/(1<<20))
	return nil
}

type benchResult struct {
	elapsed time.Duration
	lat     []time.Duration // commit→ack, sorted
	// split: where each latency event's time went (latency runs only).
	split latencySplit
	// claims, marks: the relay's claim and mark (watermark design: advance)
	// statements, timed by relayTracer (Postgres only; zero elsewhere).
	claims, marks phaseFigures
}

func (r benchResult) q(p float64) time.Duration { return quantile(r.lat, p) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// latencySplit divides each event's commit→ack time at the moment its
// batch was claimed (the relay's BeforePublish hook), so a tail can be
// told apart: waiting to be claimed (NOTIFY, wake-up, the claim, a cycle
// in the way) or publishing (the broker's ack).
type latencySplit struct {
	events   []latencyParts
	commits  []time.Duration // the producer's Insert (its commit), sorted
	schedP99 time.Duration   // the Go scheduler's goroutine latency p99 in the run
}

// latencyParts is one event's commit→ack: wait + publish.
type latencyParts struct {
	wait    time.Duration // commit → claimed
	publish time.Duration // claimed → ack
}

// quantile is the nearest-rank p-quantile of sorted d (0 when empty): the
// one definition every bench report uses.
func quantile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[max(0, int(math.Ceil(p*float64(len(d))))-1)]
}

// line prints the split: each part's p50/p99, and for the slowest 1 % of
// events (at least one), by commit→ack, the median of each part.
func (s latencySplit) line() string {
	if len(s.events) == 0 {
		return ""
	}
	ev := slices.Clone(s.events)
	slices.SortFunc(ev, func(a, b latencyParts) int { return cmp.Compare(b.wait+b.publish, a.wait+a.publish) })
	parts := func(ev []latencyParts) (wait, publish []time.Duration) {
		for _, e := range ev {
			wait, publish = append(wait, e.wait), append(publish, e.publish)
		}
		slices.Sort(wait)
		slices.Sort(publish)
		return wait, publish
	}
	w, p := parts(ev)
	tail := ev[:max(1, len(ev)/100)]
	tw, tp := parts(tail)
	last := tail[len(tail)-1]
	return fmt.Sprintf("commit→claimed p50 %.2f p99 %.2f ms; claimed→ack p50 %.2f p99 %.2f ms; slowest 1%% (%d, ≥ %.2f ms): medians %.2f ms to the claim, %.2f ms to the ack; producer commit p99 %.2f ms; Go scheduling latency p99 %.0f µs",
		ms(quantile(w, 0.5)), ms(quantile(w, 0.99)), ms(quantile(p, 0.5)), ms(quantile(p, 0.99)),
		len(tail), ms(last.wait+last.publish), ms(quantile(tw, 0.5)), ms(quantile(tp, 0.5)), ms(quantile(s.commits, 0.99)), float64(s.schedP99)/float64(time.Microsecond))
}

// schedLatencies reads the Go runtime's histogram of the time goroutines
// waited runnable before they ran (cumulative since the process started).
func schedLatencies() *metrics.Float64Histogram {
	sm := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(sm)
	if sm[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return sm[0].Value.Float64Histogram()
}

// histP99 is the p99 of the counts added between two reads of one
// runtime histogram (the upper bound of the bucket holding it).
func histP99(before, after *metrics.Float64Histogram) time.Duration {
	if before == nil || after == nil || len(before.Counts) != len(after.Counts) {
		return 0
	}
	var n uint64
	for i := range after.Counts {
		n += after.Counts[i] - before.Counts[i]
	}
	var acc uint64
	for i := range after.Counts {
		acc += after.Counts[i] - before.Counts[i]
		if n > 0 && acc*100 >= n*99 {
			upper := after.Buckets[i+1]
			if math.IsInf(upper, 1) { // the last bucket has no upper bound
				upper = after.Buckets[i]
			}
			return time.Duration(upper * float64(time.Second))
		}
	}
	return 0
}

// benchRelayRun runs one measurement in a fresh schema (MySQL: database)
// and destination.
func benchRelayRun(ctx context.Context, f *benchRelayFlags, kind string, notify bool) (benchResult, error) {
	suffix := benchRandHex()
	if dir, ok := strings.CutPrefix(f.dbURL, "sqlite:"); ok {
		// A scratch file per measurement, in dir (default: a temp dir).
		if dir == "" {
			var err error
			if dir, err = os.MkdirTemp("", "ferry-bench-*"); err != nil {
				return benchResult{}, fmt.Errorf("bench: %w", err)
			}
			defer os.RemoveAll(dir)
		}
		path := filepath.Join(dir, "ferry_bench_"+suffix+".db")
		db, err := sqlite.Open(path)
		if err != nil {
			return benchResult{}, fmt.Errorf("bench: %w", err)
		}
		defer func() {
			_ = db.Close()
			for _, p := range []string{path, path + "-wal", path + "-shm"} {
				_ = os.Remove(p)
			}
		}()
		drv := sqlite.New(db)
		if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
			return benchResult{}, fmt.Errorf("bench: migrate: %w", err)
		}
		return benchRelayMeasure(ctx, f, kind, suffix, drv, drv, nil)
	}
	if strings.HasPrefix(f.dbURL, "mysql://") {
		drv, drop, err := benchMySQLScratch(ctx, f.dbURL, "ferry_bench_"+suffix, f.workers+4)
		if err != nil {
			return benchResult{}, err
		}
		defer drop()
		return benchRelayMeasure(ctx, f, kind, suffix, drv, drv, nil)
	}
	// The relay's workers, lease loop and LISTEN, the producer and the
	// measurement's own queries (pgxpool's default, max(4, CPUs), made the
	// workers wait for connections on two cores).
	// The tracer times the relay's claims and marks (advances), so the
	// report says where a cycle's time goes.
	tr := &relayTracer{}
	pool, drop, err := benchPGScratch(ctx, f.dbURL, "ferry_bench_"+suffix, func(c *pgxpool.Config) {
		c.MaxConns = int32(f.workers + 4)
		c.ConnConfig.Tracer = tr
	})
	if err != nil {
		return benchResult{}, err
	}
	defer drop()
	drv := pgxv5.New(pool)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		return benchResult{}, err
	}
	var listen *pgxpool.Pool
	if notify {
		listen = pool
	}
	res, err := benchRelayMeasure(ctx, f, kind, suffix, drv, drv, listen)
	tr.mu.Lock()
	res.claims, res.marks = phase(tr.claims), phase(tr.marks)
	tr.mu.Unlock()
	return res, err
}

// benchRelayMeasure runs one measurement on a migrated store; listen is
// the pool the relay LISTENs on (nil: poll).
func benchRelayMeasure[TTx any](ctx context.Context, f *benchRelayFlags, kind, suffix string, drv driver.Driver[TTx], rdb relay.DB, listen *pgxpool.Pool) (benchResult, error) {
	notify := listen != nil
	prefix := "ferrybench" + suffix
	pub, cleanup, err := benchPublisher(ctx, f.brokerURL, prefix)
	if err != nil {
		return benchResult{}, err
	}
	defer cleanup()

	wopts := []outbox.Option{outbox.WithTopicTemplate(ferry.TopicTemplate(prefix + ".{aggregate_type}"))}
	ropts := f.relayOptions()
	wopts = append(wopts, outbox.WithShardCount(f.shards))
	if notify {
		wopts = append(wopts, outbox.WithNotify("ferry_bench_"+suffix))
		ropts = append(ropts, relay.WithListener(listen, "ferry_bench_"+suffix))
	}
	w, err := outbox.New(drv, wopts...)
	if err != nil {
		return benchResult{}, err
	}
	payload := []byte(`"` + strings.Repeat("x", max(f.payload-2, 0)) + `"`)
	mk := func(i int) ferry.Event {
		return ferry.Event{TenantID: "bench", AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(i%f.aggs),
			EventType: "order.changed", SchemaVersion: 1, Payload: payload}
	}

	var mu sync.Mutex
	committed := map[string]time.Time{}
	claimedAt := map[string]time.Time{}
	var lat []time.Duration
	var split latencySplit
	if kind == "latency" {
		ropts = append(ropts, relay.WithFaults(relay.Faults{BeforePublish: func(_ context.Context, evs []ferry.Event) error {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			for _, e := range evs {
				if _, ok := committed[e.ID.String()]; ok {
					claimedAt[e.ID.String()] = now
				}
			}
			return nil
		}, AfterPublishBeforeMark: func(_ context.Context, evs []ferry.Event, res []broker.Result) error {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			for i, e := range evs {
				id := e.ID.String()
				if c, ok := committed[id]; ok && res[i].Err == nil {
					lat = append(lat, now.Sub(c))
					if cl, ok := claimedAt[id]; ok {
						split.events = append(split.events, latencyParts{wait: cl.Sub(c), publish: now.Sub(cl)})
					}
					delete(committed, id)
					delete(claimedAt, id)
				}
			}
			return nil
		}}))
	} else {
		for i := 0; i < f.events; {
			batch := make([]ferry.Event, 0, 500)
			for j := 0; j < 500 && i < f.events; j, i = j+1, i+1 {
				batch = append(batch, mk(i))
			}
			if _, err := w.Insert(ctx, batch...); err != nil {
				return benchResult{}, err
			}
		}
	}

	r, err := relay.New(rdb, pub, ropts...)
	if err != nil {
		return benchResult{}, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	defer func() {
		stop()
		<-done
	}()
	want := uint64(f.events)
	var sched *metrics.Float64Histogram
	if kind == "latency" {
		want = uint64(f.latencyN)
		for len(r.Status().OwnedShards) < ferry.DefaultShardCount {
			time.Sleep(10 * time.Millisecond)
		}
		sched = schedLatencies()
		tick := time.NewTicker(time.Second / time.Duration(f.rate))
		for i := 0; i < f.latencyN; i++ {
			<-tick.C
			e := mk(i)
			id, err := ferry.NewEventID()
			if err != nil {
				tick.Stop()
				return benchResult{}, err
			}
			e.ID = id
			// Recorded before the commit so a fast relay cannot miss it,
			// then moved to the moment Insert returned (commit done).
			mu.Lock()
			committed[id.String()] = time.Now()
			mu.Unlock()
			t0 := time.Now()
			if _, err := w.Insert(ctx, e); err != nil {
				tick.Stop()
				return benchResult{}, err
			}
			now := time.Now()
			split.commits = append(split.commits, now.Sub(t0))
			mu.Lock()
			if _, ok := committed[id.String()]; ok {
				committed[id.String()] = now
			}
			mu.Unlock()
		}
		tick.Stop()
	}
	deadline := time.Now().Add(10 * time.Minute)
	for r.Status().Published < want {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return benchResult{}, fmt.Errorf("bench relay: %d of %d published before giving up", r.Status().Published, want)
		}
		time.Sleep(2 * time.Millisecond)
	}
	res := benchResult{elapsed: time.Since(start)}
	mu.Lock()
	res.lat = append(res.lat, lat...)
	res.split = split
	mu.Unlock()
	if sched != nil {
		res.split.schedP99 = histP99(sched, schedLatencies())
	}
	slices.Sort(res.split.commits)
	slices.Sort(res.lat)
	return res, nil
}

// benchPublisher connects to the broker and creates a scratch destination.
func benchPublisher(ctx context.Context, brokerURL, prefix string) (broker.Publisher, func(), error) {
	if brokerURL == "kfake" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(16, prefix+".order"))
		if err != nil {
			return nil, nil, err
		}
		pub, err := kafka.NewPublisher(c.ListenAddrs())
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return pub, func() { _ = pub.Close(); c.Close() }, nil
	}
	pub, err := natsjs.DialPublisher(brokerURL)
	if err != nil {
		return nil, nil, err
	}
	stream := strings.ToUpper(prefix)
	if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}}); err != nil {
		_ = pub.Close()
		return nil, nil, err
	}
	js := pub.JetStream()
	return pub, func() {
		_ = js.DeleteStream(context.WithoutCancel(ctx), stream)
		_ = pub.Close()
	}, nil
}

func benchRandHex() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// benchPeakRSS is this process's resident-set high-water mark (VmHWM).
func benchPeakRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// benchPGScratch creates schema in the Postgres database at dbURL and a
// pool whose search_path is that schema; adjust, when set, edits the
// pool's config first (e.g. a tracer). drop closes the pool and drops the
// schema with everything in it.
func benchPGScratch(ctx context.Context, dbURL, schema string, adjust func(*pgxpool.Config)) (*pgxpool.Pool, func(), error) {
	admin, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, nil, err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %q`, schema)); err != nil {
		admin.Close()
		return nil, nil, err
	}
	dropSchema := func() {
		_, _ = admin.Exec(context.WithoutCancel(ctx), fmt.Sprintf(`DROP SCHEMA %q CASCADE`, schema))
		admin.Close()
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		dropSchema()
		return nil, nil, err
	}
	qv := u.Query()
	qv.Set("search_path", schema)
	u.RawQuery = qv.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		dropSchema()
		return nil, nil, err
	}
	if adjust != nil {
		adjust(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		dropSchema()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); dropSchema() }, nil
}
