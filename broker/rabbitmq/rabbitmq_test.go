package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("broker/rabbitmq", testenv.RabbitMQ)
	goleak.VerifyTestMain(m)
}

func unique(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// newTopology declares a unique exchange + quorum queue bound with "#" and
// deletes both at cleanup.
func newTopology(t *testing.T, url string, withQueue bool) rabbitmq.Topology {
	t.Helper()
	top := rabbitmq.Topology{Exchange: unique("ferry-test-ex")}
	if withQueue {
		top.Queue = unique("ferry-test-q")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := rabbitmq.EnsureTopology(ctx, url, top); err != nil {
		t.Fatalf("EnsureTopology: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := rabbitmq.DeleteTopology(ctx, url, top); err != nil {
			t.Errorf("DeleteTopology: %v", err)
		}
	})
	return top
}

func event(t testing.TB, topic, agg string, seq int64) ferry.Event {
	t.Helper()
	id, err := ferry.NewEventID()
	if err != nil {
		t.Fatal(err)
	}
	return ferry.Event{
		ID: id, TenantID: "acme", AggregateType: "order", AggregateID: agg, AggregateSeq: seq,
		EventType: "order.updated", SchemaVersion: 1, ContentType: "application/json",
		Payload: fmt.Appendf(nil, `{"seq":%d}`, seq), OccurredAt: time.Now().UTC().Truncate(time.Microsecond),
		Topic: topic,
		Headers: ferry.Headers{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			CorrelationID: "corr", CausationID: "cause", Principal: "user:alice", Action: "order.update", Target: "order/" + agg},
	}
}

func newPublisher(t *testing.T, url string, opts ...rabbitmq.Option) *rabbitmq.Publisher {
	t.Helper()
	p, err := rabbitmq.NewPublisher(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func queueDepth(t *testing.T, url, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// TestConfirmsAwaited: every published message was confirmed before
// Publish returned — the counters match and each receipt carries its own
// delivery tag — and the messages are in the queue.
func TestConfirmsAwaited(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, true)
	p := newPublisher(t, url, rabbitmq.WithExchange(top.Exchange))
	var evs []ferry.Event
	for i := int64(1); i <= 50; i++ {
		evs = append(evs, event(t, "order.events", fmt.Sprintf("a%d", i%5), i))
	}
	res := p.Publish(context.Background(), evs)
	tags := map[int64]bool{}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("result %d: %v", i, r.Err)
		}
		if r.Receipt.Broker != "rabbitmq" || r.Receipt.Destination != top.Exchange || r.Receipt.Key != "order.events" || r.Receipt.Offset < 1 {
			t.Fatalf("receipt %+v", r.Receipt)
		}
		if tags[r.Receipt.Offset] {
			t.Fatalf("delivery tag %d twice", r.Receipt.Offset)
		}
		tags[r.Receipt.Offset] = true
	}
	st := p.Stats()
	if st.Published != 50 || st.Confirmed != 50 || st.Nacked != 0 || st.Unconfirmed != 0 || st.Returned != 0 {
		t.Fatalf("stats %+v: every publish must have waited for its confirm", st)
	}
	if n := queueDepth(t, url, top.Queue); n != 50 {
		t.Fatalf("queue holds %d messages, want 50", n)
	}
}

// TestUnroutableIsDestinationMissing: an exchange with no binding. With
// mandatory the broker returns the message and then acks it; Ferry reports
// ClassNotSent ErrUnroutable marked broker.ErrDestinationMissing (held by
// the relay, never dead). The negative control publishes the same
// way without mandatory: the broker confirms it (ack = true) and the
// message is silently gone — what treating the ack alone as success loses.
func TestUnroutableIsDestinationMissing(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, false)
	p := newPublisher(t, url, rabbitmq.WithExchange(top.Exchange))
	res := p.Publish(context.Background(), []ferry.Event{event(t, "nowhere", "a", 1), event(t, "nowhere", "b", 1)})
	for i, r := range res {
		if !errors.Is(r.Err, broker.ErrNotSent) || !errors.Is(r.Err, rabbitmq.ErrUnroutable) || !errors.Is(r.Err, broker.ErrDestinationMissing) {
			t.Fatalf("result %d: %v, want not sent, unroutable, destination missing", i, r.Err)
		}
	}
	if st := p.Stats(); st.Returned != 2 {
		t.Fatalf("stats %+v", st)
	}

	// Negative control: confirms without mandatory.
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), top.Exchange, "nowhere", false, false,
		amqp.Publishing{Body: []byte("x"), DeliveryMode: amqp.Persistent})
	if err != nil {
		t.Fatal(err)
	}
	if !dc.Wait() {
		t.Fatal("negative control: broker did not ack the unroutable message; the control cannot show the loss")
	}
	// Acked, yet no queue holds it: a publisher trusting the ack alone
	// would mark this event sent and lose it.
}

