package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

// missingCase is one broker whose destination for kafkaTopic (the event
// topic "relaytest.order") does not exist when the relay starts.
type missingCase struct {
	pub    broker.Publisher
	create func(t *testing.T)                      // creates the destination
	read   func(t *testing.T, n int) []ferry.Event // everything stored, in order
}

func kafkaMissing(t *testing.T) missingCase {
	c, err := kfake.NewCluster(kfake.NumBrokers(1)) // no topics, no auto-creation
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pub, err := kafka.NewPublisher(c.ListenAddrs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return missingCase{
		pub: pub,
		create: func(t *testing.T) {
			adm := kadm.NewClient(pub.Client())
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := kafka.EnsureTopics(ctx, adm, []string{kafkaTopic}, 4, 1); err != nil {
				t.Fatal(err)
			}
		},
		// First copies only: franz-go keeps records buffered for a topic
		// it does not know yet and writes them once the topic appears —
		// after the relay gave that publish up as not sent and re-sent it.
		// Kafka has no broker-side dedup by event id, so each event may be
		// stored twice (at least once; the inbox absorbs the copy); the
		// first copies must hold every event once, in per-aggregate order.
		read: func(t *testing.T, n int) []ferry.Event { return dedupe(kafkaRecords(t, c.ListenAddrs(), n)) },
	}
}

func natsMissing(t *testing.T) missingCase {
	e, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	n := &natsEnv{url: e.ClientURL(), stream: "RELAYTEST", subjects: []string{topicPrefix + ".>"}, emb: e}
	// A stream exists, capturing other subjects only: the event subject
	// has no stream ("no responders").
	other := &natsEnv{url: n.url, stream: "OTHER", subjects: []string{"other.>"}}
	other.ensureStream(t)
	return missingCase{
		pub:    n.publisher(t),
		create: func(t *testing.T) { n.ensureStream(t) },
		read: func(t *testing.T, _ int) []ferry.Event {
			var out []ferry.Event
			for _, m := range n.read(t) {
				out = append(out, m.ev)
			}
			return out
		},
	}
}

func rabbitMissing(t *testing.T) missingCase {
	amqpURL := testenv.RabbitMQURL(t)
	suffix := fmt.Sprint(time.Now().UnixNano())
	ex := rabbitmq.Topology{Exchange: "ferry-relaytest-missing-" + suffix}
	full := rabbitmq.Topology{Exchange: ex.Exchange, Queue: "ferry-relaytest-missing-q-" + suffix, BindingKeys: []string{kafkaTopic}}
	if err := rabbitmq.EnsureTopology(context.Background(), amqpURL, ex); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), amqpURL, full) })
	pub, err := rabbitmq.NewPublisher(amqpURL, rabbitmq.WithExchange(ex.Exchange))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return missingCase{
		pub: pub,
		create: func(t *testing.T) {
			if err := rabbitmq.EnsureTopology(context.Background(), amqpURL, full); err != nil {
				t.Fatal(err)
			}
		},
		read: func(t *testing.T, n int) []ferry.Event { return consumeRabbit(t, amqpURL, full.Queue, n) },
	}
}

// TestMissingDestinationHeld: the relay starts while the destination of
// every event does not exist (Kafka topic; NATS subject no stream
// captures; RabbitMQ routing key no queue is bound to) and it is created
// a few seconds later. Meanwhile no row goes dead or is charged an
// attempt, although max-attempts is 2, and ferry_relay_destination_missing
// is 1; afterwards every event is stored once, per aggregate in order, and
// the gauge is back to 0.
func TestMissingDestinationHeld(t *testing.T) {
	eachStore(t, serverStores, func(t *testing.T, newStore newStoreFunc) { testMissingDestinationHeld(t, newStore) })
}

