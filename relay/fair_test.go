package relay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/outbox"
)

// tenantEv is ev for another tenant.
func tenantEv(tenant, agg, payload string) ferry.Event {
	e := ev(agg, payload)
	e.TenantID = tenant
	return e
}

// produceTenants writes n events spread round-robin over tenants tenants
// and aggs aggregates per tenant, in transactions of up to 50 events.
func (s *store) produceTenants(t testing.TB, n, aggs, tenants int) []ferry.Event {
	t.Helper()
	ctx := context.Background()
	var out []ferry.Event
	for i := 0; i < n; {
		var batch []ferry.Event
		for j := 0; j < 50 && i < n; j, i = j+1, i+1 {
			batch = append(batch, tenantEv(fmt.Sprintf("tenant-%d", i%tenants), fmt.Sprintf("agg-%03d", (i/tenants)%aggs), fmt.Sprint(i)))
		}
		got, err := s.insert(ctx, batch...)
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
		out = append(out, got...)
	}
	return out
}

// allStores are the server stores and SQLite.
func allStores() []storeCase {
	return append(append([]storeCase{}, serverStores...), storeCase{"sqlite",
		func(t testing.TB, shards int, _ ...outbox.Option) *store { return newSQLiteStore(t, shards) }})
}

// TestTenantShareQuietNotStarved: a noisy tenant's backlog of 10× the batch
// size is committed before one event of a quiet tenant, on one shard. With
// WithTenantShare the quiet event goes out in the first or second batch;
// without it (the negative control, today's id order) it waits behind the
// whole backlog. Both runs deliver everything once, per aggregate in order.
func TestTenantShareQuietNotStarved(t *testing.T) {
	eachStore(t, allStores(), func(t *testing.T, newStore newStoreFunc) {
		for _, share := range []int{5, 0} {
			name := "share_5"
			if share == 0 {
				name = "control_without_share"
			}
			t.Run(name, func(t *testing.T) { testQuietNotStarved(t, newStore, share) })
		}
	})
}

