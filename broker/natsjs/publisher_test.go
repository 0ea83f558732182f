package natsjs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

func testEvent(t testing.TB, topic, agg string, seq int64) ferry.Event {
	t.Helper()
	id, err := ferry.NewEventID()
	if err != nil {
		t.Fatal(err)
	}
	return ferry.Event{
		ID: id, TenantID: "t1", AggregateType: "order", AggregateID: agg, AggregateSeq: seq,
		EventType: "order.updated", SchemaVersion: 1, ContentType: "application/json",
		Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq)), OccurredAt: time.Now().UTC(), Topic: topic,
	}
}

func TestPublishReceiptsAndDuplicate(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			stream, prefix := newStream(t, nc)
			p, err := NewPublisher(nc, WithSource("ferry://test"))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Ping(ctx); err != nil {
				t.Fatal(err)
			}
			topic := prefix + ".orders"
			evs := []ferry.Event{testEvent(t, topic, "a", 1), testEvent(t, topic, "a", 2), testEvent(t, topic, "b", 1)}
			res := p.Publish(ctx, evs)
			for i, r := range res {
				if r.Err != nil {
					t.Fatalf("event %d: %v", i, r.Err)
				}
				want := broker.Receipt{Broker: "nats", Destination: stream, Key: topic, Offset: int64(i + 1)}
				if r.Receipt != want {
					t.Fatalf("receipt %d = %+v, want %+v", i, r.Receipt, want)
				}
			}
			again := p.Publish(ctx, evs[:1])
			if again[0].Err != nil || !again[0].Receipt.Duplicate || again[0].Receipt.Offset != 1 {
				t.Fatalf("re-publish: %+v, want duplicate of seq 1", again[0])
			}
		})
	}
}

func TestPublishErrorClasses(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			_, prefix := newStream(t, nc)
			p, err := NewPublisher(nc, WithAckTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			big := testEvent(t, prefix+".x", "a", 1)
			big.Payload = make([]byte, int(nc.MaxPayload())+1)
			after := testEvent(t, prefix+".x", "a", 2)
			other := testEvent(t, prefix+".x", "b", 1)
			noStream := testEvent(t, randName("nostream")+".x", "c", 1)
			badSubject := testEvent(t, prefix+"..x", "d", 1)
			res := p.Publish(ctx, []ferry.Event{big, after, other, noStream, badSubject})
			if c := broker.ClassOf(res[0].Err); c != broker.ClassPermanent || !errors.Is(res[0].Err, broker.ErrPermanent) {
				t.Errorf("oversized: %v (%s), want permanent", res[0].Err, c)
			}
			if c := broker.ClassOf(res[1].Err); c != broker.ClassNotSent {
				t.Errorf("successor of a failed event of the same aggregate: %v (%s), want not_sent", res[1].Err, c)
			}
			if res[2].Err != nil {
				t.Errorf("other aggregate: %v, want success", res[2].Err)
			}
			if c := broker.ClassOf(res[3].Err); c != broker.ClassNotSent || !errors.Is(res[3].Err, broker.ErrDestinationMissing) {
				t.Errorf("subject without stream: %v (%s), want not_sent marked destination missing", res[3].Err, c)
			}
			if c := broker.ClassOf(res[4].Err); c != broker.ClassPermanent {
				t.Errorf("bad subject: %v (%s), want permanent", res[4].Err, c)
			}

			nc.Close()
			res = p.Publish(ctx, []ferry.Event{testEvent(t, prefix+".x", "e", 1)})
			if c := broker.ClassOf(res[0].Err); c != broker.ClassNotSent {
				t.Errorf("closed connection: %v (%s), want not_sent", res[0].Err, c)
			}
			if err := p.Ping(ctx); err == nil {
				t.Error("Ping on a closed connection succeeded")
			}
		})
	}
}

func TestPublishStreamMaxMsgSizeIsPermanent(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			_, prefix := newStream(t, nc, func(c *StreamConfig) { c.MaxMsgSize = 1024 })
			p, err := NewPublisher(nc)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ev := testEvent(t, prefix+".x", "a", 1)
			ev.Payload = make([]byte, 2048)
			res := p.Publish(context.Background(), []ferry.Event{ev})
			if c := broker.ClassOf(res[0].Err); c != broker.ClassPermanent {
				t.Fatalf("over stream max_msg_size: %v (%s), want permanent", res[0].Err, c)
			}
		})
	}
}

func TestPublishTimeoutIsIndeterminate(t *testing.T) {
	// A plain subscriber on the subject receives the message (so there is
	// no "no responders") and never answers: the message certainly left
	// the client, and no ack can come back.
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			subject := randName("blackhole") + ".x"
			sub, err := nc.SubscribeSync(subject)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			p, err := NewPublisher(nc, WithAckTimeout(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			res := p.Publish(context.Background(), []ferry.Event{testEvent(t, subject, "a", 1), testEvent(t, subject, "b", 1)})
			for i, r := range res {
				if c := broker.ClassOf(r.Err); r.Err == nil || c != broker.ClassIndeterminate {
					t.Errorf("event %d: %v (%s), want indeterminate", i, r.Err, c)
				}
			}
			if _, err := sub.NextMsg(time.Second); err != nil {
				t.Fatalf("message did not reach the subscriber: %v", err)
			}

			// The caller's context ending while acks are awaited is
			// indeterminate too, never not-sent.
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			p2, err := NewPublisher(nc, WithAckTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			defer p2.Close()
			res = p2.Publish(ctx, []ferry.Event{testEvent(t, subject, "c", 1)})
			if c := broker.ClassOf(res[0].Err); res[0].Err == nil || c != broker.ClassIndeterminate || !errors.Is(res[0].Err, context.DeadlineExceeded) {
				t.Errorf("ctx expiry: %v (%s), want indeterminate wrapping DeadlineExceeded", res[0].Err, c)
			}
		})
	}
}

func TestPublisherOptionsValidate(t *testing.T) {
	emb := startEmbedded(t)
	nc := connect(t, emb.ClientURL())
	for name, o := range map[string]PublisherOption{
		"source": WithSource(""), "ack": WithAckTimeout(0), "pending": WithMaxPending(0), "subject": WithSubject(nil),
	} {
		if _, err := NewPublisher(nc, o); err == nil {
			t.Errorf("%s: invalid option accepted", name)
		}
	}
	if _, err := NewPublisher(nil); err == nil {
		t.Error("nil conn accepted")
	}
}

// TestPublishBatchLargerThanMaxPending: a batch larger than the in-flight
// bound waits for acks to free slots instead of failing.
func TestPublishBatchLargerThanMaxPending(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			stream, prefix := newStream(t, nc)
			p, err := NewPublisher(nc, WithMaxPending(4))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			evs := make([]ferry.Event, 500)
			for i := range evs {
				evs[i] = testEvent(t, prefix+".x", fmt.Sprintf("a%d", i%7), int64(i/7+1))
			}
			for i, r := range p.Publish(context.Background(), evs) {
				if r.Err != nil {
					t.Fatalf("event %d: %v", i, r.Err)
				}
				if r.Receipt.Offset != int64(i+1) || r.Receipt.Destination != stream {
					t.Fatalf("event %d receipt %+v: stream order differs from slice order", i, r.Receipt)
				}
			}
		})
	}
}
