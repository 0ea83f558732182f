package brokertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// Capabilities declares what an adapter guarantees. The suite checks
// exactly these: a declared guarantee that does not hold fails, and an
// undeclared one is checked to be really absent where that is observable
// (e.g. a broker that does not declare dedup must deliver a re-published
// event twice), so declarations cannot drift from behaviour.
type Capabilities struct {
	// DedupByEventID: re-publishing an event id within DedupWindow stores
	// it once (NATS JetStream: Nats-Msg-Id and the stream's duplicate
	// window). When false, the suite expects both copies to be delivered.
	DedupByEventID bool
	// DedupWindow is the broker's dedup horizon (informational; the suite
	// re-publishes well within it).
	DedupWindow time.Duration
	// ReportsDuplicate: the receipt of a deduplicated publish has
	// Duplicate = true. Requires DedupByEventID.
	ReportsDuplicate bool
	// OrderedByKey: events of one aggregate are consumed in publish order.
	OrderedByKey bool
	// Redelivers: a Nack, and a message not acked when its consumer goes
	// away, are delivered again to the same subscription.
	Redelivers bool
	// AttemptCounted: Delivery.Attempt is 1 on first delivery and grows
	// with each redelivery.
	AttemptCounted bool
	// OversizedPayload, when > 0, is a payload size the broker must refuse
	// with ClassPermanent.
	OversizedPayload int
	// RedeliveryTimeout bounds the wait for a redelivery after a consumer
	// restart (NATS: the consumer's AckWait plus margin). Default 15s.
	RedeliveryTimeout time.Duration
}

// Harness is what an adapter's test provides to Run.
type Harness struct {
	// Capabilities the adapter declares.
	Capabilities Capabilities
	// Setup prepares an isolated destination (unique stream, topic or
	// queue) for one test and registers its cleanup with t.Cleanup. Messages
	// published after Setup and before the first NewConsumer must be
	// delivered to that consumer (create the durable consumer, consumer
	// group start offset or bound queue in Setup if the broker needs it).
	Setup func(t *testing.T) *Env
}

// Env is one test's isolated destination.
type Env struct {
	// Topic is the ferry.Event.Topic the suite gives its events, so that
	// the publisher routes them into this destination.
	Topic string
	// NewPublisher returns a fresh publisher. The suite closes it.
	NewPublisher func(t *testing.T) broker.Publisher
	// NewConsumer returns a consumer of the destination. All consumers of
	// one Env share one durable position (NATS durable consumer, Kafka
	// group, RabbitMQ queue): a consumer created after another was closed
	// resumes where it stopped and receives what it left unacked. The
	// suite closes it.
	NewConsumer func(t *testing.T) broker.Consumer
	// PublishRaw, when non-nil, puts a message with exactly these headers
	// and body into the destination, bypassing the codec; the suite checks
	// that an undecodable message is delivered with DecodeErr set and Raw
	// filled, not dropped.
	PublishRaw func(t *testing.T, headers map[string]string, body []byte)
	// Outage, when non-nil, makes the broker unavailable to this Env's
	// clients (stop the broker instance the harness owns, or cut a proxy)
	// and returns a function that makes it available again.
	Outage func(t *testing.T) (restore func())
}

func (c Capabilities) redeliveryTimeout() time.Duration {
	if c.RedeliveryTimeout > 0 {
		return c.RedeliveryTimeout
	}
	return 15 * time.Second
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Setup == nil {
		t.Fatal("brokertest: Harness.Setup is nil")
	}
	if h.Capabilities.ReportsDuplicate && !h.Capabilities.DedupByEventID {
		t.Fatal("brokertest: ReportsDuplicate requires DedupByEventID")
	}
	s := suite{caps: h.Capabilities, setup: h.Setup}
	t.Run("PublishConsumeOrderAndReceipts", s.orderAndReceipts)
	t.Run("DuplicateEventID", s.duplicates)
	t.Run("NackRedelivers", s.nackRedelivers)
	t.Run("RestartRedeliversUnacked", s.restartRedeliversUnacked)
	t.Run("AckedNotRedelivered", s.ackedNotRedelivered)
	t.Run("OversizedIsPermanent", s.oversized)
	t.Run("UndecodableDelivered", s.undecodable)
	t.Run("ConsumeStopsOnCancel", s.consumeStops)
	t.Run("OutageClassifiedAndRecovers", s.outage)
}

