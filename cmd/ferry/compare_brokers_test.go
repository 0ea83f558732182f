package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/shadow"
)

// compareCounts are the sizes of a report's categories.
type compareCounts struct{ Production, Shadow, Missing, Extra, Reordered, Differing, KeyErrors int }

// compareEvents are n events of aggregates of 5 (o-0: 0-4, …) for the
// shadow side and the production side, which differs (unless clean) by
// exactly: 3 dropped, 2 extra, one adjacent pair of one aggregate swapped,
// one payload altered.
func compareEvents(t *testing.T, topic string, n int, clean bool) (prod, sh []ferry.Event, want compareCounts) {
	t.Helper()
	ev := func(agg string, seq int64, payload string) ferry.Event {
		id, err := ferry.NewEventID()
		if err != nil {
			t.Fatal(err)
		}
		return ferry.Event{ID: id, TenantID: "acme", AggregateType: "order", AggregateID: agg, AggregateSeq: seq, EventType: "order.updated",
			SchemaVersion: 1, ContentType: "application/json", Topic: topic, Payload: []byte(payload), OccurredAt: time.Now().UTC()}
	}
	for i := range n {
		agg, seq := fmt.Sprint("o-", i/5), int64(i%5+1)
		sh = append(sh, ev(agg, seq, fmt.Sprintf(`{"order_id":%q,"seq":%d}`, agg, seq)))
	}
	prod = append([]ferry.Event(nil), sh...)
	if clean {
		return prod, sh, compareCounts{Production: n, Shadow: n}
	}
	prod[5], prod[6] = prod[6], prod[5]                                     // o-1 seq 1 and 2: reordered 1
	prod[10].Payload = []byte(`{"order_id":"o-2","seq":1,"total":"wrong"}`) // differing 1
	var kept []ferry.Event
	for i, e := range prod {
		if i != 2 && i != 7 && i != 13 { // missing 3
			kept = append(kept, e)
		}
	}
	kept = append(kept, ev("o-rb", 1, `{}`), ev("o-rb", 2, `{}`)) // extra 2
	return kept, sh, compareCounts{Production: n - 3 + 2, Shadow: n, Missing: 3, Extra: 2, Reordered: 1, Differing: 1}
}

func publishEach(t *testing.T, ctx context.Context, pub broker.Publisher, evs []ferry.Event) {
	t.Helper()
	for _, e := range evs { // one call each: stored in exactly this order
		if res := pub.Publish(ctx, []ferry.Event{e}); res[0].Err != nil {
			t.Fatalf("publish %s: %v", e.ID, res[0].Err)
		}
	}
}

// runCompareJSON runs ferry compare --json with args and returns the
// report's counts; exit 1 is expected exactly when the report is not clean.
func runCompareJSON(t *testing.T, args ...string) compareCounts {
	t.Helper()
	out, err := runFerry(t, append([]string{"compare", "--json"}, args...)...)
	var ec exitCodeError
	if err != nil && (!errors.As(err, &ec) || ec.code != 1) {
		t.Fatalf("ferry compare: %v\n%s", err, out)
	}
	var rep shadow.Report
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		t.Fatalf("report: %v\n%s", jerr, out)
	}
	got := compareCounts{rep.Production, rep.Shadow, len(rep.Missing), len(rep.Extra), len(rep.Reordered), len(rep.Differing), len(rep.KeyErrors)}
	clean := got == (compareCounts{Production: got.Production, Shadow: got.Shadow})
	if clean != (err == nil) {
		t.Errorf("report clean=%v but exit error %v", clean, err)
	}
	return got
}