func TestExchangeMissingIsNotSent(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	p := newPublisher(t, url, rabbitmq.WithExchange(unique("ferry-test-missing")))
	res := p.Publish(context.Background(), []ferry.Event{event(t, "x", "a", 1)})
	if !errors.Is(res[0].Err, broker.ErrNotSent) || !errors.Is(res[0].Err, rabbitmq.ErrExchangeNotFound) {
		t.Fatalf("missing exchange: %v", res[0].Err)
	}
	// The publisher recovers (new channel) for the next call.
	top := newTopology(t, url, true)
	p2 := newPublisher(t, url, rabbitmq.WithExchange(top.Exchange))
	if r := p2.Publish(context.Background(), []ferry.Event{event(t, "x", "a", 1)}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
}

func TestTooLargeIsPermanent(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, true)
	p := newPublisher(t, url, rabbitmq.WithExchange(top.Exchange), rabbitmq.WithMaxMessageBytes(1024))
	big := event(t, "t", "a", 1)
	big.Payload = make([]byte, 2048)
	res := p.Publish(context.Background(), []ferry.Event{big, event(t, "t", "a", 2), event(t, "t", "b", 1)})
	if !errors.Is(res[0].Err, broker.ErrPermanent) || !errors.Is(res[0].Err, rabbitmq.ErrTooLarge) {
		t.Fatalf("too large: %v", res[0].Err)
	}
	// The later event of the same aggregate is held back, not sent.
	if !errors.Is(res[1].Err, broker.ErrNotSent) {
		t.Fatalf("same aggregate after the refused event: %v, want not sent", res[1].Err)
	}
	if res[2].Err != nil {
		t.Fatalf("other aggregate: %v", res[2].Err)
	}
	if n := queueDepth(t, url, top.Queue); n != 1 {
		t.Fatalf("queue depth %d, want 1 (only the other aggregate)", n)
	}
}

func TestCheckTopology(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	ctx := context.Background()
	missing := rabbitmq.Topology{Exchange: unique("ferry-test-ex"), Queue: unique("ferry-test-q")}
	if err := rabbitmq.CheckTopology(ctx, url, missing); !errors.Is(err, rabbitmq.ErrTopologyMissing) {
		t.Fatalf("missing: %v", err)
	}
	top := newTopology(t, url, true)
	if err := rabbitmq.CheckTopology(ctx, url, top); err != nil {
		t.Fatalf("after EnsureTopology: %v", err)
	}
	// A classic (non-quorum) queue under the expected name is refused.
	classic := rabbitmq.Topology{Exchange: top.Exchange, Queue: unique("ferry-test-classic")}
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(classic.Queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(classic.Queue, false, false, false) }()
	if err := rabbitmq.CheckTopology(ctx, url, classic); !errors.Is(err, rabbitmq.ErrNotDurable) {
		t.Fatalf("classic queue: %v, want ErrNotDurable", err)
	}
	if err := rabbitmq.EnsureTopology(ctx, url, rabbitmq.Topology{}); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("empty topology: %v", err)
	}
}