func testMissingDestinationHeld(t *testing.T, newStore newStoreFunc) {
	for _, tc := range []struct {
		name string
		mk   func(t *testing.T) missingCase
	}{{"kafka", kafkaMissing}, {"nats", natsMissing}, {"rabbitmq", rabbitMissing}} {
		t.Run(tc.name, func(t *testing.T) {
			mc := tc.mk(t)
			// The destination is created between two publish calls, never
			// during one: created while a batch is on its way, a later
			// event of an aggregate can be stored before an earlier one
			// that the broker refused a moment before (the publishers'
			// documented limit: the relay does not mark it ahead and the
			// consumer's sequence check restores the order). This test is
			// about holding rows while the destination is missing.
			gate := &publishGate{Publisher: mc.pub}
			s := newStore(t, 4)
			reg := prometheus.NewRegistry()
			r, err := s.newRelay(gate, fastOpts(4, WithRegisterer(reg), WithMaxAttempts(2))...)
			if err != nil {
				t.Fatal(err)
			}
			want := s.produce(t, 60, 6)
			runRelay(t, r)
			waitFor(t, 20*time.Second, "the missing destination reported", func() bool {
				return gauge(r.m.destMissing) == 1 && slices.Equal(r.Status().MissingDestinations, []string{kafkaTopic})
			})
			// Long enough for several retry rounds (probe cap 500ms).
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				if d := s.count(t, "dead"); d != 0 {
					t.Fatalf("%d rows dead while the destination was missing", d)
				}
				time.Sleep(200 * time.Millisecond)
			}
			retried := r.Status().Retries
			for id, row := range s.rows(t) {
				if row.attempts != 0 {
					t.Fatalf("row %s charged %d attempts for a missing destination", id, row.attempts)
				}
				if row.status != "pending" {
					t.Fatalf("row %s is %s while its destination is missing", id, row.status)
				}
			}
			if gauge(r.m.destMissing) != 1 || retried == 0 {
				t.Fatalf("destination_missing gauge %v, retries %d: the fault is not visible", gauge(r.m.destMissing), retried)
			}
			t.Logf("%s: %d held retries while missing", tc.name, retried)

			gate.mu.Lock()
			mc.create(t)
			gate.mu.Unlock()
			waitFor(t, 30*time.Second, "all sent after the destination exists", func() bool { return s.count(t, "sent") == len(want) })
			if d := s.count(t, "dead"); d != 0 {
				t.Fatalf("%d rows dead", d)
			}
			if g := gauge(r.m.destMissing); g != 0 {
				t.Fatalf("destination_missing gauge %v after recovery, want 0", g)
			}
			if l := r.Status().MissingDestinations; len(l) != 0 {
				t.Fatalf("still reported missing: %v", l)
			}
			checkKafka(t, mc.read(t, len(want)), want) // once each, none extra, per-aggregate order
		})
	}
}

// publishGate lets the test change the broker between publish calls.
type publishGate struct {
	broker.Publisher
	mu sync.Mutex
}

func (g *publishGate) Publish(ctx context.Context, evs []ferry.Event) []broker.Result {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.Publisher.Publish(ctx, evs)
}

// asPermanent classifies a missing destination as a permanent failure,
// as the adapters did before: the negative control.
type asPermanent struct{ broker.Publisher }

func (a asPermanent) Publish(ctx context.Context, evs []ferry.Event) []broker.Result {
	res := a.Publisher.Publish(ctx, evs)
	for i := range res {
		if errors.Is(res[i].Err, broker.ErrDestinationMissing) {
			res[i].Err = broker.NewError(broker.ClassPermanent, errors.New(res[i].Err.Error()))
		}
	}
	return res
}

// TestMissingDestinationNegativeControl: with the missing topic classified
// permanent (the old classification) the first attempt sends events dead,
// and under the hold policy their aggregates' later events stay blocked.
func TestMissingDestinationNegativeControl(t *testing.T) {
	eachStore(t, serverStores, func(t *testing.T, newStore newStoreFunc) { testMissingDestinationNegativeControl(t, newStore) })
}

func testMissingDestinationNegativeControl(t *testing.T, newStore newStoreFunc) {
	mc := kafkaMissing(t)
	s := newStore(t, 4)
	r, err := s.newRelay(asPermanent{mc.pub}, fastOpts(4)...)
	if err != nil {
		t.Fatal(err)
	}
	s.produce(t, 60, 6)
	runRelay(t, r)
	waitFor(t, 20*time.Second, "rows dead", func() bool { return s.count(t, "dead") > 0 })
	mc.create(t)
	time.Sleep(time.Second)
	if sent := s.count(t, "sent"); sent == 60 {
		t.Fatal("negative control: every event published; the control shows nothing")
	}
	t.Logf("negative control: %d dead, %d sent, %d pending", s.count(t, "dead"), s.count(t, "sent"), s.count(t, "pending"))
}

// TestMissingDelayBounded: a missing destination's retry delay doubles per
// consecutive failure from base, stays within [ceil/2, ceil] and never
// exceeds the cap; a success forgets the destination, and a destination
// nothing failed on lately drops out of the list.
func TestMissingDelayBounded(t *testing.T) {
	var d missingDests
	now := time.Now()
	base, limit := 100*time.Millisecond, time.Second
	for i, ceil := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		ceil *= time.Millisecond
		got := d.failed("a", now, base, limit)
		if got < ceil/2 || got > ceil {
			t.Fatalf("failure %d: delay %s outside [%s, %s]", i+1, got, ceil/2, ceil)
		}
	}
	if l := d.list(now, time.Minute); !slices.Equal(l, []string{"a"}) {
		t.Fatalf("list %v", l)
	}
	if was, _ := d.ok("a", now); !was {
		t.Fatal("ok did not report a as missing before")
	}
	if was, _ := d.ok("a", now); was || len(d.list(now, time.Minute)) != 0 {
		t.Fatal("a still missing after a success")
	}
	d.failed("b", now, base, limit)
	if l := d.list(now.Add(2*time.Minute), time.Minute); len(l) != 0 {
		t.Fatalf("stale destination still listed: %v", l)
	}
}
