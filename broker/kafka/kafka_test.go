package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newCluster(t *testing.T, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func newPublisher(t *testing.T, c *kfake.Cluster, opts ...kafka.Option) *kafka.Publisher {
	t.Helper()
	p, err := kafka.NewPublisher(c.ListenAddrs(), opts...)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newConsumer(t *testing.T, c *kfake.Cluster, group string, topics []string, opts ...kafka.Option) *kafka.Consumer {
	t.Helper()
	opts = append([]kafka.Option{kafka.WithCommitInterval(50 * time.Millisecond)}, opts...)
	cons, err := kafka.NewConsumer(c.ListenAddrs(), group, topics, opts...)
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	t.Cleanup(func() { _ = cons.Close() })
	return cons
}

func event(t testing.TB, topic, aggID string, seq int64) ferry.Event {
	t.Helper()
	id, err := ferry.NewEventID()
	if err != nil {
		t.Fatal(err)
	}
	return ferry.Event{
		ID:            id,
		TenantID:      "acme",
		AggregateType: "order",
		AggregateID:   aggID,
		AggregateSeq:  seq,
		EventType:     "order.updated",
		SchemaVersion: 1,
		ContentType:   "application/json",
		Payload:       fmt.Appendf(nil, `{"seq":%d}`, seq),
		OccurredAt:    time.Now().UTC().Truncate(time.Microsecond),
		Topic:         topic,
		Headers: ferry.Headers{
			Traceparent:   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			CorrelationID: "corr-" + aggID,
			CausationID:   "cmd-1",
			Principal:     "user:alice",
			Action:        "order.update",
			Target:        "order/" + aggID,
		},
	}
}

// readAll reads every record of topic from the start with a plain client
// (no group), until n records arrived.
func readAll(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %s: got %d of %d records: %v", topic, len(out), n, err)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

func mustOK(t *testing.T, res []broker.Result) {
	t.Helper()
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("result[%d]: %v", i, r.Err)
		}
	}
}

func TestPublishReceiptsKeysAndOrder(t *testing.T) {
	const topic = "order.events"
	c := newCluster(t, 4, topic)
	p := newPublisher(t, c)
	ctx := context.Background()

	var evs []ferry.Event
	for seq := int64(1); seq <= 20; seq++ {
		for _, agg := range []string{"a1", "a2", "a3"} {
			evs = append(evs, event(t, topic, agg, seq))
		}
	}
	res := p.Publish(ctx, evs)
	if len(res) != len(evs) {
		t.Fatalf("got %d results for %d events", len(res), len(evs))
	}
	mustOK(t, res)
	partOf := map[string]int32{}
	lastOff := map[string]int64{}
	for i, r := range res {
		key := ferry.AggregateKey("acme", "order", evs[i].AggregateID)
		if r.Receipt.Broker != "kafka" || r.Receipt.Destination != topic || r.Receipt.Key != key {
			t.Fatalf("receipt[%d] = %+v", i, r.Receipt)
		}
		if p, ok := partOf[key]; ok && p != r.Receipt.Partition {
			t.Fatalf("aggregate %s on partitions %d and %d", key, p, r.Receipt.Partition)
		}
		partOf[key] = r.Receipt.Partition
		if off, ok := lastOff[key]; ok && r.Receipt.Offset <= off {
			t.Fatalf("aggregate %s: offset %d after %d (order broken)", key, r.Receipt.Offset, off)
		}
		lastOff[key] = r.Receipt.Offset
	}

	// What is in the log matches the receipts and the slice order.
	recs := readAll(t, c, topic, len(evs))
	seqs := map[string][]string{}
	for _, r := range recs {
		hs := map[string]string{}
		for _, h := range r.Headers {
			hs[h.Key] = string(h.Value)
		}
		if hs["ce_id"] == "" || hs["content-type"] != "application/json" || hs["ce_specversion"] != "1.0" {
			t.Fatalf("record headers %v", hs)
		}
		seqs[string(r.Key)] = append(seqs[string(r.Key)], hs["ce_sequence"])
	}
	for key, s := range seqs {
		for i, v := range s {
			if v != fmt.Sprint(i+1) {
				t.Fatalf("aggregate %s: broker order %v", key, s)
			}
		}
	}
}

func TestPublishValidatesAndReportsPerEvent(t *testing.T) {
	const topic = "t1"
	c := newCluster(t, 1, topic)
	p := newPublisher(t, c)
	ev := event(t, topic, "a", 1)
	bad := event(t, "", "a", 2)
	res := p.Publish(context.Background(), []ferry.Event{ev, bad})
	if res[0].Err != nil {
		t.Fatalf("good event: %v", res[0].Err)
	}
	if !errors.Is(res[1].Err, broker.ErrPermanent) {
		t.Fatalf("empty topic: %v, want permanent", res[1].Err)
	}
	if _, err := kafka.NewPublisher(nil); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("no seeds: %v", err)
	}
	if _, err := kafka.NewPublisher([]string{"x:1"}, kafka.WithSource("")); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("empty source: %v", err)
	}
}