type suite struct {
	caps  Capabilities
	setup func(t *testing.T) *Env
}

// Event returns a valid event for the suite's tests.
func Event(t testing.TB, topic, aggregate string, seq int64) ferry.Event {
	t.Helper()
	id, err := ferry.NewEventID()
	if err != nil {
		t.Fatal(err)
	}
	return ferry.Event{
		ID: id, TenantID: "conformance", AggregateType: "order", AggregateID: aggregate, AggregateSeq: seq,
		EventType: "order.updated", SchemaVersion: 1, ContentType: "application/json",
		Payload:    []byte(fmt.Sprintf(`{"aggregate":%q,"seq":%d}`, aggregate, seq)),
		OccurredAt: time.Now().UTC().Truncate(time.Microsecond), Topic: topic,
		Headers: ferry.Headers{
			Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", CorrelationID: "corr-" + aggregate,
			CausationID: "cause", Principal: "user:conformance", Action: "order.update", Target: "order/" + aggregate,
		},
	}
}

func publisher(t *testing.T, env *Env) broker.Publisher {
	t.Helper()
	p := env.NewPublisher(t)
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("publisher Close: %v", err)
		}
	})
	return p
}

func mustPublish(t *testing.T, p broker.Publisher, evs []ferry.Event) []broker.Receipt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := p.Publish(ctx, evs)
	if len(res) != len(evs) {
		t.Fatalf("Publish returned %d results for %d events", len(res), len(evs))
	}
	out := make([]broker.Receipt, len(res))
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("publish event %d (%s seq %d): %v", i, evs[i].AggregateID, evs[i].AggregateSeq, r.Err)
		}
		out[i] = r.Receipt
	}
	return out
}

// running is a consumer running Consume in a goroutine, feeding a channel.
type running struct {
	t      *testing.T
	c      broker.Consumer
	cancel context.CancelFunc
	ch     chan *broker.Delivery
	done   chan error
	once   sync.Once
}

func startConsumer(t *testing.T, env *Env) *running {
	t.Helper()
	c := env.NewConsumer(t)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, c: c, cancel: cancel, ch: make(chan *broker.Delivery, 10000), done: make(chan error, 1)}
	go func() {
		r.done <- c.Consume(ctx, func(_ context.Context, d *broker.Delivery) {
			r.ch <- d
		})
	}()
	t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels Consume, checks it returns nil promptly, and closes the consumer.
func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				r.t.Errorf("Consume returned %v after cancel, want nil", err)
			}
		case <-time.After(15 * time.Second):
			r.t.Errorf("Consume did not return within 15s of cancel")
		}
		if err := r.c.Close(); err != nil {
			r.t.Errorf("consumer Close: %v", err)
		}
	})
}

// next waits for one delivery.
func (r *running) next(timeout time.Duration) (*broker.Delivery, bool) {
	select {
	case d := <-r.ch:
		return d, true
	case err := <-r.done:
		r.t.Fatalf("Consume returned early: %v", err)
	case <-time.After(timeout):
	}
	return nil, false
}

// collect waits for n deliveries.
func (r *running) collect(n int, timeout time.Duration) []*broker.Delivery {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	var out []*broker.Delivery
	for len(out) < n {
		d, ok := r.next(time.Until(deadline))
		if !ok {
			r.t.Fatalf("received %d of %d messages within %v", len(out), n, timeout)
		}
		out = append(out, d)
	}
	return out
}

