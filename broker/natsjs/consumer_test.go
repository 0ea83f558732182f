package natsjs

import (
	"context"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"os"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// consumeInto runs c.Consume in a goroutine feeding a channel; the
// returned stop cancels it and returns Consume's result.
func consumeInto(t *testing.T, c *Consumer) (<-chan *broker.Delivery, func() error) {
	t.Helper()
	ch := make(chan *broker.Delivery, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Consume(ctx, func(_ context.Context, d *broker.Delivery) { ch <- d }) }()
	var stopped bool
	var res error
	stop := func() error {
		if stopped {
			return res
		}
		stopped = true
		cancel()
		select {
		case res = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Consume did not return after cancel")
		}
		return res
	}
	t.Cleanup(func() { _ = stop() })
	return ch, stop
}

func recv(t *testing.T, ch <-chan *broker.Delivery, timeout time.Duration) *broker.Delivery {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(timeout):
		t.Fatalf("no delivery within %v", timeout)
	}
	return nil
}

func publishN(t *testing.T, p *Publisher, topic string, n int) []ferry.Event {
	t.Helper()
	evs := make([]ferry.Event, n)
	for i := range evs {
		evs[i] = testEvent(t, topic, "agg", int64(i+1))
	}
	for _, r := range p.Publish(context.Background(), evs) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	return evs
}

// TestConsumerBackPressure: with MaxAckPending 5 the server delivers five
// unacked messages and no more; acking frees the next ones.
func TestConsumerBackPressure(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			stream, prefix := newStream(t, nc)
			p, _ := NewPublisher(nc)
			defer p.Close()
			publishN(t, p, prefix+".x", 20)
			c, err := NewConsumer(context.Background(), nc, stream, "bp", WithMaxAckPending(5))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ch, stop := consumeInto(t, c)
			var got []*broker.Delivery
			for range 5 {
				got = append(got, recv(t, ch, 5*time.Second))
			}
			select {
			case d := <-ch:
				t.Fatalf("sixth message (seq %d) delivered with 5 unacked and MaxAckPending 5", d.Event.AggregateSeq)
			case <-time.After(500 * time.Millisecond):
			}
			for _, d := range got {
				if err := d.Ack(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if d := recv(t, ch, 5*time.Second); d.Event.AggregateSeq != 6 {
				t.Fatalf("after acks got seq %d, want 6", d.Event.AggregateSeq)
			}
			if err := stop(); err != nil {
				t.Fatalf("Consume: %v", err)
			}
		})
	}
}

func TestConsumerPendingTopicAndClose(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			stream, prefix := newStream(t, nc)
			p, _ := NewPublisher(nc)
			defer p.Close()
			c, err := NewConsumer(context.Background(), nc, stream, "lag")
			if err != nil {
				t.Fatal(err)
			}
			publishN(t, p, prefix+".x", 7)
			ctx := context.Background()
			// The consumer's pending count is the server's view and may
			// trail the publish acks for a moment (seen under -race).
			waitPending(t, c, 7)
			done := make(chan error, 1)
			got := make(chan *broker.Delivery, 10)
			go func() { done <- c.Consume(ctx, func(_ context.Context, d *broker.Delivery) { got <- d }) }()
			for i := range 7 {
				d := recv(t, got, 5*time.Second)
				if d.Event.Topic != prefix+".x" || d.Raw.Destination != prefix+".x" {
					t.Fatalf("topic %q destination %q", d.Event.Topic, d.Raw.Destination)
				}
				if d.Raw.Key != ferry.AggregateKey("t1", "order", "agg") {
					t.Fatalf("Raw.Key = %q", d.Raw.Key)
				}
				if d.Event.AggregateSeq != int64(i+1) {
					t.Fatalf("seq %d, want %d", d.Event.AggregateSeq, i+1)
				}
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			waitPending(t, c, 0)
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Consume after Close returned %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not stop Consume")
			}
			if err := c.Consume(ctx, func(context.Context, *broker.Delivery) {}); err == nil {
				t.Fatal("Consume after Close succeeded")
			}
		})
	}
}

