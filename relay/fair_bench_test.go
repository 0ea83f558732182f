package relay

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/outbox"
)

// BenchmarkNoisyTenant: a quiet tenant commits one event every 10ms while
// a noisy tenant commits a burst of FERRY_BENCH_NOISY events (default
// 100,000 over 1,000 aggregates) in one transaction, so the whole backlog
// appears at once; the relay (default settings, 16 shards, LISTEN/NOTIFY) drains
// Postgres → the system NATS JetStream server. It reports the quiet
// tenant's commit → broker ack delay (p50, p99, max) for the events it
// committed between the start of the burst and the end of its drain,
// without and with WithTenantShare (FERRY_BENCH_SHARE, default 100), in
// the same run. Run once (b.N is ignored):
//
//	go test ./relay -run '^$' -bench NoisyTenant -benchtime 1x
func BenchmarkNoisyTenant(b *testing.B) {
	noisy := envInt(b, "FERRY_BENCH_NOISY", 100000)
	share := envInt(b, "FERRY_BENCH_SHARE", 100)
	for _, sh := range []int{0, share} {
		name := "share_off"
		if sh > 0 {
			name = "share_" + strconv.Itoa(sh)
		}
		b.Run(name, func(b *testing.B) { benchNoisyTenant(b, noisy, sh) })
	}
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func benchNoisyTenant(b *testing.B, noisy, share int) {
	const channel = "ferry_bench_fair"
	n, prefix := systemNATS(b)
	s := newPGStore(b, ferry.DefaultShardCount, outbox.WithNotify(channel), outbox.WithTopicTemplate(ferry.TopicTemplate(prefix+".{aggregate_type}")))
	insert := s.insert

	var mu sync.Mutex
	committed := map[string]time.Time{} // quiet events: id → commit time
	type sample struct {
		at    time.Time // commit
		delay time.Duration
	}
	var quiet []sample
	noisyAcked := 0
	hook := func(_ context.Context, evs []ferry.Event, res []broker.Result) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for i := range evs {
			if res[i].Err != nil {
				continue
			}
			if evs[i].TenantID == "noisy" {
				noisyAcked++
				continue
			}
			if c, ok := committed[evs[i].ID.String()]; ok {
				quiet = append(quiet, sample{c, now.Sub(c)})
				delete(committed, evs[i].ID.String())
			}
		}
		return nil
	}
	opts := []Option{WithShardCount(s.shards), WithListener(s.pool, channel), WithFaults(Faults{AfterPublishBeforeMark: hook})}
	if share > 0 {
		opts = append(opts, WithTenantShare(share))
	}
	r, err := s.newRelay(n.publisher(b), opts...)
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

	// The quiet tenant: one event per 10ms until told to stop.
	quietStop := make(chan struct{})
	quietDone := make(chan error, 1)
	var quietN int
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-quietStop:
				quietDone <- nil
				return
			case <-tick.C:
			}
			id, _ := ferry.NewEventID()
			e := ferry.Event{ID: id, TenantID: "quiet", AggregateType: "order", AggregateID: "q-" + strconv.Itoa(i%50),
				EventType: "order.changed", SchemaVersion: 1, Payload: payload}
			mu.Lock()
			committed[id.String()] = time.Now() // before Insert, so a fast relay cannot beat the map
			mu.Unlock()
			if _, err := insert(ctx, e); err != nil {
				quietDone <- err
				return
			}
			mu.Lock()
			if _, pending := committed[id.String()]; pending {
				committed[id.String()] = time.Now()
			}
			quietN++
			mu.Unlock()
		}
	}()
	time.Sleep(time.Second) // the quiet tenant alone first

	// The burst commits in one transaction, so the whole backlog appears
	// at once (a bulk import): written in statements of 500, over 1,000
	// aggregates.
	writeStart := time.Now()
	tx, err := s.begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < noisy; {
		batch := make([]ferry.Event, 0, 500)
		for j := 0; j < 500 && i < noisy; j, i = j+1, i+1 {
			batch = append(batch, ferry.Event{TenantID: "noisy", AggregateType: "order", AggregateID: "n-" + strconv.Itoa(i%1000),
				EventType: "order.changed", SchemaVersion: 1, Payload: payload})
		}
		if _, err := tx.insert(ctx, batch...); err != nil {
			b.Fatal(err)
		}
	}
	burstWritten := time.Since(writeStart)
	b.ResetTimer()
	burstStart := time.Now()
	if err := tx.commit(ctx); err != nil {
		b.Fatal(err)
	}
	for {
		mu.Lock()
		acked := noisyAcked
		mu.Unlock()
		if acked >= noisy {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	drained := time.Since(burstStart)
	b.StopTimer()
	close(quietStop)
	if err := <-quietDone; err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	total := quietN
	mu.Unlock()
	for r.Status().Published < uint64(noisy+total) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	for _, q := range quiet {
		if !q.at.Before(burstStart) && q.at.Before(burstStart.Add(drained)) {
			lat = append(lat, q.delay)
		}
	}
	if len(lat) == 0 {
		b.Fatal("no quiet event was committed during the burst")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	q := func(p float64) float64 { return ms(lat[int(float64(len(lat)-1)*p)]) }
	b.ReportMetric(q(0.50), "quiet_p50_ms")
	b.ReportMetric(q(0.99), "quiet_p99_ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "quiet_max_ms")
	b.ReportMetric(float64(len(lat)), "quiet_events")
	b.ReportMetric(burstWritten.Seconds(), "burst_write_s")
	b.ReportMetric(drained.Seconds(), "drain_s")
	b.ReportMetric(float64(noisy)/drained.Seconds(), "noisy_events/s")
	reportPhases(b, r)
}