func ack(t *testing.T, d *broker.Delivery) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}

func decoded(t *testing.T, d *broker.Delivery) ferry.Event {
	t.Helper()
	if d.DecodeErr != nil {
		t.Fatalf("delivery not decodable: %v (headers %v)", d.DecodeErr, d.Raw.Headers)
	}
	return d.Event
}

// sameEvent compares every field the wire carries.
func sameEvent(t *testing.T, got, want ferry.Event) {
	t.Helper()
	if !got.OccurredAt.Equal(want.OccurredAt) {
		t.Errorf("event %s: OccurredAt %v, want %v", want.ID, got.OccurredAt, want.OccurredAt)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		t.Errorf("event %s: payload %q, want %q", want.ID, got.Payload, want.Payload)
	}
	g, w := got, want
	g.OccurredAt, w.OccurredAt = time.Time{}, time.Time{}
	g.Payload, w.Payload = nil, nil
	g.Topic, w.Topic, g.Shard, w.Shard = "", "", 0, 0
	if fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", w) {
		t.Errorf("event mismatch:\n got %+v\nwant %+v", g, w)
	}
}

func (s suite) orderAndReceipts(t *testing.T) {
	env := s.setup(t)
	p := publisher(t, env)
	const aggregates, perAggregate, batch = 6, 10, 7
	var all []ferry.Event
	for seq := int64(1); seq <= perAggregate; seq++ {
		for a := 0; a < aggregates; a++ {
			all = append(all, Event(t, env.Topic, fmt.Sprintf("agg-%d", a), seq))
		}
	}
	byID := map[string]ferry.Event{}
	for i := 0; i < len(all); i += batch {
		end := min(i+batch, len(all))
		rs := mustPublish(t, p, all[i:end])
		for j, r := range rs {
			if r.Broker != p.Name() || r.Broker == "" {
				t.Errorf("receipt broker %q, want %q", r.Broker, p.Name())
			}
			if r.Destination == "" {
				t.Errorf("receipt %d has no destination: %+v", i+j, r)
			}
			if r.Duplicate {
				t.Errorf("first publish reported as duplicate: %+v", r)
			}
		}
		for _, ev := range all[i:end] {
			byID[ev.ID.String()] = ev
		}
	}

	r := startConsumer(t, env)
	ds := r.collect(len(all), 60*time.Second)
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, d := range ds {
		ev := decoded(t, d)
		want, ok := byID[ev.ID.String()]
		if !ok {
			t.Fatalf("unexpected event %s", ev.ID)
		}
		if seen[ev.ID.String()] {
			t.Errorf("event %s delivered twice without a failure", ev.ID)
		}
		seen[ev.ID.String()] = true
		sameEvent(t, ev, want)
		if d.Raw.Destination == "" || len(d.Raw.Body) == 0 || len(d.Raw.Headers) == 0 {
			t.Errorf("Raw not filled: %+v", d.Raw)
		}
		if s.caps.AttemptCounted && d.Attempt != 1 {
			t.Errorf("first delivery Attempt = %d, want 1", d.Attempt)
		}
		if s.caps.OrderedByKey {
			if prev := last[ev.AggregateID]; ev.AggregateSeq != prev+1 {
				t.Errorf("aggregate %s: seq %d after %d (broker order differs from publish order)", ev.AggregateID, ev.AggregateSeq, prev)
			}
			last[ev.AggregateID] = ev.AggregateSeq
		}
		ack(t, d)
	}
	if len(seen) != len(all) {
		t.Fatalf("%d distinct events received, want %d", len(seen), len(all))
	}
}

