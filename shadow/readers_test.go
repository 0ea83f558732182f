package shadow_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/shadow"
)

// injection is what the production side does differently from the shadow
// side: the events the old path lost, the ones only it sent, one pair of
// one aggregate's events it sent in the other order, one payload it got
// wrong.
type injection struct {
	shadow, production []ferry.Event
	missing, extra     []string // event ids
	reordered, differs string
}

// inject builds n events of aggregates of 5 events each (o-0: 0-4, o-1:
// 5-9, …) for the
// shadow side and the production side that differs by exactly: 3 dropped,
// 2 extra, one same-aggregate pair swapped, one payload altered. clean:
// production is identical.
func inject(t *testing.T, topic string, n int, clean bool) injection {
	t.Helper()
	var in injection
	seqs := map[string]int64{}
	for i := range n {
		agg := fmt.Sprint("o-", i/5)
		seqs[agg]++
		id, err := ferry.NewEventID()
		if err != nil {
			t.Fatal(err)
		}
		in.shadow = append(in.shadow, ferry.Event{ID: id, TenantID: "acme", AggregateType: "order", AggregateID: agg, AggregateSeq: seqs[agg],
			EventType: "order.updated", SchemaVersion: 1, ContentType: "application/json", Topic: topic,
			Payload: fmt.Appendf(nil, `{"order_id":%q,"seq":%d}`, agg, seqs[agg]), OccurredAt: time.Now().UTC().Truncate(time.Second)})
	}
	in.production = append([]ferry.Event(nil), in.shadow...)
	if clean {
		return in
	}
	// Swap events 5 and 6 (o-1 seq 1 and 2): adjacent, one aggregate, so
	// one move restores the order in one stream (NATS, RabbitMQ) and in
	// one Kafka key; Compare's subsequence keeps the later, moves 6.
	in.production[5], in.production[6] = in.production[6], in.production[5]
	in.reordered = in.production[5].ID.String()
	in.production[10].Payload = []byte(`{"order_id":"o-2","seq":3,"total":"wrong"}`)
	in.differs = in.production[10].ID.String()
	var kept []ferry.Event
	for i, e := range in.production {
		if i == 2 || i == 7 || i == 13 { // lost by the old path
			in.missing = append(in.missing, e.ID.String())
			continue
		}
		kept = append(kept, e)
	}
	for i := range 2 { // sent by the old path only (rolled back)
		id, _ := ferry.NewEventID()
		kept = append(kept, ferry.Event{ID: id, TenantID: "acme", AggregateType: "order", AggregateID: "o-rb", AggregateSeq: int64(i + 1),
			EventType: "order.created", SchemaVersion: 1, ContentType: "application/json", Topic: topic, Payload: []byte(`{}`), OccurredAt: time.Now().UTC()})
		in.extra = append(in.extra, id.String())
	}
	in.production = kept
	return in
}

// publishOneByOne publishes each event in its own call, so the broker
// stores them in exactly this order.
func publishOneByOne(t *testing.T, ctx context.Context, pub broker.Publisher, evs []ferry.Event) {
	t.Helper()
	for _, e := range evs {
		if res := pub.Publish(ctx, []ferry.Event{e}); res[0].Err != nil {
			t.Fatalf("publish %s: %v", e.ID, res[0].Err)
		}
	}
}

// check compares r with the injection. Missing and extra are compared as
// sets: on Kafka, keys of different partitions written in one millisecond
// have no order between them.
func (in injection) check(t *testing.T, r *shadow.Report) {
	t.Helper()
	r.Missing, r.Extra = slices.Sorted(slices.Values(r.Missing)), slices.Sorted(slices.Values(r.Extra))
	in.missing, in.extra = slices.Sorted(slices.Values(in.missing)), slices.Sorted(slices.Values(in.extra))
	want := &shadow.Report{Key: "id", Production: len(in.production), Shadow: len(in.shadow), Missing: in.missing, Extra: in.extra}
	if in.reordered != "" {
		want.Reordered = []string{in.reordered}
	}
	if in.differs != "" {
		want.Differing = []string{in.differs}
	}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("report\n got %+v\nwant %+v", r, want)
	}
}

// TestKafkaReaderCompare: on kfake, the production topic gets what the old
// path sent (Ferry's Kafka publisher stands in for it) and the shadow topic
// what shadow.Publisher sent; KafkaReader reads both and Compare reports
// exactly the injected differences (3 missing, 2 extra, 1 reordered, 1
// differing), and none on a clean run. The reads leave no consumer group
// on the cluster: nothing joined, nothing committed.
func TestKafkaReaderCompare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders", "shadow.orders", "clean", "shadow.clean"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, err := kafka.NewPublisher(c.ListenAddrs())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sp, err := shadow.NewPublisher(pub, "shadow.")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := shadow.ParseKey("id")
	for _, clean := range []bool{false, true} {
		topic := map[bool]string{false: "orders", true: "clean"}[clean]
		in := inject(t, topic, 20, clean)
		publishOneByOne(t, ctx, pub, in.production)
		publishOneByOne(t, ctx, sp, in.shadow)
		prod, err := shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: topic}.Read(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		sh, err := shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: "shadow." + topic}.Read(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		r := shadow.Compare(prod, sh, key)
		in.check(t, r)
		if clean != r.Clean() {
			t.Errorf("clean=%v: Clean() = %v", clean, r.Clean())
		}
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	groups, err := kadm.NewClient(adm).ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if names := groups.Groups(); len(names) != 0 {
		t.Errorf("the reads left consumer groups %v", names)
	}
	// A window after everything was written reads nothing.
	got, err := shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: "orders"}.Read(ctx, time.Now().Add(time.Minute))
	if err != nil || len(got) != 0 {
		t.Errorf("future window: %d messages, %v", len(got), err)
	}
	if _, err := (shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: "nope"}).Read(ctx, time.Time{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing topic: %v", err)
	}
	// Cancelled: the read ends with the context's error.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := (shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: "orders"}).Read(cctx, time.Time{}); err == nil {
		t.Error("cancelled read returned no error")
	}
}