func TestClassifyPermanent(t *testing.T) {
	const topic = "t1"
	c := newCluster(t, 1, topic)
	p := newPublisher(t, c, kafka.WithKgoOpts(kgo.ProducerBatchMaxBytes(64<<10)))
	ctx := context.Background()

	// Too large: franz-go refuses it before sending (MESSAGE_TOO_LARGE).
	big := event(t, topic, "big", 1)
	big.Payload = make([]byte, 128<<10)
	// Unknown topic with auto-create off: a missing destination, not a
	// poison event (not sent, marked ErrDestinationMissing).
	missing := event(t, "no.such.topic", "a", 1)
	res := p.Publish(ctx, []ferry.Event{big, missing})
	if !errors.Is(res[0].Err, broker.ErrPermanent) {
		t.Fatalf("too large: %v, want permanent", res[0].Err)
	}
	if !errors.Is(res[1].Err, broker.ErrNotSent) || !errors.Is(res[1].Err, broker.ErrDestinationMissing) {
		t.Fatalf("missing topic: %v, want not sent, destination missing", res[1].Err)
	}
	if !errors.Is(res[0].Err, kerr.MessageTooLarge) || !errors.Is(res[1].Err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("causes lost: %v / %v", res[0].Err, res[1].Err)
	}

	// The broker itself refusing the record (its own max size).
	f := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.MessageTooLarge})
	defer f.Remove()
	res = p.Publish(ctx, []ferry.Event{event(t, topic, "a", 1)})
	if !errors.Is(res[0].Err, broker.ErrPermanent) {
		t.Fatalf("broker MESSAGE_TOO_LARGE: %v, want permanent", res[0].Err)
	}
}

func TestClassifyTable(t *testing.T) {
	cases := []struct {
		err  error
		want broker.Class
	}{
		{kerr.MessageTooLarge, broker.ClassPermanent},
		{kerr.InvalidRecord, broker.ClassPermanent},
		{kerr.UnknownTopicOrPartition, broker.ClassNotSent},
		{fmt.Errorf("%w, last err: %w", kgo.ErrRecordRetries, kerr.UnknownTopicOrPartition), broker.ClassNotSent},
		{kerr.TopicAuthorizationFailed, broker.ClassPermanent},
		{kerr.RequestTimedOut, broker.ClassIndeterminate},
		{kerr.NotEnoughReplicasAfterAppend, broker.ClassIndeterminate},
		{fmt.Errorf("%w, last err: %w", kgo.ErrRecordTimeout, kerr.RequestTimedOut), broker.ClassIndeterminate},
		{kerr.NotLeaderForPartition, broker.ClassNotSent},
		{kerr.NotEnoughReplicas, broker.ClassNotSent},
		{fmt.Errorf("%w, last err: %w", kgo.ErrRecordTimeout, kerr.NotEnoughReplicas), broker.ClassNotSent},
		{kgo.ErrRecordTimeout, broker.ClassNotSent},
		{kgo.ErrClientClosed, broker.ClassNotSent},
		{kgo.ErrMaxBuffered, broker.ClassNotSent},
		{kerr.OutOfOrderSequenceNumber, broker.ClassIndeterminate},
		{errors.New("something else"), broker.ClassIndeterminate},
	}
	for _, tc := range cases {
		err := kafka.Classify(tc.err)
		if got := broker.ClassOf(err); got != tc.want {
			t.Errorf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("Classify(%v) lost the cause", tc.err)
		}
	}
	if kafka.Classify(nil) != nil {
		t.Fatal("Classify(nil) != nil")
	}
}

