package rabbitmq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

func run(t *testing.T, c *rabbitmq.Consumer) (<-chan *broker.Delivery, func()) {
	t.Helper()
	ch := make(chan *broker.Delivery, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, func(_ context.Context, d *broker.Delivery) { ch <- d })
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Consume: %v", err)
			}
			_ = c.Close()
		})
	}
	t.Cleanup(stop)
	return ch, stop
}

func recv(t *testing.T, ch <-chan *broker.Delivery, within time.Duration) *broker.Delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(within):
		t.Fatalf("no delivery within %v", within)
	}
	return nil
}

// TestNackDelayAndAttempt: Nack(delay) requeues only after the delay, and
// the redelivery's Attempt comes from the quorum queue's x-delivery-count.
func TestNackDelayAndAttempt(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, true)
	p := newPublisher(t, url, rabbitmq.WithExchange(top.Exchange))
	ev := event(t, "order.events", "a", 1)
	if r := p.Publish(context.Background(), []ferry.Event{ev}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	c, err := rabbitmq.NewConsumer(url, top.Queue, rabbitmq.WithPrefetch(10))
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := run(t, c)
	d := recv(t, ch, 10*time.Second)
	for attempt := 1; ; attempt++ {
		if d.DecodeErr != nil || d.Event.ID != ev.ID {
			t.Fatalf("delivery %d: %v %v", attempt, d.DecodeErr, d.Event.ID)
		}
		if d.Attempt != attempt {
			t.Fatalf("Attempt = %d, want %d", d.Attempt, attempt)
		}
		if d.Event.Topic != "order.events" || d.Raw.Key != "order.events" || d.Raw.Destination != top.Queue {
			t.Fatalf("routing: topic %q raw %+v", d.Event.Topic, d.Raw)
		}
		if attempt == 3 {
			if err := d.Ack(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := d.Nack(context.Background(), 0); !errors.Is(err, rabbitmq.ErrSettled) {
				t.Fatalf("Nack after Ack: %v", err)
			}
			break
		}
		start := time.Now()
		if err := d.Nack(context.Background(), 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		d = recv(t, ch, 10*time.Second)
		if el := time.Since(start); el < 300*time.Millisecond {
			t.Fatalf("redelivered after %v, before the delay", el)
		}
	}
	select {
	case d := <-ch:
		t.Fatalf("acked message delivered again (attempt %d)", d.Attempt)
	case <-time.After(500 * time.Millisecond):
	}
}

// TestConsumerReconnects: the connection between consumer and broker is
// cut mid-stream; unacked deliveries of the lost channel cannot be acked
// (ErrChannelGone) and come back; the consumer reconnects by itself.
func TestConsumerReconnects(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, true)
	px := newProxy(t, hostOf(t, url))
	p := newPublisher(t, url, rabbitmq.WithExchange(top.Exchange))
	e1, e2 := event(t, "t", "a", 1), event(t, "t", "a", 2)
	if r := p.Publish(context.Background(), []ferry.Event{e1}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	c, err := rabbitmq.NewConsumer(viaProxy(t, url, px), top.Queue, rabbitmq.WithReconnectDelay(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := run(t, c)
	d := recv(t, ch, 10*time.Second)
	if d.Event.ID != e1.ID {
		t.Fatal("wrong event")
	}
	px.set(2)
	time.Sleep(200 * time.Millisecond)
	if err := d.Ack(context.Background()); err == nil {
		t.Fatal("Ack on a cut connection succeeded")
	}
	px.set(0)
	if r := p.Publish(context.Background(), []ferry.Event{e2}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	got := map[string]int{}
	for len(got) < 2 {
		d := recv(t, ch, 20*time.Second)
		got[d.Event.ID.String()]++
		if d.Event.ID == e1.ID && d.Attempt < 2 {
			t.Fatalf("redelivered e1 with Attempt %d", d.Attempt)
		}
		if err := d.Ack(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got[e1.ID.String()] != 1 || got[e2.ID.String()] != 1 {
		t.Fatalf("deliveries %v", got)
	}
}

func TestConsumerQueueMissing(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	c, err := rabbitmq.NewConsumer(url, unique("ferry-test-nope"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Consume(ctx, func(context.Context, *broker.Delivery) {}); !errors.Is(err, rabbitmq.ErrTopologyMissing) {
		t.Fatalf("Consume on a missing queue: %v", err)
	}
	if _, err := rabbitmq.NewConsumer(url, ""); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("empty queue: %v", err)
	}
}