// proxy is a TCP proxy the test controls: freeze stops forwarding (bytes
// are swallowed, connections stay open — a network black hole), cut closes
// every connection and refuses new ones, restore forwards again.
type proxy struct {
	target string
	ln     net.Listener
	mu     sync.Mutex
	state  int // 0 forward, 1 frozen, 2 cut
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.state == 2 {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			frozen := p.state == 1
			p.mu.Unlock()
			if !frozen {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = err
			}
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

func (p *proxy) set(state int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = state
	if state == 2 {
		for c := range p.conns {
			c.Close()
		}
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.set(2)
	p.wg.Wait()
}

// viaProxy rewrites url's host to the proxy's.
func viaProxy(t *testing.T, raw string, p *proxy) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestOutageThroughProxy: the shared RabbitMQ stays up; a proxy between
// publisher and broker fails. Frozen (messages written, confirms never
// come back) → ClassIndeterminate when the deadline passes; cut
// (connection refused) → ClassNotSent and Ping fails; restored → the same
// publisher reconnects and publishes, and the queue holds every event.
func TestOutageThroughProxy(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, true)
	px := newProxy(t, hostOf(t, url))
	p := newPublisher(t, viaProxy(t, url, px), rabbitmq.WithExchange(top.Exchange), rabbitmq.WithDialTimeout(time.Second))
	ctx := context.Background()
	if r := p.Publish(ctx, []ferry.Event{event(t, "t", "a", 1)}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}

	px.set(1) // frozen
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	res := p.Publish(tctx, []ferry.Event{event(t, "t", "a", 2)})
	cancel()
	if !errors.Is(res[0].Err, broker.ErrIndeterminate) {
		t.Fatalf("frozen: %v, want indeterminate", res[0].Err)
	}

	px.set(2) // cut: connections closed, new ones refused
	var notSent int
	for i := 0; i < 3; i++ {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		res = p.Publish(tctx, []ferry.Event{event(t, "t", "a", 2)})
		cancel()
		switch c := broker.ClassOf(res[0].Err); {
		case res[0].Err == nil:
			t.Fatal("publish succeeded through a cut proxy")
		case c == broker.ClassPermanent:
			t.Fatalf("outage classified permanent: %v", res[0].Err)
		case c == broker.ClassNotSent:
			notSent++
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := p.Ping(pctx); err == nil {
			t.Fatal("Ping succeeded through a cut proxy")
		}
		cancel()
	}
	if notSent == 0 {
		t.Fatal("no publish during the cut was classified not sent (connection refused is definitely not sent)")
	}

	px.set(0)
	var last broker.Result
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		last = p.Publish(tctx, []ferry.Event{event(t, "t", "a", 3)})[0]
		cancel()
		if last.Err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last.Err != nil {
		t.Fatalf("after restore: %v", last.Err)
	}
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping after restore: %v", err)
	}
	if st := p.Stats(); st.Reconnects < 1 || st.Unconfirmed < 1 {
		t.Fatalf("stats %+v: want a reconnect and the frozen publish unconfirmed", st)
	}
	// First and last event are in the queue (the frozen one never reached
	// the broker: the proxy swallowed it).
	if n := queueDepth(t, url, top.Queue); n != 2 {
		t.Fatalf("queue depth %d, want 2", n)
	}
}

// TestDropOnSilentServerIsBounded: a connection whose server stops
// answering (the proxy swallows every byte both ways, so no close-ok ever
// comes) is dropped within the dial timeout. amqp091's Close waits for
// the close-ok without a bound: here until the heartbeat read deadline
// (15 s, measured with Close instead of CloseDeadline); against a server
// that keeps sending heartbeats but does not answer, for ever (a RabbitMQ
// 3.10 node whose quorum queue had lost its leader, in ferry prove's
// rabbitmq-node-kill).
func TestDropOnSilentServerIsBounded(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, true)
	px := newProxy(t, hostOf(t, url))
	p := newPublisher(t, viaProxy(t, url, px), rabbitmq.WithExchange(top.Exchange), rabbitmq.WithDialTimeout(time.Second))
	ctx := context.Background()
	if err := p.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	px.set(1) // silent
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := p.Ping(pctx); err == nil {
		t.Fatal("Ping succeeded through a silent proxy")
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("Ping on a silent server took %s: the drop waited for a close-ok that never comes", d)
	}
}

// TestBrokerNackIsNotSent: a queue full with overflow=reject-publish
// makes the broker nack further publishes; Ferry reports ClassNotSent
// ErrNacked (the message is not stored), and the Stats count the nack.
func TestBrokerNackIsNotSent(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, false)
	queue := unique("ferry-test-full")
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{
		"x-max-length": int64(1), "x-overflow": "reject-publish",
	}); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()
	if err := ch.QueueBind(queue, "#", top.Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, url, rabbitmq.WithExchange(top.Exchange))
	first := p.Publish(context.Background(), []ferry.Event{event(t, "t", "a", 1)})
	if first[0].Err != nil {
		t.Fatal(first[0].Err)
	}
	res := p.Publish(context.Background(), []ferry.Event{event(t, "t", "a", 2)})
	if !errors.Is(res[0].Err, broker.ErrNotSent) || !errors.Is(res[0].Err, rabbitmq.ErrNacked) {
		t.Fatalf("queue full: %v, want not sent / nacked", res[0].Err)
	}
	if st := p.Stats(); st.Nacked != 1 || st.Confirmed != 1 {
		t.Fatalf("stats %+v", st)
	}
	if n := queueDepth(t, url, queue); n != 1 {
		t.Fatalf("queue depth %d, want 1", n)
	}
}

// TestWithoutConfirmsAWriteIsNotDelivery is the negative control for
// waiting on confirms: through a frozen network, a plain publish (no
// confirm mode) returns success at once, yet the message never reaches the
// queue. Ferry's publisher, on the same path, reports Indeterminate.
func TestWithoutConfirmsAWriteIsNotDelivery(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	top := newTopology(t, url, true)
	px := newProxy(t, hostOf(t, url))
	conn, err := amqp.Dial(viaProxy(t, url, px))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, viaProxy(t, url, px), rabbitmq.WithExchange(top.Exchange))
	if err := p.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	px.set(1) // frozen
	if err := ch.PublishWithContext(context.Background(), top.Exchange, "t", true, false,
		amqp.Publishing{Body: []byte("fire and forget"), DeliveryMode: amqp.Persistent}); err != nil {
		t.Fatalf("negative control: plain publish failed (%v); it cannot show the loss", err)
	}
	tctx, cancel := context.WithTimeout(context.Background(), time.Second)
	res := p.Publish(tctx, []ferry.Event{event(t, "t", "a", 1)})
	cancel()
	if !errors.Is(res[0].Err, broker.ErrIndeterminate) {
		t.Fatalf("Ferry publisher through a frozen network: %v, want indeterminate", res[0].Err)
	}
	px.set(2)
	// The plain publish "succeeded", but nothing arrived.
	if n := queueDepth(t, url, top.Queue); n != 0 {
		t.Fatalf("queue depth %d: the frozen proxy let a message through", n)
	}
}