// TestKafkaScopeOrder: two events of different aggregates stored in the
// other order on production are not reordered on Kafka (no order exists
// between record keys); the same pair of one key is.
func TestKafkaScopeOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "p", "shadow.p"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, err := kafka.NewPublisher(c.ListenAddrs())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sp, _ := shadow.NewPublisher(pub, "shadow.")
	in := inject(t, "p", 8, true)
	publishOneByOne(t, ctx, sp, in.shadow)
	prod := append([]ferry.Event(nil), in.shadow...)
	prod[4], prod[5] = prod[5], prod[4] // o-0 seq 5 and o-1 seq 1: different keys
	prod[1], prod[2] = prod[2], prod[1] // o-0 seq 2 and 3: one key
	publishOneByOne(t, ctx, pub, prod)
	p, err := shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: "p"}.Read(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: "shadow.p"}.Read(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := shadow.ParseKey("id")
	if r := shadow.Compare(p, s, key); !reflect.DeepEqual(r.Reordered, []string{in.shadow[2].ID.String()}) {
		t.Errorf("reordered %v, want only %s (o-0's pair)", r.Reordered, in.shadow[2].ID)
	}
}

// TestRabbitReaderCompare: on the real RabbitMQ, a production queue bound
// to the real routing key and a shadow queue bound to the shadow one;
// RabbitReader reads both, Compare reports exactly the injected
// differences, and afterwards both queues still hold every message (the
// reader does not consume).
func TestRabbitReaderCompare(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sfx := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	exchange := "shadowtest." + sfx
	pub, err := rabbitmq.NewPublisher(url, rabbitmq.WithExchange(exchange))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sp, _ := shadow.NewPublisher(pub, "shadow.")
	top := rabbitmq.Topology{Exchange: exchange}
	if err := rabbitmq.EnsureTopology(ctx, url, top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), url, top) })
	key, _ := shadow.ParseKey("id")
	for _, clean := range []bool{false, true} {
		topic := fmt.Sprintf("orders.%v", clean)
		pq, sq := "cmp.prod."+sfx+topic, "cmp.shadow."+sfx+topic
		for q, bind := range map[string]string{pq: topic, sq: "shadow." + topic} {
			compareQueue(t, url, exchange, q, bind)
		}
		in := inject(t, topic, 20, clean)
		publishOneByOne(t, ctx, pub, in.production)
		publishOneByOne(t, ctx, sp, in.shadow)
		prod, err := shadow.RabbitReader{URL: url, Queue: pq}.Read(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		sh, err := shadow.RabbitReader{URL: url, Queue: sq}.Read(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		r := shadow.Compare(prod, sh, key)
		in.check(t, r)
		if clean != r.Clean() {
			t.Errorf("clean=%v: Clean() = %v", clean, r.Clean())
		}
		for q, n := range map[string]int{pq: len(in.production), sq: len(in.shadow)} {
			if got := readyCount(t, ctx, url, q, n); got != n {
				t.Errorf("queue %s holds %d messages after compare, want %d (compare must not consume)", q, got, n)
			}
		}
		// Read again: the same report (the first read requeued everything).
		prod2, err := shadow.RabbitReader{URL: url, Queue: pq}.Read(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		in.check(t, shadow.Compare(prod2, sh, key))
	}
	// Cancelled: the read ends with the context's error.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := (shadow.RabbitReader{URL: url, Queue: "cmp.prod." + sfx + "orders.false"}).Read(cctx, time.Time{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled read: %v, want context.Canceled", err)
	}
	if _, err := (shadow.RabbitReader{URL: url, Queue: "cmp.nope." + sfx}).Read(ctx, time.Time{}); err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Errorf("missing queue: %v", err)
	}
}

// compareQueue declares a classic queue bound to exchange with key, the
// kind of queue docs/ADOPTING.md has the comparison read (a quorum queue
// does not keep the order of requeued messages), deleted at the end.
func compareQueue(t *testing.T, url, exchange, queue, key string) {
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
	defer ch.Close()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), url, rabbitmq.Topology{Queue: queue}) })
}

// readyCount returns the queue's ready message count, waiting up to 5 s for
// it to reach want (a requeue after channel close is asynchronous).
func readyCount(t *testing.T, ctx context.Context, url, queue string, want int) int {
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
	defer ch.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == want || time.Now().After(deadline) || ctx.Err() != nil {
			return q.Messages
		}
	}
}

// TestKafkaReaderTransactions: a topic written by a transactional producer
// (the old publisher may be one) ends in a commit marker, which occupies
// an offset but is no record: the read reaches its bound anyway and
// returns the committed records only, none of an aborted transaction.
func TestKafkaReaderTransactions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "tx"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("old-publisher"), kgo.DefaultProduceTopic("tx"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var want []string
	for _, txn := range []struct {
		n      int
		commit bool
	}{{3, true}, {2, false}, {2, true}} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for range txn.n {
			id := uuid.NewString()
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(`{}`), Headers: []kgo.RecordHeader{{Key: "ce_id", Value: []byte(id)}}}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if txn.commit {
				want = append(want, id)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(txn.commit)); err != nil {
			t.Fatal(err)
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	got, err := shadow.KafkaReader{Seeds: c.ListenAddrs(), Topic: "tx"}.Read(rctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range got {
		ids = append(ids, m.Headers["ce_id"])
	}
	if !reflect.DeepEqual(ids, want) {
		t.Errorf("read %v, want the committed %v", ids, want)
	}
}