// TestCompareKafka runs ferry compare --broker-url kafka://… on kfake:
// production (Ferry's Kafka publisher standing in for the old code) and
// shadow (shadow.Publisher, as ferry relay --shadow-subject-prefix) differ
// by the injected set and the report counts exactly it, exit 1; a clean
// pair reports 0 of everything, exit 0; the text report names the counts.
func TestCompareKafka(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "orders", "shadow.orders", "clean", "shadow.clean"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	url := "kafka://" + strings.Join(c.ListenAddrs(), ",")
	pub, err := kafka.NewPublisher(c.ListenAddrs())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sp, err := shadow.NewPublisher(pub, "shadow.")
	if err != nil {
		t.Fatal(err)
	}
	for _, clean := range []bool{false, true} {
		topic := map[bool]string{false: "orders", true: "clean"}[clean]
		prod, sh, want := compareEvents(t, topic, 20, clean)
		publishEach(t, ctx, pub, prod)
		publishEach(t, ctx, sp, sh)
		if got := runCompareJSON(t, "--broker-url", url, "--production-topic", topic, "--shadow-topic", "shadow."+topic); got != want {
			t.Errorf("clean=%v: report %+v, want %+v", clean, got, want)
		}
	}
	out, err := runFerry(t, "compare", "--broker-url", url, "--production-topic", "orders", "--shadow-topic", "shadow.orders")
	if err == nil {
		t.Fatalf("differences but exit 0:\n%s", out)
	}
	for _, line := range []string{"production 19 messages, shadow 20", "missing (lost by the old path)  3 ", "extra (old path only)           2 ",
		"reordered                       1 ", "differing                       1 "} {
		if !strings.Contains(out, line) {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}
	if _, err := runFerry(t, "compare", "--broker-url", url, "--production-topic", "nope", "--shadow-topic", "shadow.orders"); err == nil || !strings.Contains(err.Error(), "topic does not exist") {
		t.Errorf("missing topic: %v", err)
	}
}

// TestCompareRabbitMQ runs ferry compare --broker-url amqp://… on the real
// RabbitMQ: classic comparison queues bound to the production and the
// shadow routing keys; the report counts exactly the injected set (0 on a
// clean pair) and the queues still hold every message afterwards.
func TestCompareRabbitMQ(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sfx := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	exchange := "cmptest." + sfx
	top := rabbitmq.Topology{Exchange: exchange}
	if err := rabbitmq.EnsureTopology(ctx, url, top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), url, top) })
	pub, err := rabbitmq.NewPublisher(url, rabbitmq.WithExchange(exchange))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sp, _ := shadow.NewPublisher(pub, "shadow.")
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
	for _, clean := range []bool{false, true} {
		topic := fmt.Sprintf("orders.%v", clean)
		pq, sq := "cmp.prod."+sfx+"."+topic, "cmp.shadow."+sfx+"."+topic
		for q, key := range map[string]string{pq: topic, sq: "shadow." + topic} {
			if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), url, rabbitmq.Topology{Queue: q}) })
			if err := ch.QueueBind(q, key, exchange, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		prod, sh, want := compareEvents(t, topic, 20, clean)
		publishEach(t, ctx, pub, prod)
		publishEach(t, ctx, sp, sh)
		if got := runCompareJSON(t, "--broker-url", url, "--production-queue", pq, "--shadow-queue", sq); got != want {
			t.Errorf("clean=%v: report %+v, want %+v", clean, got, want)
		}
		for q, n := range map[string]int{pq: len(prod), sq: len(sh)} {
			var got int
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) { // requeue on close is asynchronous
				st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got = st.Messages; got == n || time.Now().After(deadline) {
					break
				}
			}
			if got != n {
				t.Errorf("queue %s holds %d messages after compare, want %d (compare must not consume)", q, got, n)
			}
		}
	}
}

// TestCompareFlags: bad input fails before connecting, naming the flag.
func TestCompareFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker-url", "kafka://127.0.0.1:1", "--production-topic", "a"}, "--shadow-topic is required with a kafka://"},
		{[]string{"--broker-url", "kafka://127.0.0.1:1", "--production-stream", "A", "--production-topic", "a", "--shadow-topic", "b"}, "--production-stream is not for a kafka:// broker"},
		{[]string{"--broker-url", "kafka://", "--production-topic", "a", "--shadow-topic", "b"}, "no broker address after kafka://"},
		{[]string{"--broker-url", "amqp://guest:secret@127.0.0.1:1/", "--production-topic", "a"}, "--production-topic is not for a amqp:// broker"},
		{[]string{"--broker-url", "amqp://guest:guest@127.0.0.1:1/", "--production-queue", "a"}, "--shadow-queue is required with a amqp://"},
		{[]string{"--broker-url", "nats://127.0.0.1:1", "--production-queue", "a"}, "--production-queue is not for a nats:// broker"},
		{[]string{"--production-stream", "A"}, "--shadow-stream is required with a nats://"},
		{[]string{"--broker-url", "redis://x", "--production-stream", "A"}, `--broker-url "redis://x": want nats://`},
		{[]string{"--broker-url", "nats://127.0.0.1:1", "--nats-url", "nats://127.0.0.1:2"}, "--nats-url and --broker-url both set"},
		{[]string{"--broker-url", "kafka://127.0.0.1:1", "--timeout", "0s"}, "--timeout"},
		{[]string{"--since", "yesterday"}, "--since"},
	} {
		out, err := runFerry(t, append([]string{"compare"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want %q\n%s", c.args, err, c.want, out)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%v: error shows the password: %v", c.args, err)
		}
	}
	// --timeout bounds a read from a broker that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan []net.Conn, 1)
	go func() {
		var conns []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				accepted <- conns
				return
			}
			conns = append(conns, c)
		}
	}()
	defer func() {
		_ = ln.Close()
		for _, c := range <-accepted {
			_ = c.Close()
		}
	}()
	start := time.Now()
	if _, err := runFerry(t, "compare", "--broker-url", "kafka://"+ln.Addr().String(), "--production-topic", "a", "--shadow-topic", "b", "--timeout", "1s"); err == nil ||
		!strings.Contains(err.Error(), "deadline exceeded") || time.Since(start) > 10*time.Second {
		t.Errorf("unreachable broker with --timeout 1s: %v after %s", err, time.Since(start))
	}
	// FERRY_BROKER_URL chooses the broker; an explicit --nats-url beats it.
	t.Setenv("FERRY_BROKER_URL", "kafka://127.0.0.1:1")
	if _, err := runFerry(t, "compare", "--production-stream", "A"); err == nil || !strings.Contains(err.Error(), "--production-stream is not for a kafka://") {
		t.Errorf("FERRY_BROKER_URL=kafka://…: %v", err)
	}
	if _, err := runFerry(t, "compare", "--nats-url", "nats://127.0.0.1:1", "--production-stream", "A"); err == nil || !strings.Contains(err.Error(), "--shadow-stream is required with a nats://") {
		t.Errorf("--nats-url with FERRY_BROKER_URL set: %v", err)
	}
}
