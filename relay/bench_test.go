package relay

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/outbox"
)

// Benchmarks (not timed tests). Run, e.g.:
//
//	go test ./relay -run '^$' -bench 'Drain' -benchtime 50000x
//	go test ./relay -run '^$' -bench 'Latency' -benchtime 3000x
//
// b.N is the number of events. Drain pre-fills b.N events (timer stopped)
// and measures how fast one relay with default settings empties the
// outbox; Latency writes b.N events at 1,000/s and measures commit → broker
// ack per event.

// prefill writes n events of 300-byte payloads over 1,000 aggregates in
// calls of 500.
func prefill(b *testing.B, insert func(context.Context, ...ferry.Event) ([]ferry.Event, error), n int) {
	b.Helper()
	payload := `{"v":"` + strings.Repeat("x", 290) + `"}`
	ctx := context.Background()
	for i := 0; i < n; {
		batch := make([]ferry.Event, 0, 500)
		for j := 0; j < 500 && i < n; j, i = j+1, i+1 {
			batch = append(batch, ferry.Event{TenantID: "t1", AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(i%1000),
				EventType: "order.changed", SchemaVersion: 1, Payload: []byte(payload)})
		}
		if _, err := insert(ctx, batch...); err != nil {
			b.Fatal(err)
		}
	}
}

func benchDrain(b *testing.B, s *store, pub broker.Publisher, extra ...Option) {
	b.Helper()
	b.StopTimer()
	b.ReportAllocs()
	prefill(b, s.insert, b.N)
	db := s.db
	if s.pool != nil {
		// A pool for the relay's workers and lease loop: the schema's
		// default pool (max(4, CPUs)) made workers wait on two cores.
		pool, err := pgxpool.New(context.Background(), testenv.WithParam(b, s.url, "pool_max_conns", strconv.Itoa(DefaultWorkers+2)))
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		db = pgxv5.New(pool)
	}
	r, err := New(db, pub, append([]Option{WithShardCount(s.shards)}, extra...)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- r.Run(ctx) }()
	for r.Status().Published < uint64(b.N) {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(peakRSS())/(1<<20), "peakRSS_MB")
	reportPhases(b, r)
}

// reportPhases reports the mean duration of each cycle phase, in ms.
func reportPhases(b *testing.B, r *Relay) {
	for _, ph := range []string{"claim", "publish", "mark_sent"} {
		var d dto.Metric
		h, err := r.m.phase.GetMetricWithLabelValues(ph)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.(prometheus.Metric).Write(&d); err != nil {
			b.Fatal(err)
		}
		if c := d.Histogram.GetSampleCount(); c > 0 {
			b.ReportMetric(d.Histogram.GetSampleSum()/float64(c)*1000, ph+"_ms")
		}
	}
}

// BenchmarkDrainNATS: Postgres → the system NATS JetStream server.
func BenchmarkDrainNATS(b *testing.B) {
	s := newPGStore(b, ferry.DefaultShardCount)
	n, prefix := systemNATS(b)
	s.insert = s.writer(b, ferry.TopicTemplate(prefix+".{aggregate_type}"))
	benchDrain(b, s, n.publisher(b))
}

// BenchmarkDrainNATSWatermark: the same drain with the relay's state out
// of the event row (WithSentWatermark).
func BenchmarkDrainNATSWatermark(b *testing.B) {
	s := newPGStore(b, ferry.DefaultShardCount)
	n, prefix := systemNATS(b)
	s.insert = s.writer(b, ferry.TopicTemplate(prefix+".{aggregate_type}"))
	benchDrain(b, s, n.publisher(b), WithSentWatermark())
}

// BenchmarkDrainNATSMySQL: MySQL/MariaDB → the system NATS JetStream
// server (the same drain; the claim is one statement per owned shard).
func BenchmarkDrainNATSMySQL(b *testing.B) {
	s := newMySQLStore(b, ferry.DefaultShardCount)
	n, prefix := systemNATS(b)
	s.insert = s.writer(b, ferry.TopicTemplate(prefix+".{aggregate_type}"))
	benchDrain(b, s, n.publisher(b))
}

// BenchmarkDrainKafka: Postgres → kfake (in-process Kafka over the wire).
func BenchmarkDrainKafka(b *testing.B) {
	s := newPGStore(b, ferry.DefaultShardCount)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(16, kafkaTopic))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	pub, err := kafka.NewPublisher(c.ListenAddrs())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pub.Close() })
	benchDrain(b, s, pub)
}