// TestOutageFaultsThenRecovery: the partition leader refuses produce
// requests (NOT_ENOUGH_REPLICAS, refused before append) → NotSent; the
// broker times out after appending (REQUEST_TIMED_OUT) → Indeterminate, and
// the record really is in the log — which is exactly why that class must
// not be treated as "not sent". After the faults go away publishing resumes.
func TestOutageFaultsThenRecovery(t *testing.T) {
	const topic = "t1"
	c := newCluster(t, 1, topic)
	p := newPublisher(t, c, kafka.WithDeliveryTimeout(time.Second))
	ctx := context.Background()
	mustOK(t, p.Publish(ctx, []ferry.Event{event(t, topic, "a", 1)}))

	refuse := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.NotEnoughReplicas, Count: -1})
	res := p.Publish(ctx, []ferry.Event{event(t, topic, "a", 2), event(t, topic, "a", 3)})
	for i, r := range res {
		if !errors.Is(r.Err, broker.ErrNotSent) {
			t.Fatalf("refused[%d]: %v, want not sent", i, r.Err)
		}
	}
	if refuse.Hits() == 0 {
		t.Fatal("fault never hit")
	}
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping during produce outage (metadata still answers): %v", err)
	}
	refuse.Remove()

	timeout := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: kerr.RequestTimedOut, Count: -1})
	indet := event(t, topic, "b", 1)
	// The idempotent producer keeps retrying a timed-out request (failing
	// it could break its sequence numbers), so the caller's deadline is
	// what ends the wait.
	tctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	res = p.Publish(tctx, []ferry.Event{indet})
	cancel()
	if !errors.Is(res[0].Err, broker.ErrIndeterminate) {
		t.Fatalf("timed out after append: %v, want indeterminate", res[0].Err)
	}
	timeout.Remove()

	after := event(t, topic, "a", 2)
	mustOK(t, p.Publish(ctx, []ferry.Event{after}))
	recs := readAll(t, c, topic, 3)
	ids := map[string]int{}
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == "ce_id" {
				ids[string(h.Value)]++
			}
		}
	}
	if ids[indet.ID.String()] == 0 {
		t.Fatalf("indeterminate record not in the log: REQUEST_TIMED_OUT is answered after the append; ids %v", ids)
	}
	if ids[after.ID.String()] != 1 {
		t.Fatalf("record after recovery: %v", ids)
	}
}

// TestOutageConnectionsCutThenRecovery: the broker drops every produce
// connection. Records in flight have unknown outcome → Indeterminate when
// the caller's deadline passes; Ping keeps working (metadata), and once the
// broker accepts again the same publisher (no restart) publishes.
func TestOutageConnectionsCutThenRecovery(t *testing.T) {
	const topic = "t1"
	c := newCluster(t, 1, topic)
	p := newPublisher(t, c)
	ctx := context.Background()
	mustOK(t, p.Publish(ctx, []ferry.Event{event(t, topic, "a", 1)}))

	var mu sync.Mutex
	cut := true
	cuts := 0
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		if !cut {
			return nil, nil, false
		}
		cuts++
		return nil, errors.New("cut"), true
	})
	tctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	res := p.Publish(tctx, []ferry.Event{event(t, topic, "a", 2)})
	cancel()
	if c := broker.ClassOf(res[0].Err); res[0].Err == nil || c == broker.ClassPermanent {
		t.Fatalf("during cut: %v (class %s), want not sent or indeterminate", res[0].Err, c)
	}
	mu.Lock()
	if cuts == 0 {
		mu.Unlock()
		t.Fatal("no produce request reached the broker")
	}
	cut = false
	mu.Unlock()

	next := event(t, topic, "a", 3)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	mustOK(t, p.Publish(rctx, []ferry.Event{next}))
	// The cut record was retried by the idempotent producer after the
	// broker came back: it is stored once, before the next record.
	recs := readAll(t, c, topic, 3)
	var seqs []string
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == "ce_sequence" {
				seqs = append(seqs, string(h.Value))
			}
		}
	}
	if fmt.Sprint(seqs) != "[1 2 3]" {
		t.Fatalf("log after recovery = %v, want [1 2 3]", seqs)
	}
}

