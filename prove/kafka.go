package prove

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/internal/faultproxy"
)

// kafkaTransport is one scenario's topic on a Kafka cluster (real, or
// franz-go's in-process kfake for kafka://kfake), through Ferry's
// broker/kafka adapter. Events of an aggregate share a partition (key =
// aggregate key), so per-aggregate order holds across 4 partitions.
type kafkaTransport struct {
	seeds    []string
	replicas int16 // the topic's replication factor
	topic    string
	// dynamic: consume as a dynamic group member (no instance id), the
	// slow handover after a crash (tests of the settle logic).
	dynamic bool
	// proxied: the brokers sit behind prove's fault proxy (kfake), so the
	// outage scenario can run.
	proxied bool
}

var _ transport = (*kafkaTransport)(nil)

const kafkaPartitions = 4

func splitSeeds(s string) []string {
	s = strings.TrimPrefix(s, "kafka://")
	return strings.Split(s, ",")
}

// kfakeBrokers is the number of brokers of prove's kfake cluster: enough
// for a partition leader to move to another broker, or a broker to go
// away while the others carry on (kafka-leader-move, kafka-broker-down).
const kfakeBrokers = 3

// kfakeStack is prove's in-process kfake cluster and the fault proxy in
// front of each of its brokers.
type kfakeStack struct {
	c *kfake.Cluster
	// nodes: node id -> its proxy and the loopback address of the
	// broker's own listener (the proxy's target).
	nodes map[int32]kfakeNode
}

type kfakeNode struct {
	proxy  *faultproxy.Proxy
	listen string
}

// startKfake starts an in-process kfake cluster of kfakeBrokers brokers,
// each behind a fault proxy of its own: a broker listens on a loopback
// port but advertises its proxy's address (kfake advertises its
// listener's address, and prove supplies that listener), so every client
// — seed connection and metadata-learned broker connection alike — goes
// through the proxies, and a fault can black-hole, reset or take away a
// broker for everyone. The proxies pass traffic through otherwise.
func startKfake() (*kfakeStack, error) {
	ks := &kfakeStack{nodes: map[int32]kfakeNode{}}
	byListen := map[string]*faultproxy.Proxy{} // a node added back on its old port keeps its proxy
	var created []kfakeNode                    // in creation order: node ids 0, 1, 2
	listen := func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		p := byListen[ln.Addr().String()]
		if p == nil {
			if p, err = faultproxy.New(ln.Addr().String()); err != nil {
				_ = ln.Close()
				return nil, err
			}
			byListen[ln.Addr().String()] = p
			created = append(created, kfakeNode{proxy: p, listen: ln.Addr().String()})
		}
		addr, err := net.ResolveTCPAddr("tcp", p.Addr())
		if err != nil {
			_ = ln.Close()
			return nil, err
		}
		return advertisedListener{Listener: ln, addr: addr}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(kfakeBrokers), kfake.DefaultNumPartitions(kafkaPartitions), kfake.ListenFn(listen))
	for i, n := range created {
		ks.nodes[int32(i)] = n
	}
	if err != nil {
		ks.closeProxies()
		return nil, fmt.Errorf("prove: kfake: %w", err)
	}
	ks.c = c
	return ks, nil
}

// Set switches every broker's proxy to m (the outage takes the whole
// cluster away).
func (ks *kfakeStack) Set(m faultproxy.Mode) {
	for _, n := range ks.nodes {
		n.proxy.Set(m)
	}
}

// ResetAll aborts every connection to every broker.
func (ks *kfakeStack) ResetAll() {
	for _, n := range ks.nodes {
		n.proxy.ResetAll()
	}
}

func (ks *kfakeStack) closeProxies() {
	for _, n := range ks.nodes {
		_ = n.proxy.Close()
	}
}

func (ks *kfakeStack) close() {
	if ks.c != nil {
		ks.c.Close()
	}
	ks.closeProxies()
}

// advertisedListener accepts on its own address and reports addr (the
// fault proxy in front of it), which kfake advertises in metadata.
type advertisedListener struct {
	net.Listener
	addr net.Addr
}

func (l advertisedListener) Addr() net.Addr { return l.addr }

func newKafkaTransport(ctx context.Context, seeds []string, replicas int16, scenario string) (*kafkaTransport, error) {
	t := &kafkaTransport{seeds: seeds, replicas: replicas, topic: "prove-" + scenario + "-" + randHex(4)}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return nil, fmt.Errorf("prove: kafka client: %w", err)
	}
	defer cl.Close()
	// A fresh name: create it directly (listing a missing topic first makes
	// the client wait out its metadata retries).
	resps, err := kadm.NewClient(cl).CreateTopics(ctx, kafkaPartitions, replicas, nil, t.topic)
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("prove: kafka topic: %w", err)
	}
	return t, nil
}

func (t *kafkaTransport) kind() string { return "kafka" }

func (t *kafkaTransport) publisher(context.Context, string) (broker.Publisher, error) {
	p, err := kafka.NewPublisher(t.seeds, kafka.WithSource("ferry-prove"), kafka.WithDeliveryTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("prove: kafka publisher: %w", err)
	}
	return p, nil
}