func (s suite) duplicates(t *testing.T) {
	env := s.setup(t)
	p := publisher(t, env)
	e1 := Event(t, env.Topic, "dup", 1)
	marker := Event(t, env.Topic, "dup", 2)
	first := mustPublish(t, p, []ferry.Event{e1})[0]
	second := mustPublish(t, p, []ferry.Event{e1})[0]
	mustPublish(t, p, []ferry.Event{marker})
	if s.caps.ReportsDuplicate && !second.Duplicate {
		t.Errorf("re-publish receipt %+v: Duplicate false, declared ReportsDuplicate", second)
	}
	if !s.caps.ReportsDuplicate && second.Duplicate {
		t.Errorf("re-publish receipt %+v: Duplicate true, not declared", second)
	}
	if s.caps.DedupByEventID && second.Offset != first.Offset {
		t.Errorf("deduplicated re-publish has offset %d, first had %d", second.Offset, first.Offset)
	}

	r := startConsumer(t, env)
	count := 0
	deadline := time.Now().Add(30 * time.Second)
	sawMarker := false
	for !sawMarker {
		d, ok := r.next(time.Until(deadline))
		if !ok {
			t.Fatalf("marker not received (e1 seen %d times)", count)
		}
		ev := decoded(t, d)
		switch ev.ID {
		case e1.ID:
			count++
		case marker.ID:
			sawMarker = true
		}
		ack(t, d)
	}
	if !s.caps.OrderedByKey { // the second copy may trail the marker
		for {
			d, ok := r.next(2 * time.Second)
			if !ok {
				break
			}
			if decoded(t, d).ID == e1.ID {
				count++
			}
			ack(t, d)
		}
	}
	want := 2
	if s.caps.DedupByEventID {
		want = 1
	}
	if count != want {
		t.Fatalf("event published twice delivered %d times, want %d (DedupByEventID=%v)", count, want, s.caps.DedupByEventID)
	}
}