// BenchmarkLatency: commit → broker ack at 1,000 events/s, with the
// producer's NOTIFY + LISTEN, and without (polling at the default 500ms,
// and at 10ms).
func BenchmarkLatency(b *testing.B) {
	for _, mode := range []string{"notify", "poll500ms", "poll10ms"} {
		b.Run(mode, func(b *testing.B) {
			var extra []outbox.Option
			opts := []Option{}
			if mode == "notify" {
				extra = append(extra, outbox.WithNotify("ferry_bench"))
			}
			s := newPGStore(b, ferry.DefaultShardCount, extra...)
			n, prefix := systemNATS(b)
			insert := s.writerWith(b, ferry.TopicTemplate(prefix+".{aggregate_type}"), extra...)
			switch mode {
			case "notify":
				opts = append(opts, WithListener(s.pool, "ferry_bench"))
			case "poll10ms":
				opts = append(opts, WithPollInterval(10*time.Millisecond))
			}
			benchLatency(b, s, n.publisher(b), insert, opts...)
		})
	}
}

func benchLatency(b *testing.B, s *store, pub broker.Publisher, insert func(context.Context, ...ferry.Event) ([]ferry.Event, error), extra ...Option) {
	b.Helper()
	var mu sync.Mutex
	committed := map[string]time.Time{}
	var lat []time.Duration
	hook := func(_ context.Context, evs []ferry.Event, res []broker.Result) error {
		now := time.Now()
		mu.Lock()
		for i, e := range evs {
			if res[i].Err == nil {
				if c, ok := committed[e.ID.String()]; ok {
					lat = append(lat, now.Sub(c))
					delete(committed, e.ID.String())
				}
			}
		}
		mu.Unlock()
		return nil
	}
	r, err := s.newRelay(pub, append([]Option{WithShardCount(s.shards), WithFaults(Faults{AfterPublishBeforeMark: hook})}, extra...)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for len(r.Status().OwnedShards) < s.shards {
		time.Sleep(10 * time.Millisecond)
	}
	payload := []byte(`{"v":"` + strings.Repeat("x", 290) + `"}`)
	b.ResetTimer()
	tick := time.NewTicker(time.Millisecond) // 1,000 events/s
	for i := 0; i < b.N; i++ {
		<-tick.C
		id, _ := ferry.NewEventID()
		e := ferry.Event{ID: id, TenantID: "t1", AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(i%1000),
			EventType: "order.changed", SchemaVersion: 1, Payload: payload}
		// The commit time is taken when Insert returns (commit done); it
		// is recorded before that so a fast relay cannot beat the map.
		mu.Lock()
		committed[id.String()] = time.Now()
		mu.Unlock()
		if _, err := insert(ctx, e); err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		if _, pending := committed[id.String()]; pending {
			committed[id.String()] = time.Now()
		}
		mu.Unlock()
	}
	tick.Stop()
	for r.Status().Published < uint64(b.N) {
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) == 0 {
		b.Fatal("no latencies recorded")
	}
	q := func(p float64) float64 { return float64(lat[int(float64(len(lat)-1)*p)]) / float64(time.Millisecond) }
	b.ReportMetric(q(0.50), "p50_ms")
	b.ReportMetric(q(0.99), "p99_ms")
	b.ReportMetric(float64(peakRSS())/(1<<20), "peakRSS_MB")
}

// peakRSS is the process's high-water resident set (VmHWM), in bytes.
func peakRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			var kb int64
			_, _ = fmt.Sscanf(strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkProducerNotify measures what outbox.WithNotify costs the
// producer: commits per second of one-event transactions from 8
// concurrent writers (pgbench-style), with and without the pg_notify in
// the insert statement. b.N is the number of commits.
func BenchmarkProducerNotify(b *testing.B) {
	for _, notify := range []bool{false, true} {
		name := "plain"
		if notify {
			name = "notify"
		}
		b.Run(name, func(b *testing.B) {
			var extra []outbox.Option
			if notify {
				extra = append(extra, outbox.WithNotify("ferry_bench_notify"))
			}
			s := newPGStore(b, ferry.DefaultShardCount, extra...)
			payload := []byte(`{"v":"` + strings.Repeat("x", 290) + `"}`)
			const writers = 8
			var next sync.WaitGroup
			jobs := make(chan int, writers)
			ctx := context.Background()
			var failed error
			var failMu sync.Mutex
			b.ResetTimer()
			start := time.Now()
			for range writers {
				next.Add(1)
				go func() {
					defer next.Done()
					for i := range jobs {
						_, err := s.insert(ctx, ferry.Event{TenantID: "t1", AggregateType: "order", AggregateID: "agg-" + strconv.Itoa(i%1000),
							EventType: "order.changed", SchemaVersion: 1, Payload: payload})
						if err != nil {
							failMu.Lock()
							failed = err
							failMu.Unlock()
						}
					}
				}()
			}
			for i := 0; i < b.N; i++ {
				jobs <- i
			}
			close(jobs)
			next.Wait()
			b.StopTimer()
			if failed != nil {
				b.Fatal(failed)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "commits/s")
		})
	}
}