// consumer: a static group member (one instance id per group: prove runs
// one consumer of a group at a time, and a restarted one — after a crash or
// a SIGKILL — takes the dead one's partitions back at once instead of
// waiting for its session to expire), with kfake's shortest session.
func (t *kafkaTransport) consumer(_ context.Context, group string) (broker.Consumer, error) {
	name := t.topic + "-" + group
	opts := []kafka.Option{kafka.WithCommitInterval(50 * time.Millisecond),
		kafka.WithSessionTimeout(6 * time.Second), kafka.WithHeartbeatInterval(500 * time.Millisecond),
		kafka.WithRebalanceTimeout(10 * time.Second), kafka.WithKgoOpts(kgo.FetchMaxWait(100 * time.Millisecond))}
	if !t.dynamic {
		opts = append(opts, kafka.WithInstanceID(name+"-0"))
	}
	c, err := kafka.NewConsumer(t.seeds, name, []string{t.topic}, opts...)
	if err != nil {
		return nil, fmt.Errorf("prove: kafka consumer: %w", err)
	}
	return c, nil
}

// readAll reads the topic from the start of every partition to its end
// offset at the time of the call, without a group.
func (t *kafkaTransport) readAll(ctx context.Context) ([]streamMsg, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.seeds...), kgo.ConsumeTopics(t.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("prove: kafka reader: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, t.topic)
	if err != nil {
		return nil, fmt.Errorf("prove: kafka end offsets: %w", err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []streamMsg
	got := map[int32]int64{}
	done := func() bool {
		for p, end := range want {
			if got[p] < end {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("prove: kafka reader: topic %s not read to its end in time", t.topic)
		}
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= want[r.Partition] {
				return
			}
			got[r.Partition] = r.Offset + 1
			h := map[string]string{}
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			out = append(out, streamMsg{EventID: h["ce_id"], Headers: h, Body: r.Value, key: string(r.Key), partition: r.Partition, offset: r.Offset})
		})
	}
	return out, nil
}

func (t *kafkaTransport) forge(ctx context.Context, headers map[string]string, body []byte, _ string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.seeds...))
	if err != nil {
		return fmt.Errorf("prove: kafka forger: %w", err)
	}
	defer cl.Close()
	r := &kgo.Record{Topic: t.topic, Value: body, Key: []byte(headers["ce_partitionkey"])}
	for k, v := range headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		return fmt.Errorf("prove: kafka forge: %w", err)
	}
	return nil
}

// replay: a new group starts at the beginning of every partition.
func (t *kafkaTransport) replay(context.Context, string) error { return nil }

func (t *kafkaTransport) drained(ctx context.Context, group string) (bool, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.seeds...))
	if err != nil {
		return false, fmt.Errorf("prove: kafka admin: %w", err)
	}
	defer cl.Close()
	lags, err := kadm.NewClient(cl).Lag(ctx, t.topic+"-"+group)
	if err != nil {
		return false, fmt.Errorf("prove: kafka lag: %w", err)
	}
	l, ok := lags[t.topic+"-"+group]
	if !ok || l.Error() != nil {
		return false, nil
	}
	members := l.Lag.Sorted()
	if len(members) == 0 {
		return false, nil
	}
	for _, ml := range members {
		if ml.Err != nil || ml.Lag != 0 || (ml.End.Offset > 0 && ml.Commit.At < ml.End.Offset) {
			return false, nil
		}
	}
	return true, nil
}

// owed: the records at or after the group's committed offset of their
// partition (the consumer commits only the prefix it acked, so these are
// what a consumer of the group will be handed, again or for the first
// time); every record of a partition the group never committed.
func (t *kafkaTransport) owed(ctx context.Context, group string, msgs []streamMsg) (owedSet, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.seeds...))
	if err != nil {
		return owedSet{}, fmt.Errorf("prove: kafka admin: %w", err)
	}
	defer cl.Close()
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, t.topic+"-"+group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		err = nil // the group never joined: nothing committed, everything owed
	}
	if err != nil {
		return owedSet{}, fmt.Errorf("prove: kafka committed offsets: %w", err)
	}
	ids := map[string]bool{}
	for _, m := range msgs {
		at := int64(0)
		if o, ok := offs.Lookup(t.topic, m.partition); ok && o.Err == nil && o.At > 0 {
			at = o.At
		}
		if m.EventID != "" && m.offset >= at {
			ids[m.EventID] = true
		}
	}
	return owedSet{ids: ids}, nil
}

// endpoint: Kafka clients learn broker addresses from metadata, so a
// single proxy cannot stand in front of a cluster; for kfake the stack's
// own proxy stands in front of the broker's advertised address.
func (t *kafkaTransport) endpoint() string { return "" }

func (t *kafkaTransport) job() transportJob {
	return transportJob{Kind: "kafka", URL: strings.Join(t.seeds, ","), Topic: t.topic, KafkaDynamic: t.dynamic}
}

func (t *kafkaTransport) unsupported(sc *scenario) string {
	if sc.outage && !t.proxied {
		return "the brokers of a real Kafka cluster advertise their own addresses, so clients bypass a TCP proxy; the outage runs on kafka://kfake, where prove's proxy is the advertised address"
	}
	return ""
}

func (t *kafkaTransport) destroy(ctx context.Context) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.seeds...))
	if err != nil {
		return
	}
	defer cl.Close()
	_, _ = kadm.NewClient(cl).DeleteTopics(ctx, t.topic)
}