func testQuietNotStarved(t *testing.T, newStore newStoreFunc, share int) {
	const batch, noisy = 20, 200
	s := newStore(t, 1)
	n := startEmbeddedNATS(t)
	ctx := context.Background()
	var want []ferry.Event
	for i := 0; i < noisy; i += 50 {
		var evs []ferry.Event
		for j := i; j < i+50; j++ {
			evs = append(evs, tenantEv("noisy", fmt.Sprintf("agg-%02d", j%10), fmt.Sprint(j)))
		}
		got, err := s.insert(ctx, evs...)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, got...)
	}
	quiet, err := s.insert(ctx, tenantEv("quiet", "q-1", "quiet"))
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, quiet...)

	var mu sync.Mutex
	batches, quietBatch := 0, 0
	hook := func(_ context.Context, evs []ferry.Event) error {
		mu.Lock()
		defer mu.Unlock()
		batches++
		for _, e := range evs {
			if e.TenantID == "quiet" {
				quietBatch = batches
			}
		}
		return nil
	}
	opts := fastOpts(1, WithBatchSize(batch), WithWorkers(1), WithFaults(Faults{BeforePublish: hook}))
	if share > 0 {
		opts = append(opts, WithTenantShare(share))
	}
	r, err := s.newRelay(n.publisher(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, r)
	waitFor(t, 60*time.Second, "all sent", func() bool { return s.count(t, "sent") == len(want) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("share %d: quiet event in batch %d of %d", share, quietBatch, batches)
	if quietBatch == 0 {
		t.Fatal("the quiet event was never published")
	}
	if share > 0 && quietBatch > 2 {
		t.Errorf("with a tenant share of %d the quiet event went out in batch %d; want within the first 2", share, quietBatch)
	}
	if share == 0 && quietBatch < noisy/batch {
		t.Errorf("without a share the quiet event went out in batch %d, before the %d-event backlog (%d batches): the control does not show the starvation", quietBatch, noisy, noisy/batch)
	}
	if share > 0 && batches < noisy/share {
		t.Errorf("%d batches for %d noisy events at share %d: the share did not cap the noisy tenant", batches, noisy, share)
	}
	checkBroker(t, n.read(t), want)
}

// TestPublishRate: with WithPublishRate(R, B) the broker's own store times
// show that no window of the drain holds more than R×window + B events
// (plus one claim of slack for the batch whose tokens were taken before the
// window opened), and the drain takes at least (N−B)/R. The negative
// control drains the same backlog unlimited and breaks the bound.
func TestPublishRate(t *testing.T) {
	const events, rateR, burst = 300, 200.0, 20
	for _, limited := range []bool{true, false} {
		name := "limited"
		if !limited {
			name = "control_unlimited"
		}
		t.Run(name, func(t *testing.T) {
			s := newPGStore(t, 4)
			n := startEmbeddedNATS(t)
			want := s.produceTenants(t, events, 10, 2)
			opts := fastOpts(4, WithBatchSize(50))
			if limited {
				opts = append(opts, WithPublishRate(rateR, burst))
			}
			r, err := s.newRelay(n.publisher(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runRelay(t, r)
			waitFor(t, 60*time.Second, "all sent", func() bool { return s.count(t, "sent") == events })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			msgs := n.read(t)
			checkBroker(t, msgs, want)
			at := make([]time.Time, len(msgs))
			for i, m := range msgs {
				at[i] = m.stored
			}
			sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
			span := at[len(at)-1].Sub(at[0])
			minSpan := time.Duration(float64(events-burst) / rateR * float64(time.Second))
			// Worst window: j-i+1 events within at[j]-at[i].
			worst, worstAt := 0.0, time.Duration(0)
			slack := float64(burst + burst) // the burst, and one claim's tokens taken before the window
			for i := range at {
				for j := i; j < len(at); j++ {
					w := at[j].Sub(at[i])
					if over := float64(j-i+1) - (rateR*w.Seconds() + slack); over > worst {
						worst, worstAt = over, w
					}
				}
			}
			t.Logf("%s: %d events over %s (min for the rate %s); worst window excess %.0f events over %s", name, events, span.Round(time.Millisecond), minSpan, worst, worstAt)
			if limited {
				if span < minSpan*9/10 {
					t.Errorf("%d events reached the broker in %s; at %g/s with burst %d they need at least %s", events, span, rateR, burst, minSpan)
				}
				if worst > 0 {
					t.Errorf("a window of %s held %.0f events more than rate×window + %g", worstAt, worst, slack)
				}
				return
			}
			if span >= minSpan*9/10 && worst <= 0 {
				t.Fatalf("unlimited drain also took %s with no window over the bound: the test cannot tell a limiter from none", span)
			}
		})
	}
}

// TestPublishRateWaitDropsLostLease: a batch waiting for publish tokens is
// not published for a shard whose lease changed hands meanwhile (new
// fence) nor once the relay's leases lapsed unrenewed; the rows of a shard
// still held go out. Control: with the leases kept the whole batch goes.
func TestPublishRateWaitDropsLostLease(t *testing.T) {
	s := newSQLiteStore(t, 2)
	n := startEmbeddedNATS(t)
	r, err := s.newRelay(n.publisher(t), WithShardCount(2), WithPublishRate(20, 4), WithLeaseTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	batch := func() []claimed {
		var b []claimed
		for i := range 4 {
			b = append(b, claimed{id: int64(i + 1), fence: 7, ev: ferry.Event{Shard: i % 2}})
		}
		return b
	}
	lease := func(valid time.Duration, fences map[int]int64) {
		r.mu.Lock()
		r.owned, r.validUntil = fences, time.Now().Add(valid)
		r.mu.Unlock()
	}
	ctx := context.Background()

	// Control: leases kept; the first 4 tokens are the burst, no wait.
	lease(time.Hour, map[int]int64{0: 7, 1: 7})
	if got := r.awaitPublish(ctx, batch()); len(got) != 4 {
		t.Fatalf("leases kept: %d rows left, want 4", len(got))
	}
	// The bucket is empty: the next 4 tokens take 200ms. Shard 1 changes
	// hands (fence 8) during the wait.
	go func() {
		time.Sleep(50 * time.Millisecond)
		lease(time.Hour, map[int]int64{0: 7, 1: 8})
	}()
	t0 := time.Now()
	got := r.awaitPublish(ctx, batch())
	if waited := time.Since(t0); waited < 150*time.Millisecond {
		t.Errorf("waited %s for 4 tokens at 20/s after the burst; want about 200ms", waited)
	}
	if len(got) != 2 || got[0].ev.Shard != 0 || got[1].ev.Shard != 0 {
		t.Fatalf("after shard 1's lease moved: kept %+v, want only shard 0's 2 rows", got)
	}
	// Leases lapse unrenewed during the wait: nothing is published.
	lease(100*time.Millisecond, map[int]int64{0: 7, 1: 7})
	if got := r.awaitPublish(ctx, batch()); got != nil {
		t.Fatalf("leases lapsed while waiting: %d rows kept, want none", len(got))
	}
	// Shutdown during the wait: nothing is published, promptly.
	lease(time.Hour, map[int]int64{0: 7, 1: 7})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	t0 = time.Now()
	if got := r.awaitPublish(cctx, batch()); got != nil || time.Since(t0) > 150*time.Millisecond {
		t.Fatalf("cancelled wait: %d rows kept after %s, want none at once", len(got), time.Since(t0))
	}
}

// TestRateAndShareOptions: the options' validation names the field and
// the limit.
func TestRateAndShareOptions(t *testing.T) {
	for _, c := range []struct {
		opt   Option
		field string
	}{
		{WithPublishRate(-1, 10), "publish_rate"},
		{WithPublishRate(1e9, 10), "publish_rate"},
		{WithPublishRate(100, 0), "publish_burst"},
		{WithPublishRate(100, MaxBatchSize+1), "publish_burst"},
		{WithPublishRate(0, 5), "publish_burst"},
		{WithTenantShare(-1), "tenant_share"},
		{WithTenantShare(MaxBatchSize + 1), "tenant_share"},
	} {
		err := CheckOptions(c.opt)
		var ce *ferry.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: CheckOptions = %v, want a ConfigError on %s", c.field, err, c.field)
		}
	}
	for _, ok := range []Option{WithPublishRate(0, 0), WithPublishRate(0.5, 1), WithTenantShare(0), WithTenantShare(100)} {
		if err := CheckOptions(ok); err != nil {
			t.Errorf("valid option refused: %v", err)
		}
	}
	c := defaultConfig()
	WithPublishRate(100, 50)(&c)
	if got := c.claimSize(); got != 50 {
		t.Errorf("claim size with burst 50 < batch %d: %d, want 50", DefaultBatchSize, got)
	}
}

// slowPublisher delays every Publish (a slow broker) and records the
// most events and calls in flight at once.
type slowPublisher struct {
	broker.Publisher
	delay               time.Duration
	mu                  sync.Mutex
	events, calls       int
	maxEvents, maxCalls int
}

func (p *slowPublisher) Publish(ctx context.Context, evs []ferry.Event) []broker.Result {
	p.mu.Lock()
	p.events += len(evs)
	p.calls++
	p.maxEvents, p.maxCalls = max(p.maxEvents, p.events), max(p.maxCalls, p.calls)
	p.mu.Unlock()
	time.Sleep(p.delay)
	res := p.Publisher.Publish(ctx, evs)
	p.mu.Lock()
	p.events -= len(evs)
	p.calls--
	p.mu.Unlock()
	return res
}

// TestSlowBrokerBoundsInFlight: backpressure. With a broker that takes
// 100ms per publish and a backlog 20× what the relay may hold, the relay
// never has more than workers × (batch + shards − 1) events handed to the
// broker at once, nor more than workers publish calls: a worker claims its
// next batch only after the broker answered its last (or the publish
// timeout passed). With WithPublishRate the bound shrinks to the burst per
// worker. Everything is still delivered once, in order.
func TestSlowBrokerBoundsInFlight(t *testing.T) {
	const shards, batch, workers, backlog = 4, 25, 3, 2000
	for _, rateOn := range []bool{false, true} {
		name := "batch_bound"
		if rateOn {
			name = "rate_burst_bound"
		}
		t.Run(name, func(t *testing.T) {
			s := newSQLiteStore(t, shards)
			n := startEmbeddedNATS(t)
			want := s.produceTenants(t, backlog, 20, 2)
			pub := &slowPublisher{Publisher: n.publisher(t), delay: 100 * time.Millisecond}
			opts := fastOpts(shards, WithBatchSize(batch), WithWorkers(workers))
			bound := workers * (batch + shards - 1)
			if rateOn {
				opts = append(opts, WithPublishRate(1e6, 10))
				bound = workers * 10
			}
			r, err := s.newRelay(pub, opts...)
			if err != nil {
				t.Fatal(err)
			}
			stop := runRelay(t, r)
			waitFor(t, 60*time.Second, "the first 300 sent", func() bool { return s.count(t, "sent") >= 300 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			pub.mu.Lock()
			maxEvents, maxCalls := pub.maxEvents, pub.maxCalls
			pub.mu.Unlock()
			t.Logf("%s: at most %d events in %d calls in flight (bound %d events, %d calls) with %d events waiting", name, maxEvents, maxCalls, bound, workers, backlog)
			if maxEvents > bound || maxCalls > workers {
				t.Errorf("%d events in %d publish calls in flight at once; the bound is %d events in %d calls", maxEvents, maxCalls, bound, workers)
			}
			if maxCalls < 2 {
				t.Errorf("never more than %d publish call in flight: the workers did not overlap, the bound was not exercised", maxCalls)
			}
			sent := s.count(t, "sent")
			msgs := n.read(t)
			if len(msgs) < sent {
				t.Errorf("%d rows marked sent but %d messages stored", sent, len(msgs))
			}
			checkBroker(t, msgs, sentOf(t, s, want))
		})
	}
}

// sentOf keeps the events of want whose row is marked sent.
func sentOf(t *testing.T, s *store, want []ferry.Event) []ferry.Event {
	t.Helper()
	rows := s.rows(t)
	var out []ferry.Event
	for _, e := range want {
		if rows[e.ID.String()].status == "sent" {
			out = append(out, e)
		}
	}
	return out
}

// TestTenantShareKeepsDraining: a claim cut short by the tenant share
// (fewer rows than the shard's share, but the tenant has more) counts as
// "more work", so the relay keeps claiming instead of waiting for the next
// poll or wake-up: 200 events of one tenant at a share of 5 drain with a
// one-minute poll interval and no Notify. (Before the share counted, the
// relay stopped after the first batch of 5.)
func TestTenantShareKeepsDraining(t *testing.T) {
	s := newSQLiteStore(t, 1)
	n := startEmbeddedNATS(t)
	want := s.produceTenants(t, 200, 10, 1)
	r, err := s.newRelay(n.publisher(t), fastOpts(1, WithBatchSize(20), WithTenantShare(5), WithPollInterval(time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, r)
	waitFor(t, 30*time.Second, "all 200 sent without a wake-up", func() bool { return s.count(t, "sent") == len(want) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkBroker(t, n.read(t), want)
}
