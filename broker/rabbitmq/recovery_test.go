package rabbitmq_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/brokertest"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestUnackedReturnWhenConnectionDies: a consumer whose TCP connection
// dies without an AMQP close (as under SIGKILL: the kernel closes the
// socket) holds a full prefetch window unacked; the broker requeues it at
// once, and a second consumer receives every message within seconds (no
// ack-wait timer as on JetStream), the dead one's marked as redelivered.
// The window is the prefetch: the dead consumer held exactly that many.
func TestUnackedReturnWhenConnectionDies(t *testing.T) {
	base := testenv.RabbitMQURL(t)
	top := newTopology(t, base, true)
	p := newPublisher(t, base, rabbitmq.WithExchange(top.Exchange))
	const total, prefetch = 50, 20
	evs := make([]ferry.Event, total)
	for i := range evs {
		evs[i] = event(t, "order.events", "a", int64(i+1))
	}
	for _, r := range p.Publish(context.Background(), evs) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := brokertest.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	dead, err := rabbitmq.NewConsumer(u.String(), top.Queue, rabbitmq.WithPrefetch(prefetch), rabbitmq.WithReconnectDelay(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if m, b, w := dead.InFlightLimits(); m != prefetch || b != 0 || w != 0 {
		t.Fatalf("InFlightLimits = %d, %d, %v", m, b, w)
	}
	ch, _ := run(t, dead)
	for range prefetch {
		recv(t, ch, 10*time.Second)
	}
	select {
	case d := <-ch:
		t.Fatalf("delivery %d beyond the prefetch window of %d", d.Event.AggregateSeq, prefetch)
	case <-time.After(300 * time.Millisecond):
	}
	proxy.Cut() // the connection dies; nothing is acked
	start := time.Now()

	live, err := rabbitmq.NewConsumer(base, top.Queue, rabbitmq.WithPrefetch(total))
	if err != nil {
		t.Fatal(err)
	}
	ch2, _ := run(t, live)
	seen, redelivered := map[int64]bool{}, 0
	deadline := time.After(10 * time.Second)
	for len(seen) < total {
		var d *broker.Delivery
		select {
		case d = <-ch2:
		case <-deadline:
			t.Fatalf("second consumer received %d of %d within 10s of the connection's death", len(seen), total)
		}
		seen[d.Event.AggregateSeq] = true
		if d.Attempt > 1 {
			redelivered++
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if redelivered != prefetch {
		t.Errorf("%d deliveries marked redelivered, want the dead consumer's %d", redelivered, prefetch)
	}
	t.Logf("all %d messages (%d redelivered) at the second consumer %v after the connection died", total, redelivered, time.Since(start).Round(time.Millisecond))
}