// TestConsumerAckDuringOutageFails: an ack that cannot reach the server
// returns an error (the double ack waits for confirmation), so the inbox
// never believes an ack landed when it did not; the message comes back
// after the outage and can then be acked for good.
func TestConsumerAckDuringOutageFails(t *testing.T) {
	emb := startEmbedded(t)
	nc := connect(t, emb.ClientURL())
	stream, prefix := newStream(t, nc)
	p, _ := NewPublisher(nc)
	defer p.Close()
	evs := publishN(t, p, prefix+".x", 1)
	c, err := NewConsumer(context.Background(), nc, stream, "outage", WithAckWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, _ := consumeInto(t, c)
	d := recv(t, ch, 5*time.Second)
	emb.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := d.Ack(ctx); err == nil {
		t.Fatal("Ack during an outage returned nil")
	}
	if err := emb.Restart(); err != nil {
		t.Fatal(err)
	}
	d2 := recv(t, ch, 15*time.Second)
	if d2.Event.ID != evs[0].ID || d2.Attempt < 2 {
		t.Fatalf("after outage got %s attempt %d, want redelivery of %s", d2.Event.ID, d2.Attempt, evs[0].ID)
	}
	if err := d2.Ack(context.Background()); err != nil {
		t.Fatalf("Ack after recovery: %v", err)
	}
	select {
	case d3 := <-ch:
		t.Fatalf("acked message redelivered: attempt %d", d3.Attempt)
	case <-time.After(2500 * time.Millisecond):
	}
}

func TestConsumerOptionsValidate(t *testing.T) {
	emb := startEmbedded(t)
	nc := connect(t, emb.ClientURL())
	stream, _ := newStream(t, nc)
	ctx := context.Background()
	for name, o := range map[string]ConsumerOption{
		"ackwait": WithAckWait(time.Millisecond), "maxdeliver": WithMaxDeliver(0), "pending": WithMaxAckPending(0),
		"filter": WithFilterSubject(""), "batch": WithPullBatch(0),
	} {
		if _, err := NewConsumer(ctx, nc, stream, "d", o); err == nil {
			t.Errorf("%s: invalid option accepted", name)
		}
	}
	if _, err := NewConsumer(ctx, nc, "", "d"); err == nil {
		t.Error("empty stream accepted")
	}
	if _, err := NewConsumer(ctx, nc, stream, ""); err == nil {
		t.Error("empty durable accepted")
	}
	if _, err := NewConsumer(ctx, nc, "NO_SUCH_STREAM", "d"); err == nil {
		t.Error("missing stream accepted")
	}
}

func TestEmbeddedLifecycle(t *testing.T) {
	dir := t.TempDir()
	emb, err := natsembed.Start(natsembed.WithStoreDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	url := emb.ClientURL()
	if err := emb.Restart(); err == nil {
		t.Error("Restart of a running server succeeded")
	}
	emb.Shutdown()
	emb.Shutdown() // idempotent
	if emb.Running() {
		t.Error("Running after Shutdown")
	}
	if err := emb.Restart(); err != nil {
		t.Fatal(err)
	}
	if emb.ClientURL() != url {
		t.Errorf("URL changed across restart: %s → %s", url, emb.ClientURL())
	}
	if err := emb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := emb.Restart(); err == nil {
		t.Error("Restart after Close succeeded")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("given store dir removed by Close: %v", err)
	}

	own, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	tmp := own.StoreDir()
	if err := own.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("own temp store dir not removed: %v", err)
	}
	for name, o := range map[string]natsembed.Option{
		"dir": natsembed.WithStoreDir(""), "port": natsembed.WithPort(0), "payload": natsembed.WithMaxPayload(0), "sync": natsembed.WithSyncInterval(0),
	} {
		if _, err := natsembed.Start(o); err == nil {
			t.Errorf("%s: invalid option accepted", name)
		}
	}
}

// waitPending waits up to 5 s for c.Pending to report want.
func waitPending(t *testing.T, c *Consumer, want uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := c.Pending(context.Background())
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Pending = %d, %v; want %d", n, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
