package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
)

// TestPoisonEvent: an event over the broker's max payload goes dead with
// its reason; under DeadHold the later events of its aggregate are held,
// under DeadSkip they flow; other aggregates are unaffected either way.
func TestPoisonEvent(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testPoisonEvent(t, newStore) })
}

func testPoisonEvent(t *testing.T, newStore newStoreFunc) {
	for _, policy := range []DeadPolicy{DeadHold, DeadSkip} {
		t.Run(string(policy), func(t *testing.T) {
			s := newStore(t, 4)
			n := startEmbeddedNATS(t, natsembed.WithMaxPayload(4096))
			ctx := context.Background()
			var normal []ferry.Event
			normal = append(normal, s.produce(t, 30, 6)...)
			p1, err := s.insert(ctx, ev("poison", "first"))
			if err != nil {
				t.Fatal(err)
			}
			big := ev("poison", strings.Repeat("x", 8000))
			p2, err := s.insert(ctx, big)
			if err != nil {
				t.Fatal(err)
			}
			p3, err := s.insert(ctx, ev("poison", "after"))
			if err != nil {
				t.Fatal(err)
			}
			normal = append(normal, s.produce(t, 30, 6)...)
			reg := prometheus.NewRegistry()
			r, err := s.newRelay(n.publisher(t), fastOpts(4, WithDeadPolicy(policy), WithRegisterer(reg))...)
			if err != nil {
				t.Fatal(err)
			}
			runRelay(t, r)
			wantSent := len(normal) + 1 // + the poison aggregate's first event
			if policy == DeadSkip {
				wantSent++ // its third event too
			}
			waitFor(t, 20*time.Second, "other aggregates and the dead row settled", func() bool {
				return s.count(t, "sent") == wantSent && s.count(t, "dead") == 1
			})
			time.Sleep(500 * time.Millisecond) // more cycles: nothing else may move
			rows := s.rows(t)
			dead := rows[p2[0].ID.String()]
			if dead.status != "dead" || !strings.Contains(dead.lastError, "permanent") || !strings.Contains(dead.lastError, "too large") {
				t.Fatalf("poison row: %+v, want dead with a 'permanent … too large' reason", dead)
			}
			if strings.Contains(dead.lastError, "xxxx") {
				t.Fatal("last_error contains payload bytes")
			}
			if rows[p1[0].ID.String()].status != "sent" {
				t.Fatalf("the poison aggregate's first event: %+v, want sent", rows[p1[0].ID.String()])
			}
			after := rows[p3[0].ID.String()]
			switch policy {
			case DeadHold:
				if after.status != "pending" || after.attempts != 0 {
					t.Fatalf("held event: %+v, want pending and never attempted", after)
				}
				defer func() {
					// An operator discards the dead letter (ops, migration
					// 0005): the hold is released and the aggregate flows.
					if _, err := s.db.Executor().Exec(ctx, `UPDATE ferry_outbox SET discarded_at = CURRENT_TIMESTAMP WHERE event_id = $1`, p2[0].ID.String()); err != nil {
						t.Fatal(err)
					}
					waitFor(t, 10*time.Second, "held event sent after discard", func() bool {
						return s.rows(t)[p3[0].ID.String()].status == "sent"
					})
				}()
			case DeadSkip:
				if after.status != "sent" {
					t.Fatalf("event after the dead one under skip: %+v, want sent", after)
				}
			}
			msgs := n.read(t)
			want := append(append([]ferry.Event{}, normal...), p1...)
			if policy == DeadSkip {
				want = append(want, p3...)
			}
			checkBroker(t, msgs, want)
			if got := gauge(r.m.deadTotal); got != 1 {
				t.Errorf("ferry_relay_dead_total = %v, want 1", got)
			}
			waitFor(t, 5*time.Second, "dead gauge", func() bool { _, _, dead := s.backlog(t); return dead == 1 })
		})
	}
}

// TestBrokerOutage: the broker (an embedded JetStream we own) stops for a
// while. The backlog grows and the oldest-age gauge rises, the breaker
// opens, no row is charged an attempt or goes dead, broker calls stay
// bounded (probes only), and everything flows after the restart.
func TestBrokerOutage(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testBrokerOutage(t, newStore(t, 4)) })
}