// TestOutageClusterDownThenRestarted: the whole cluster goes away (Close)
// and comes back on the same port with its data dir. Ping fails while it
// is down, publishing fails with a retryable class, and the same publisher
// recovers once the cluster is back.
func TestOutageClusterDownThenRestarted(t *testing.T) {
	const topic = "t1"
	dir := t.TempDir()
	c1, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.DataDir(dir), kfake.Ports(0))
	if err != nil {
		t.Fatal(err)
	}
	addrs := c1.ListenAddrs()
	p, err := kafka.NewPublisher(addrs, kafka.WithDeliveryTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	first := event(t, topic, "a", 1)
	mustOK(t, p.Publish(ctx, []ferry.Event{first}))
	c1.Close()

	pctx, cancel := context.WithTimeout(ctx, time.Second)
	if err := p.Ping(pctx); err == nil {
		t.Fatal("Ping succeeded with the cluster down")
	}
	cancel()
	tctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	res := p.Publish(tctx, []ferry.Event{event(t, topic, "a", 2)})
	cancel()
	if c := broker.ClassOf(res[0].Err); res[0].Err == nil || c == broker.ClassPermanent {
		t.Fatalf("cluster down: %v (class %s), want not sent or indeterminate", res[0].Err, c)
	}

	var port int
	if _, err := fmt.Sscanf(addrs[0][len("127.0.0.1:"):], "%d", &port); err != nil {
		t.Fatalf("port of %s: %v", addrs[0], err)
	}
	c2, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic), kfake.DataDir(dir), kfake.Ports(port))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var last []broker.Result
	for rctx.Err() == nil {
		last = p.Publish(rctx, []ferry.Event{event(t, topic, "a", 3)})
		if last[0].Err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	mustOK(t, last)
	if err := p.Ping(rctx); err != nil {
		t.Fatalf("Ping after restart: %v", err)
	}
	// The record acked before the outage survived it.
	recs := readAll(t, c2, topic, 2)
	found := false
	for _, r := range recs {
		for _, h := range r.Headers {
			if h.Key == "ce_id" && string(h.Value) == first.ID.String() {
				found = true
			}
		}
	}
	if !found {
		t.Fatal("record acked before the outage is gone")
	}
}

func TestProvisioning(t *testing.T) {
	c := newCluster(t, 1, "existing")
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()

	_, err = kafka.CheckTopics(ctx, adm, []string{"existing", "fresh.events"})
	if !errors.Is(err, kafka.ErrTopicMissing) {
		t.Fatalf("CheckTopics with a missing topic: %v, want ErrTopicMissing", err)
	}
	if err := kafka.EnsureTopics(ctx, adm, []string{"existing", "fresh.events"}, 6, 1); err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	st, err := kafka.CheckTopics(ctx, adm, []string{"existing", "fresh.events"})
	if err != nil {
		t.Fatalf("CheckTopics after EnsureTopics: %v", err)
	}
	if st[1].Topic != "fresh.events" || st[1].Partitions != 6 {
		t.Fatalf("status %+v", st[1])
	}
	if len(st[1].DurabilityWarnings) == 0 {
		t.Fatalf("replication 1 must be warned about: %+v", st[1])
	}
	if err := kafka.EnsureTopics(ctx, adm, []string{"x"}, 0, 1); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("partitions 0: %v", err)
	}
	// Idempotent.
	if err := kafka.EnsureTopics(ctx, adm, []string{"fresh.events"}, 6, 1); err != nil {
		t.Fatalf("EnsureTopics again: %v", err)
	}
}

func TestPublisherClosed(t *testing.T) {
	c := newCluster(t, 1, "t1")
	p := newPublisher(t, c)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	res := p.Publish(context.Background(), []ferry.Event{event(t, "t1", "a", 1)})
	if !errors.Is(res[0].Err, broker.ErrNotSent) || !errors.Is(res[0].Err, kafka.ErrClosed) {
		t.Fatalf("after Close: %v", res[0].Err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestRefusedEventHoldsItsAggregate: an event refused before sending (too
// large) fails alone as permanent; the later events of the same aggregate
// in the call are not sent (so Kafka never stores a2 without a1), and other
// aggregates are unaffected.
func TestRefusedEventHoldsItsAggregate(t *testing.T) {
	const topic = "t1"
	c := newCluster(t, 1, topic)
	p := newPublisher(t, c, kafka.WithMaxRecordBytes(4096))
	a1, a2, b1 := event(t, topic, "a", 1), event(t, topic, "a", 2), event(t, topic, "b", 1)
	a1.Payload = make([]byte, 8192)
	res := p.Publish(context.Background(), []ferry.Event{a1, a2, b1})
	if !errors.Is(res[0].Err, broker.ErrPermanent) || !errors.Is(res[0].Err, kerr.MessageTooLarge) {
		t.Fatalf("a1: %v, want permanent too large", res[0].Err)
	}
	if !errors.Is(res[1].Err, broker.ErrNotSent) {
		t.Fatalf("a2: %v, want not sent (held behind a1)", res[1].Err)
	}
	if res[2].Err != nil {
		t.Fatalf("b1: %v", res[2].Err)
	}
	marker := event(t, topic, "c", 1)
	mustOK(t, p.Publish(context.Background(), []ferry.Event{marker}))
	for _, r := range readAll(t, c, topic, 2) {
		if string(r.Key) == ferry.AggregateKey("acme", "order", "a") {
			t.Fatalf("an event of the held aggregate reached the log")
		}
	}
}
