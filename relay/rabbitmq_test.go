package relay

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/brokertest"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestRabbitMQOutage: publishing to the local RabbitMQ through a TCP proxy
// the test controls (the shared server is never stopped). While the proxy
// is cut, the backlog grows, the breaker opens, no row is charged an
// attempt or goes dead, and broker calls stay bounded; after Restore
// everything is delivered, per aggregate in order.
func TestRabbitMQOutage(t *testing.T) {
	eachStore(t, serverStores, func(t *testing.T, newStore newStoreFunc) { testRabbitMQOutage(t, newStore) })
}

func testRabbitMQOutage(t *testing.T, newStore newStoreFunc) {
	amqpURL := testenv.RabbitMQURL(t)
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprint(time.Now().UnixNano())
	top := rabbitmq.Topology{Exchange: "ferry-relaytest-ex-" + suffix, Queue: "ferry-relaytest-q-" + suffix}
	ctx := context.Background()
	if err := rabbitmq.EnsureTopology(ctx, amqpURL, top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), amqpURL, top) })

	proxy := brokertest.NewProxy(t, u.Host)
	pu := *u
	pu.Host = proxy.Addr()
	rp, err := rabbitmq.NewPublisher(pu.String(), rabbitmq.WithExchange(top.Exchange), rabbitmq.WithReconnectDelay(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rp.Close() })
	pub := &countingPublisher{Publisher: rp}

	s := newStore(t, 4)
	reg := prometheus.NewRegistry()
	r, err := s.newRelay(pub, fastOpts(4, WithRegisterer(reg), WithMaxAttempts(2), WithPublishTimeout(2*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	want := s.produce(t, 50, 8)
	waitFor(t, 20*time.Second, "first events sent", func() bool { return s.count(t, "sent") == 50 })

	proxy.Cut()
	p0, g0 := pub.calls()
	start := time.Now()
	want = append(want, s.produce(t, 100, 8)...)
	waitFor(t, 15*time.Second, "breaker open", func() bool { return r.Status().Breaker == BreakerOpen })
	time.Sleep(2 * time.Second)
	waitFor(t, 5*time.Second, "backlog visible in the gauges", func() bool {
		pending, age, _ := s.backlog(t)
		return pending == 100 && age >= 1.5 && gauge(r.m.breaker.WithLabelValues("open")) == 1
	})
	checkOutageHeld(t, s, pub, p0, g0, start, "rabbitmq")

	proxy.Restore()
	waitFor(t, 60*time.Second, "backlog drained", func() bool { return s.count(t, "sent") == len(want) })
	if d := s.count(t, "dead"); d != 0 {
		t.Fatalf("%d rows dead after recovery", d)
	}
	got := consumeRabbit(t, amqpURL, top.Queue, len(want))
	checkKafka(t, dedupe(got), want) // same checks: all once, none extra, per-aggregate order
}

// consumeRabbit reads the queue until n distinct event ids arrived.
func consumeRabbit(t *testing.T, amqpURL, queue string, n int) []ferry.Event {
	t.Helper()
	c, err := rabbitmq.NewConsumer(amqpURL, queue)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var out []ferry.Event
	distinct := map[string]bool{}
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, func(ctx context.Context, d *broker.Delivery) {
			if d.DecodeErr != nil {
				t.Errorf("undecodable message: %v", d.DecodeErr)
				return
			}
			_ = d.Ack(ctx)
			mu.Lock()
			out = append(out, d.Event)
			distinct[d.Event.ID.String()] = true
			if len(distinct) >= n {
				cancel()
			}
			mu.Unlock()
		})
	}()
	<-ctx.Done()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(distinct) < n {
		t.Fatalf("queue %s: %d of %d events", queue, len(distinct), n)
	}
	return out
}