func testBrokerOutage(t *testing.T, s *store) {
	n := startEmbeddedNATS(t)
	pub := &countingPublisher{Publisher: n.publisher(t)}
	reg := prometheus.NewRegistry()
	r, err := s.newRelay(pub, fastOpts(4, WithRegisterer(reg), WithMaxAttempts(2))...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	want := s.produce(t, 50, 10)
	waitFor(t, 20*time.Second, "first events sent", func() bool { return s.count(t, "sent") == 50 })

	n.emb.Shutdown()
	p0, g0 := pub.calls()
	outageStart := time.Now()
	want = append(want, s.produce(t, 200, 10)...)
	waitFor(t, 10*time.Second, "breaker open", func() bool { return r.Status().Breaker == BreakerOpen })
	// Other processes (ferry status) see it through the heartbeat row.
	breakerRow := func() string {
		var b string
		rows, err := s.db.Executor().Query(context.Background(), `SELECT breaker FROM ferry_relay_instances WHERE instance_id = $1`, r.InstanceID())
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(&b); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	waitFor(t, 10*time.Second, "breaker open in relay_instances", func() bool { return breakerRow() == "open" })
	waitFor(t, 10*time.Second, "pending gauge to show the backlog", func() bool { pending, _, _ := s.backlog(t); return pending == 200 })
	_, age1, _ := s.backlog(t)
	time.Sleep(3 * time.Second)
	waitFor(t, 5*time.Second, "oldest-age gauge to rise", func() bool { _, age, _ := s.backlog(t); return age > age1+1 })
	if gauge(r.m.breaker.WithLabelValues("open")) != 1 || gauge(r.m.breaker.WithLabelValues("closed")) != 0 {
		t.Errorf("ferry_relay_breaker_state: open %v closed %v during the outage, want 1 and 0",
			gauge(r.m.breaker.WithLabelValues("open")), gauge(r.m.breaker.WithLabelValues("closed")))
	}
	if st := r.Status(); st.Ready() {
		t.Errorf("relay reports ready with the broker down: %+v", st)
	}
	checkOutageHeld(t, s, pub, p0, g0, outageStart, "nats")

	if err := n.emb.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "backlog drained after recovery", func() bool { return s.count(t, "sent") == len(want) })
	waitFor(t, 5*time.Second, "breaker closed", func() bool { return r.Status().Breaker == BreakerClosed })
	waitFor(t, 10*time.Second, "breaker closed in relay_instances", func() bool { return breakerRow() == "closed" })
	checkBroker(t, n.read(t), want)
	if d := s.count(t, "dead"); d != 0 {
		t.Fatalf("%d rows dead after recovery", d)
	}
}

// TestBrokerOutageLastAttempt: rows at their last attempt (max-attempts 1,
// so every row) that fail because the broker is down are held by the
// breaker like the others, not dead-lettered. Before the fix such rows
// skipped the "is the broker down?" check and went dead on the outage.
func TestBrokerOutageLastAttempt(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testBrokerOutageLastAttempt(t, newStore(t, 2)) })
}

func testBrokerOutageLastAttempt(t *testing.T, s *store) {
	n := startEmbeddedNATS(t)
	pub := &countingPublisher{Publisher: n.publisher(t)}
	r, err := s.newRelay(pub, fastOpts(2, WithMaxAttempts(1))...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	n.emb.Shutdown()
	want := s.produce(t, 20, 4)
	waitFor(t, 10*time.Second, "breaker open", func() bool { return r.Status().Breaker == BreakerOpen })
	time.Sleep(500 * time.Millisecond)
	if d := s.count(t, "dead"); d != 0 {
		t.Fatalf("%d rows at their last attempt went dead during the outage", d)
	}
	if err := n.emb.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "backlog drained after recovery", func() bool { return s.count(t, "sent") == len(want) })
	checkBroker(t, n.read(t), want)
}

// TestBrokerOutageNegativeControl: the same outage without the breaker's
// "is the broker down?" check charges attempts to every row it retries,
// and with a small max-attempts the outage sends rows to dead. The breaker
// is what prevents that.
func TestBrokerOutageNegativeControl(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testBrokerOutageNegativeControl(t, newStore(t, 2)) })
}

