package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

const testSource = "ferry://orders-service"

func TestRelaySourceFlagValidation(t *testing.T) {
	for _, bad := range []string{"", "ferry://orders service", "%zz", "ferry://x\n", "http://[::1"} {
		_, err := runCLI(t, "relay", "--source", bad, "--database-url", "sqlite:"+filepath.Join(t.TempDir(), "x.db"))
		if err == nil || !strings.Contains(err.Error(), "--source") {
			t.Errorf("--source %q: err = %v, want a refusal naming --source", bad, err)
		}
	}
	for _, good := range []string{testSource, "/orders", "urn:ferry:orders", "https://example.com/orders#x"} {
		if err := checkSource(good); err != nil {
			t.Errorf("--source %q refused: %v", good, err)
		}
	}
}

// relayPG is a migrated Postgres schema and a writer into its outbox.
type relayPG struct {
	url    string
	schema *testenv.PostgresSchema
	w      *outbox.Writer[pgx.Tx]
}

func newRelayPG(t *testing.T) *relayPG {
	t.Helper()
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv, outbox.WithShardCount(4))
	if err != nil {
		t.Fatal(err)
	}
	return &relayPG{url: s.URL, schema: s, w: w}
}

// insert writes n events of aggregate type typ (topic "<typ>.events").
func (p *relayPG) insert(t *testing.T, typ string, n int) {
	t.Helper()
	for i := range n {
		if _, err := p.w.Insert(context.Background(), ferry.Event{TenantID: "acme", AggregateType: typ, AggregateID: fmt.Sprintf("a-%d", i%5),
			EventType: typ + ".changed", SchemaVersion: 1, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
}

func (p *relayPG) count(t *testing.T, status string) int {
	t.Helper()
	var n int
	if err := p.schema.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ferry_outbox WHERE status = $1`, status).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// startRelayCLI runs `ferry relay args…` in-process; stop cancels it and
// returns its combined output (JSON log lines) and error.
func startRelayCLI(t *testing.T, args ...string) (stop func() (string, error)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runCLIContext(ctx, append([]string{"relay", "--listen", "", "--shards", "4", "--poll-interval", "50ms"}, args...)...)
		done <- result{out, err}
	}()
	var res *result
	stop = func() (string, error) {
		if res == nil {
			cancel()
			r := <-done
			res = &r
		}
		return res.out, res.err
	}
	t.Cleanup(func() { _, _ = stop() })
	return stop
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logLines parses the relay's output: every line must be a JSON log
// record (no plain text between them).
func logLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("output line is not a JSON log record: %q", l)
			continue
		}
		recs = append(recs, m)
	}
	return recs
}

func findLogs(recs []map[string]any, msg string) []map[string]any {
	var out []map[string]any
	for _, r := range recs {
		if s, _ := r["msg"].(string); strings.HasPrefix(s, msg) {
			out = append(out, r)
		}
	}
	return out
}

// TestRelayKafkaCLI: `ferry relay` against kfake with --source. Unsent rows
// route to order.events (in --topics, exists) and payment.events (missing):
// the relay starts, warns with the exact missing list as a structured log
// record, holds the payment rows (none dead) and publishes them once the
// topic is created; every record carries the --source; durability
// shortfalls and the settings kfake does not report are structured
// warnings, and stderr holds only JSON lines.
func TestRelayKafkaCLI(t *testing.T) {
	p := newRelayPG(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "order.events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	p.insert(t, "order", 20)
	p.insert(t, "payment", 10)

	// A missing --topics topic is refused, naming it and the hint once.
	_, err = runCLI(t, "relay", "--listen", "", "--database-url", p.url, "--broker-url", "kafka://"+strings.Join(c.ListenAddrs(), ","),
		"--topics", "order.events,no.such.topic")
	if err == nil || !strings.Contains(err.Error(), "[no.such.topic]") || strings.Count(err.Error(), "--provision") != 1 {
		t.Fatalf("missing --topics topic: %v, want a refusal naming it with the --provision hint once", err)
	}

	stop := startRelayCLI(t, "--database-url", p.url, "--broker-url", "kafka://"+strings.Join(c.ListenAddrs(), ","),
		"--topics", "order.events", "--source", testSource, "--max-attempts", "2", "--backoff-base", "50ms")
	waitUntil(t, 30*time.Second, "order events sent", func() bool { return p.count(t, "sent") == 20 })
	time.Sleep(2 * time.Second) // several retry rounds of the payment rows
	if d := p.count(t, "dead"); d != 0 {
		t.Fatalf("%d rows dead while payment.events was missing", d)
	}
	if n := p.count(t, "pending"); n != 10 {
		t.Fatalf("%d payment rows pending, want 10 held", n)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := kafka.EnsureTopics(context.Background(), kadm.NewClient(cl), []string{"payment.events"}, 4, 1); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "payment events sent after the topic exists", func() bool { return p.count(t, "sent") == 30 })
	out, err := stop()
	if err != nil {
		t.Fatalf("relay: %v\n%s", err, out)
	}
	if d := p.count(t, "dead"); d != 0 {
		t.Fatalf("%d rows dead", d)
	}

	recs := logLines(t, out)
	miss := findLogs(recs, "unsent events route to destinations the broker does not have")
	if len(miss) != 1 || fmt.Sprint(miss[0]["missing"]) != "[payment.events]" || miss[0]["alert"] != "destination_missing" {
		t.Fatalf("start-up missing-destination warning: %v\n%s", miss, out)
	}
	if len(findLogs(recs, "destination missing on the broker")) == 0 {
		t.Errorf("no held-rows warning while payment.events was missing:\n%s", out)
	}
	dur := findLogs(recs, "destination durability")
	if len(dur) == 0 || dur[0]["topic"] != "order.events" || dur[0]["level"] != "WARN" {
		t.Errorf("durability warnings (replication 1) not logged as structured warnings: %v", dur)
	}
	unread := findLogs(recs, "destination setting could not be read")
	for _, r := range unread {
		t.Logf("kfake: %v %v not reported", r["topic"], r["setting"])
	}
	// kfake does not report unclean.leader.election.enable: say so.
	if !slices.ContainsFunc(unread, func(r map[string]any) bool { return r["setting"] == "unclean.leader.election.enable" }) {
		t.Errorf("no warning that kfake's unclean.leader.election.enable could not be read: %v", unread)
	}

	// Every record carries --source.
	rc, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("order.events", "payment.events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seen := 0
	for seen < 30 {
		fs := rc.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of 30 records", seen)
		}
		fs.EachRecord(func(r *kgo.Record) {
			seen++
			i := slices.IndexFunc(r.Headers, func(h kgo.RecordHeader) bool { return h.Key == "ce_source" })
			if i < 0 || string(r.Headers[i].Value) != testSource {
				t.Errorf("record on %s: ce_source %v, want %s", r.Topic, r.Headers, testSource)
			}
		})
	}
}

// TestRelaySourceNATSAndRabbitMQ: --source reaches the JetStream and AMQP
// publishers too.
func TestRelaySourceNATSAndRabbitMQ(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		p := newRelayPG(t)
		p.insert(t, "order", 5)
		dir := filepath.Join(t.TempDir(), "nats")
		stop := startRelayCLI(t, "--database-url", p.url, "--broker-url", "embedded", "--embedded-dir", dir,
			"--subjects", "order.events", "--provision", "--source", testSource)
		waitUntil(t, 30*time.Second, "events sent", func() bool { return p.count(t, "sent") == 5 })
		out, err := stop()
		if err != nil {
			t.Fatalf("relay: %v\n%s", err, out)
		}
		recs := logLines(t, out)
		if len(findLogs(recs, "destination durability")) == 0 {
			t.Errorf("no structured durability warning for the embedded server (R1, 2m fsync):\n%s", out)
		}
		emb, err := natsembed.Start(natsembed.WithStoreDir(dir))
		if err != nil {
			t.Fatal(err)
		}
		defer emb.Close()
		nc, err := natsjs.Connect(emb.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, "FERRY")
		if err != nil {
			t.Fatal(err)
		}
		for seq := uint64(1); seq <= 5; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Header.Get("ce-source"); got != testSource {
				t.Errorf("message %d: ce-source %q, want %s", seq, got, testSource)
			}
		}
	})
	t.Run("rabbitmq", func(t *testing.T) {
		amqpURL := testenv.RabbitMQURL(t)
		p := newRelayPG(t)
		p.insert(t, "order", 5)
		suffix := fmt.Sprint(time.Now().UnixNano())
		top := rabbitmq.Topology{Exchange: "ferry-clitest-ex-" + suffix, Queue: "ferry-clitest-q-" + suffix}
		t.Cleanup(func() { _ = rabbitmq.DeleteTopology(context.Background(), amqpURL, top) })
		stop := startRelayCLI(t, "--database-url", p.url, "--broker-url", amqpURL, "--exchange", top.Exchange,
			"--queue", top.Queue, "--provision", "--source", testSource)
		waitUntil(t, 30*time.Second, "events sent", func() bool { return p.count(t, "sent") == 5 })
		out, err := stop()
		if err != nil {
			t.Fatalf("relay: %v\n%s", err, out)
		}
		if len(findLogs(logLines(t, out), "destination setting could not be read")) == 0 {
			t.Errorf("no structured warning that the quorum replica count cannot be read:\n%s", out)
		}
		c, err := rabbitmq.NewConsumer(amqpURL, top.Queue)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		got := make(chan string, 5)
		go func() {
			_ = c.Consume(ctx, func(ctx context.Context, d *broker.Delivery) {
				got <- d.Raw.Headers["cloudEvents:source"]
				_ = d.Ack(ctx)
			})
		}()
		for i := range 5 {
			select {
			case s := <-got:
				if s != testSource {
					t.Errorf("message %d: cloudEvents:source %q, want %s", i, s, testSource)
				}
			case <-ctx.Done():
				t.Fatalf("received %d of 5 messages", i)
			}
		}
		cancel()
	})
}