func (s suite) nackRedelivers(t *testing.T) {
	if !s.caps.Redelivers {
		t.Skip("adapter does not declare Redelivers")
	}
	env := s.setup(t)
	p := publisher(t, env)
	ev := Event(t, env.Topic, "nack", 1)
	mustPublish(t, p, []ferry.Event{ev})
	r := startConsumer(t, env)
	d := r.collect(1, 30*time.Second)[0]
	if decoded(t, d).ID != ev.ID {
		t.Fatalf("got %s, want %s", d.Event.ID, ev.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Nack(ctx, 0); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	d2 := r.collect(1, s.caps.redeliveryTimeout())[0]
	if decoded(t, d2).ID != ev.ID {
		t.Fatalf("after Nack got %s, want redelivery of %s", d2.Event.ID, ev.ID)
	}
	if s.caps.AttemptCounted && (d.Attempt != 1 || d2.Attempt != 2) {
		t.Errorf("attempts %d then %d, want 1 then 2", d.Attempt, d2.Attempt)
	}
	ack(t, d2)
	if d3, ok := r.next(2 * time.Second); ok {
		t.Fatalf("acked message delivered again: %s attempt %d", d3.Event.ID, d3.Attempt)
	}
}

// restartRedeliversUnacked acks every message but one, from other
// goroutines in reverse order (as the inbox does), restarts the consumer
// and expects the unacked one again.
func (s suite) restartRedeliversUnacked(t *testing.T) {
	if !s.caps.Redelivers {
		t.Skip("adapter does not declare Redelivers")
	}
	env := s.setup(t)
	p := publisher(t, env)
	var evs []ferry.Event
	for i := int64(1); i <= 10; i++ {
		evs = append(evs, Event(t, env.Topic, "restart", i))
	}
	mustPublish(t, p, evs)
	r := startConsumer(t, env)
	ds := r.collect(len(evs), 30*time.Second)
	const skip = 3
	var wg sync.WaitGroup
	errs := make(chan error, len(ds))
	for i := len(ds) - 1; i >= 0; i-- {
		if decoded(t, ds[i]).ID == evs[skip].ID {
			continue
		}
		wg.Add(1)
		go func(d *broker.Delivery) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := d.Ack(ctx); err != nil {
				errs <- err
			}
		}(ds[i])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Ack from goroutine: %v", err)
	}
	r.stop()

	r2 := startConsumer(t, env)
	deadline := time.Now().Add(s.caps.redeliveryTimeout())
	for {
		d, ok := r2.next(time.Until(deadline))
		if !ok {
			t.Fatalf("unacked event not redelivered within %v after consumer restart", s.caps.redeliveryTimeout())
		}
		ev := decoded(t, d)
		ack(t, d)
		if ev.ID == evs[skip].ID {
			if s.caps.AttemptCounted && d.Attempt < 2 {
				t.Errorf("redelivery Attempt = %d, want >= 2", d.Attempt)
			}
			return
		}
	}
}

// ackedNotRedelivered acks everything (out of order, from goroutines),
// restarts the consumer and checks nothing acked comes back.
func (s suite) ackedNotRedelivered(t *testing.T) {
	env := s.setup(t)
	p := publisher(t, env)
	var evs []ferry.Event
	for i := int64(1); i <= 10; i++ {
		evs = append(evs, Event(t, env.Topic, fmt.Sprintf("acked-%d", i%3), i))
	}
	mustPublish(t, p, evs)
	r := startConsumer(t, env)
	ds := r.collect(len(evs), 30*time.Second)
	var wg sync.WaitGroup
	for i := len(ds) - 1; i >= 0; i-- {
		wg.Add(1)
		go func(d *broker.Delivery) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := d.Ack(ctx); err != nil {
				t.Errorf("Ack: %v", err)
			}
		}(ds[i])
	}
	wg.Wait()
	r.stop()

	marker := Event(t, env.Topic, "marker", 1)
	r2 := startConsumer(t, env)
	mustPublish(t, p, []ferry.Event{marker})
	acked := map[string]bool{}
	for _, ev := range evs {
		acked[ev.ID.String()] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	grace := time.Time{}
	for {
		wait := time.Until(deadline)
		if !grace.IsZero() {
			wait = time.Until(grace)
		}
		d, ok := r2.next(wait)
		if !ok {
			if grace.IsZero() {
				t.Fatal("marker not received")
			}
			return
		}
		ev := decoded(t, d)
		if acked[ev.ID.String()] {
			t.Fatalf("acked event %s (seq %d) redelivered after restart", ev.ID, ev.AggregateSeq)
		}
		ack(t, d)
		if ev.ID == marker.ID && grace.IsZero() {
			// Watch a little longer: a lost ack would surface as a
			// redelivery only after the broker's redelivery timeout.
			grace = time.Now().Add(min(s.caps.redeliveryTimeout(), 5*time.Second))
		}
	}
}

func (s suite) oversized(t *testing.T) {
	if s.caps.OversizedPayload <= 0 {
		t.Skip("adapter declares no OversizedPayload")
	}
	env := s.setup(t)
	p := publisher(t, env)
	big := Event(t, env.Topic, "big", 1)
	big.Payload = bytes.Repeat([]byte("x"), s.caps.OversizedPayload)
	fine := Event(t, env.Topic, "fine", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := p.Publish(ctx, []ferry.Event{big, fine})
	if len(res) != 2 {
		t.Fatalf("%d results for 2 events", len(res))
	}
	if res[0].Err == nil || broker.ClassOf(res[0].Err) != broker.ClassPermanent || !errors.Is(res[0].Err, broker.ErrPermanent) {
		t.Errorf("oversized event: err %v (class %s), want ClassPermanent", res[0].Err, broker.ClassOf(res[0].Err))
	}
	if bytes.Contains([]byte(fmt.Sprint(res[0].Err)), big.Payload[:64]) {
		t.Error("error message contains payload bytes")
	}
	if res[1].Err != nil {
		t.Errorf("event of another aggregate in the same batch: %v, want success", res[1].Err)
	}
}

func (s suite) undecodable(t *testing.T) {
	env := s.setup(t)
	if env.PublishRaw == nil {
		t.Skip("harness provides no PublishRaw")
	}
	env.PublishRaw(t, map[string]string{"x-not-cloudevents": "1"}, []byte("garbage"))
	r := startConsumer(t, env)
	d := r.collect(1, 30*time.Second)[0]
	if d.DecodeErr == nil {
		t.Fatalf("undecodable message delivered with DecodeErr nil: %+v", d.Event)
	}
	if string(d.Raw.Body) != "garbage" || d.Raw.Headers["x-not-cloudevents"] != "1" {
		t.Errorf("Raw not filled: body %q headers %v", d.Raw.Body, d.Raw.Headers)
	}
	if d.Ack == nil || d.Nack == nil {
		t.Fatal("undecodable delivery has no Ack/Nack: it could never be parked and acked")
	}
	ack(t, d)
}

func (s suite) consumeStops(t *testing.T) {
	env := s.setup(t)
	c := env.NewConsumer(t)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Consume(ctx, func(context.Context, *broker.Delivery) {}) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Consume after cancel returned %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Consume did not return within 15s of cancel")
	}
}

// outage checks that publishing during an outage fails with a retryable
// class (never ClassPermanent: an outage must not send rows to the dead
// letters), that Ping reports it, and that after recovery the publisher
// works again and every event re-published the way a relay would (same
// ids) is delivered.
func (s suite) outage(t *testing.T) {
	env := s.setup(t)
	if env.Outage == nil {
		t.Skip("harness provides no Outage hook")
	}
	p := publisher(t, env)
	before := Event(t, env.Topic, "outage", 1)
	mustPublish(t, p, []ferry.Event{before})

	restore := env.Outage(t)
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()
	var pending []ferry.Event
	seq := int64(2)
	for i := 0; i < 3; i++ {
		ev := Event(t, env.Topic, "outage", seq)
		seq++
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		res := p.Publish(ctx, []ferry.Event{ev})
		cancel()
		if len(res) != 1 {
			t.Fatalf("%d results for 1 event", len(res))
		}
		switch c := broker.ClassOf(res[0].Err); {
		case res[0].Err == nil:
			t.Errorf("publish during outage succeeded: %+v", res[0].Receipt)
		case c == broker.ClassPermanent:
			t.Errorf("publish during outage classified permanent: %v", res[0].Err)
		default:
			t.Logf("during outage: %s: %v", c, res[0].Err)
		}
		pending = append(pending, ev)
		ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
		if err := p.Ping(ctx); err == nil {
			t.Error("Ping succeeded during outage")
		}
		cancel()
	}

	restore()
	restored = true
	deadline := time.Now().Add(60 * time.Second)
	for len(pending) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d events still not published 60s after recovery", len(pending))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res := p.Publish(ctx, pending)
		cancel()
		var rest []ferry.Event
		for i, r := range res {
			if r.Err != nil {
				if broker.ClassOf(r.Err) == broker.ClassPermanent {
					t.Fatalf("publish after recovery classified permanent: %v", r.Err)
				}
				rest = append(rest, pending[i])
			}
		}
		if len(rest) > 0 {
			time.Sleep(250 * time.Millisecond)
		}
		// Like the relay: resend from the first failure on, in order.
		pending = rest
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		t.Errorf("Ping after recovery: %v", err)
	}

	r := startConsumer(t, env)
	want := map[int64]bool{}
	for i := int64(1); i < seq; i++ {
		want[i] = true
	}
	deadline = time.Now().Add(30 * time.Second)
	for len(want) > 0 {
		d, ok := r.next(time.Until(deadline))
		if !ok {
			t.Fatalf("events with seq %v lost across the outage", keys(want))
		}
		ev := decoded(t, d)
		delete(want, ev.AggregateSeq)
		ack(t, d)
	}
}

func keys(m map[int64]bool) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