func testBrokerOutageNegativeControl(t *testing.T, s *store) {
	n := startEmbeddedNATS(t)
	pub := &countingPublisher{Publisher: n.publisher(t)}
	r, err := s.newRelay(pub, fastOpts(2, WithMaxAttempts(2), WithBackoff(10*time.Millisecond, 50*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	r.cfg.noBreaker = true
	runRelay(t, r)
	n.emb.Shutdown()
	s.produce(t, 20, 4)
	waitFor(t, 15*time.Second, "rows to go dead from the outage", func() bool { return s.count(t, "dead") > 0 })
	if p, _ := pub.calls(); p < 2 {
		t.Fatalf("only %d publish calls: retries not exercised", p)
	}
}

// TestThreeRelays: three relays (goroutines) share 16 shards over 10,000
// events of 200 aggregates on the system NATS server. One of them crashes
// mid-run (fault hook: leases kept, as after kill -9); the others take its
// shards after the lease expires. Every event reaches the broker once, per
// aggregate in sequence order.
func TestThreeRelays(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) {
		t.Run("no_share", func(t *testing.T) { testThreeRelays(t, newStore, 0) })
		// The same with WithTenantShare(8) (below the ~13 rows per shard
		// a batch of 200 gives each of ~5 owned shards) and 3 tenants.
		t.Run("tenant_share", func(t *testing.T) { testThreeRelays(t, newStore, 8) })
	})
}

func testThreeRelays(t *testing.T, newStore newStoreFunc, share int) {
	if testing.Short() {
		t.Skip("10,000 events")
	}
	const shards = 16
	s := newStore(t, shards)
	n, prefix := systemNATS(t)
	// Subjects of this test's stream: re-point the topic template.
	w := s.withTopic(t, prefix+".{aggregate_type}")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var produced []ferry.Event
	var prodMu sync.Mutex
	prodDone := make(chan error, 1)
	go func() {
		for i := 0; i < 10000 && ctx.Err() == nil; {
			var batch []ferry.Event
			for j := 0; j < 25; j, i = j+1, i+1 {
				e := ev(fmt.Sprintf("agg-%03d", (i*7)%200), fmt.Sprint(i))
				if share > 0 {
					e.TenantID = fmt.Sprintf("tenant-%d", i%3)
				}
				batch = append(batch, e)
			}
			got, err := w(ctx, batch...)
			if err != nil {
				prodDone <- err
				return
			}
			prodMu.Lock()
			produced = append(produced, got...)
			prodMu.Unlock()
		}
		prodDone <- nil
	}()

	var crashOnce sync.Once
	crashed := make(chan struct{})
	relays := make([]*Relay, 3)
	stops := make([]func() error, 3)
	for i := range relays {
		opts := fastOpts(shards, WithInstanceID(fmt.Sprintf("relay-%d", i)), WithBatchSize(200))
		if share > 0 {
			opts = append(opts, WithTenantShare(share))
		}
		if i == 0 {
			var calls atomic.Int32
			opts = append(opts, WithFaults(Faults{BeforePublish: func(context.Context, []ferry.Event) error {
				if calls.Add(1) == 5 {
					crashOnce.Do(func() { close(crashed) })
					return errors.New("kill -9")
				}
				return nil
			}}))
		}
		r, err := s.newRelay(n.publisher(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		relays[i] = r
		stops[i] = runRelay(t, r)
	}
	waitFor(t, 30*time.Second, "relay-0 to crash", func() bool {
		select {
		case <-crashed:
			return true
		default:
			return false
		}
	})
	if err := stops[0](); !errors.Is(err, ErrFaultInjected) {
		t.Fatalf("relay-0 Run = %v, want ErrFaultInjected", err)
	}
	crashAt := time.Now()
	// Its shards move to the survivors within the lease TTL and a renewal
	// tick (TTL/3), plus slack for -race on two shared cores (CI measured
	// 2.58 s once with a 2.5 s bound).
	waitFor(t, 10*time.Second, "survivors own all shards", func() bool {
		return len(relays[1].Status().OwnedShards)+len(relays[2].Status().OwnedShards) == shards
	})
	if moved := time.Since(crashAt); moved > 1500*time.Millisecond+2*time.Second {
		t.Errorf("shards moved %s after the crash; lease TTL is 1.5s", moved)
	}
	if err := <-prodDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 120*time.Second, "all 10,000 sent", func() bool { return s.count(t, "sent") == 10000 })
	for _, stop := range stops[1:] {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	prodMu.Lock()
	defer prodMu.Unlock()
	checkBroker(t, n.read(t), produced)
	if relays[1].Status().Published == 0 || relays[2].Status().Published == 0 {
		t.Errorf("a surviving relay published nothing: %+v / %+v", relays[1].Status(), relays[2].Status())
	}
}

// TestRebalance: relays joining and leaving split the shards fairly;
// a graceful stop hands its shards over at once (no TTL wait).
func TestRebalance(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testRebalance(t, newStore) })
}

func testRebalance(t *testing.T, newStore newStoreFunc) {
	const shards = 16
	s := newStore(t, shards)
	n := startEmbeddedNATS(t)
	var relays []*Relay
	var stops []func() error
	for i := 0; i < 3; i++ {
		r, err := s.newRelay(n.publisher(t), fastOpts(shards, WithInstanceID(fmt.Sprintf("r%d", i)), WithLeaseTTL(3*time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		relays = append(relays, r)
		stops = append(stops, runRelay(t, r))
	}
	owned := func(rs ...*Relay) (total int, counts []int, disjoint bool) {
		seen := map[int]bool{}
		disjoint = true
		for _, r := range rs {
			st := r.Status().OwnedShards
			counts = append(counts, len(st))
			for _, sh := range st {
				if seen[sh] {
					disjoint = false
				}
				seen[sh] = true
			}
			total += len(st)
		}
		return total, counts, disjoint
	}
	waitFor(t, 15*time.Second, "3 relays split 16 shards 6/6/4 or so", func() bool {
		total, counts, disjoint := owned(relays...)
		if total != shards || !disjoint {
			return false
		}
		for _, c := range counts {
			if c > 6 || c < 4 {
				return false
			}
		}
		return true
	})
	if err := stops[0](); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	waitFor(t, 10*time.Second, "2 relays own all 16", func() bool {
		total, counts, disjoint := owned(relays[1:]...)
		return total == shards && disjoint && counts[0] == 8 && counts[1] == 8
	})
	// Released leases are free at once; the survivors pick them up at
	// their next tick (TTL/3 = 1s), long before the 3s TTL.
	if d := time.Since(stopped); d > 2500*time.Millisecond {
		t.Errorf("handover after graceful stop took %s", d)
	}
	s.produce(t, 100, 20)
	waitFor(t, 20*time.Second, "events sent by the survivors", func() bool { return s.count(t, "sent") == 100 })
}

// withTopic returns an insert function whose topic template is tmpl.
func (s *store) withTopic(t testing.TB, tmpl string) func(context.Context, ...ferry.Event) ([]ferry.Event, error) {
	t.Helper()
	return s.writer(t, ferry.TopicTemplate(tmpl))
}

// checkOutageHeld asserts what the breaker guarantees during a broker
// outage that began at start (pub had made p0 publish calls and g0 pings
// then): no row went dead, none was charged an attempt, and broker calls
// stayed within outageBound.
func checkOutageHeld(t *testing.T, s *store, pub *countingPublisher, p0, g0 int, start time.Time, name string) {
	t.Helper()
	p1, g1 := pub.calls()
	outage := time.Since(start)
	if d := s.count(t, "dead"); d != 0 {
		t.Fatalf("%d rows went dead during a broker outage", d)
	}
	for id, row := range s.rows(t) {
		if row.attempts != 0 {
			t.Fatalf("row %s charged %d attempts during the outage", id, row.attempts)
		}
	}
	maxPublish, maxPings := outageBound(outage)
	if p1-p0 > maxPublish || g1-g0 > maxPings {
		t.Fatalf("during a %s outage: %d publish calls, %d pings; want <= %d and <= %d", outage.Round(time.Millisecond), p1-p0, g1-g0, maxPublish, maxPings)
	}
	t.Logf("%s outage %s: %d publish calls, %d pings", name, outage.Round(time.Millisecond), p1-p0, g1-g0)
}

// outageBound is what an outage may cost in broker calls with fastOpts:
// one failed publish per worker (each had a batch in flight or starts one
// before it sees the breaker open) and its confirming ping, then one
// probe at a time at 50ms doubling to 500ms — at most outage/500ms + 5
// probes — whatever the backlog.
func outageBound(outage time.Duration) (publish, pings int) {
	return DefaultWorkers, DefaultWorkers + int(outage/(500*time.Millisecond)) + 5
}

// TestReadyWithMoreRelaysThanShards: a relay that owns nothing because
// every shard is taken is still ready when the cluster has more relays
// than shards; with as many shards as relays, owning nothing is not ready.
func TestReadyWithMoreRelaysThanShards(t *testing.T) {
	eachStore(t, serverStores, func(t *testing.T, newStore newStoreFunc) { testReadyWithMoreRelaysThanShards(t, newStore(t, 1)) })
}

func testReadyWithMoreRelaysThanShards(t *testing.T, s *store) {
	n := startEmbeddedNATS(t)
	a, err := s.newRelay(n.publisher(t), fastOpts(1, WithInstanceID("a"))...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, a)
	waitFor(t, 10*time.Second, "a owns the shard", func() bool { return len(a.Status().OwnedShards) == 1 })
	if !a.Status().Ready() {
		t.Fatalf("owner not ready: %+v", a.Status())
	}
	b, err := s.newRelay(n.publisher(t), fastOpts(1, WithInstanceID("b"))...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, b)
	waitFor(t, 10*time.Second, "b sees two live relays", func() bool { return b.Status().LiveInstances == 2 })
	if st := b.Status(); len(st.OwnedShards) != 0 || !st.Ready() {
		t.Fatalf("spare relay: %+v, want owning nothing and ready (2 relays > 1 shard)", st)
	}
	if (Status{Running: true, ShardCount: 2, LiveInstances: 2}).Ready() {
		t.Fatal("a relay owning nothing with relays <= shards reports ready")
	}
	if (Status{Running: true, ShardCount: 2, LiveInstances: 1, OwnedShards: []int{0, 1}, Breaker: BreakerOpen}).Ready() {
		t.Fatal("a relay with the breaker open reports ready")
	}
}
