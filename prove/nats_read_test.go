package prove

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// readTestCluster starts prove's 3-node cluster with one R3 stream for the
// read tests, both closed at the test's end (4 minutes at most).
func readTestCluster(t *testing.T, stream string) (*natsCluster, *natsStream, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a 3-node JetStream cluster")
	}
	nc, err := startNATSCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.close)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute) // a loaded CI: see the heal wait
	t.Cleanup(cancel)
	s := &natsStream{url: nc.c.ClientURL(), name: stream, ackWait: 5 * time.Second}
	if err := s.createReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	return nc, s, ctx
}

// healWait bounds how long the read tests wait, after a heal, for the
// healed node to answer as the cluster's leader says. Two minutes: under
// CI's -race beside the other packages on a slower machine, a healed
// 3-node cluster still timed out every request 60 s after the heal (CI 22
// for consumer info, the next CI for a stream read: 27 transient failures
// in 60 s).
const healWait = 2 * time.Minute

// TestReadAllThroughTheLeader: the checker's read of a replicated stream
// is the leader's stream or an error, never a stale view. The stream
// leader is cut off while the majority stores more messages, then healed,
// and the stream is read over and over through that node alone. A read
// during the cut must fail as transient; every read after the heal that
// succeeds must hold every message, in sequence order. The control: the
// same read without the nodes' word on who leads returns the cut-off
// node's stale messages and no error. (CI once judged every event of
// nats-partition "held by no copy"; a read after the heal bounded only by
// what the servers answered returned 41 of 100 in another CI run.)
func TestReadAllThroughTheLeader(t *testing.T) {
	nc, s, ctx := readTestCluster(t, "PROVE_READ")
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			id := fmt.Sprintf("ev-%03d", i)
			// Each try bounded (msg-id dedup absorbs a retry of one that
			// was stored): a publish the stream cannot take yet waits for
			// its context. (One CI-suite run of this test spent nearly its
			// whole 2 minutes before the heal; which step is not known.)
			if err := retryUnavailable(ctx, func() error {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				return rawPublish(pctx, s.url, s.name+".order", map[string]string{"ce-id": id}, []byte(id), id)
			}); err != nil {
				t.Fatalf("publish %s: %v", id, err)
			}
		}
	}
	const before, during = 40, 60
	publish(0, before)
	leader, err := waitLeader(ctx, s.url, s.name, "", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	node := nc.c.NodeByName(leader)
	// The read goes through the cut-off node alone: only the nodes' own
	// word on who leads (leaders, as the cluster stack sets it) can tell
	// its answers are stale.
	viaCut := &natsStream{url: nc.c.Nodes[node].ClientURL(), name: s.name, leaders: nc.leaders}
	read := func() ([]streamMsg, error) { return viaCut.readAllOnce(ctx) }

	nc.isolate(node)
	majority := nc.c.Nodes[(node+1)%clusterNodes].ClientURL()
	if _, err := waitLeader(ctx, majority, s.name, leader, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	s.url = majority
	cutAt := time.Now()
	publish(before, before+during)
	t.Logf("cut off %s; the majority stored %d messages in %v", leader, during, time.Since(cutAt).Round(time.Millisecond))
	want := before + during
	// Control: the same read without the nodes' word returns the cut-off
	// node's stale stream and no error, while that node still takes
	// itself for the leader (it does for up to ~10 s after the cut).
	blind := &natsStream{url: viaCut.url, name: s.name}
	claims := func() bool { return nc.c.Nodes[node].IsStreamLeader(s.name) }
	if c1 := claims(); c1 {
		got, err := blind.readAllOnce(ctx)
		switch {
		case !claims():
			t.Log("control: the cut-off node stepped down during the read")
		case brokerUnavailable(err):
			// The cut-off node noticed mid-walk (CI 16: 503 at sequence
			// 32 while it still took itself for the leader): no stale
			// answer to show this time.
			t.Logf("control: the cut-off node answered the read without the leader check with a transient error (%v)", err)
		case err != nil:
			t.Errorf("control: the read without the leader check failed (%v), want the cut-off node's stale messages", err)
		case len(got) >= want:
			t.Errorf("control: the read without the leader check returned %d messages, want fewer than %d", len(got), want)
		default:
			t.Logf("control: without the leader check the read returned %d of %d messages and no error", len(got), want)
		}
	} else {
		t.Log("control: the cut-off node had stepped down before it could be read")
	}
	if got, err := read(); err == nil {
		t.Errorf("read through the cut-off node: %d messages and no error, want a transient error", len(got))
	} else if !brokerUnavailable(err) {
		t.Errorf("read through the cut-off node: %v, want a transient error", err)
	}

	nc.heal(node)
	reads, fails := 0, 0
	var lastErr error
	// Reads until 20 have succeeded, within healWait: a healed node's
	// routes come back with a redial backoff, and the old leader steps
	// down only once it hears of the new term.
	healed := time.Now()
	var first time.Duration
	for end := healed.Add(healWait); reads < 20 && time.Now().Before(end); {
		got, err := read()
		if err != nil {
			if !brokerUnavailable(err) {
				t.Fatalf("read after the heal: %v", err)
			}
			fails++
			lastErr = err
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		if reads++; reads == 1 {
			first = time.Since(healed)
		}
		if len(got) != want {
			t.Fatalf("read %d after the heal: %d messages, want %d (the leader holds them all)", reads, len(got), want)
		}
		for i, m := range got {
			if m.offset != int64(i+1) || m.EventID != fmt.Sprintf("ev-%03d", i) {
				t.Fatalf("read %d: message %d is sequence %d id %q", reads, i, m.offset, m.EventID)
			}
		}
	}
	if reads == 0 {
		t.Fatalf("no read succeeded within %v of the heal (%d transient failures, the last: %v)", healWait, fails, lastErr)
	}
	t.Logf("%d full reads after the heal, the first after %v and %d transient failures", reads, first.Round(time.Millisecond), fails)
}

// TestConsumerInfoThroughTheLeader: owed and drained read a consumer's
// info only while exactly one node takes itself for the consumer's
// leader. The consumer's leader is cut off while the majority stores and
// acknowledges more messages; through that node the info is a transient
// error during the cut and the majority's after the heal. The control:
// the same info without the nodes' word answers with the cut-off node's
// ack floor, short of what the majority acknowledged, and no error.
func TestConsumerInfoThroughTheLeader(t *testing.T) {
	nc, s, ctx := readTestCluster(t, "PROVE_CINFO")
	const durable = "checked"
	if err := s.createReplayConsumer(ctx, durable); err != nil {
		t.Fatal(err)
	}
	// publishAndAck publishes n messages through url and acknowledges
	// them all through durable.
	publishAndAck := func(url string, from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			id := fmt.Sprintf("ev-%03d", i)
			if err := retryUnavailable(ctx, func() error {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				return rawPublish(pctx, url, s.name+".order", map[string]string{"ce-id": id}, []byte(id), id)
			}); err != nil {
				t.Fatalf("publish %s: %v", id, err)
			}
		}
		conn, js, err := natsConnect(url, "test-acker")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for acked := 0; acked < n; {
			if ctx.Err() != nil {
				t.Fatalf("acknowledged %d of %d", acked, n)
			}
			c, err := js.Consumer(ctx, s.name, durable)
			if err != nil {
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			b, err := c.Fetch(n-acked, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				continue
			}
			for m := range b.Messages() {
				if m.DoubleAck(ctx) == nil {
					acked++
				}
			}
		}
	}
	const before, during = 40, 60
	publishAndAck(s.url, 0, before)
	node := -1
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); !cond(); sleepCtx(ctx, 50*time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no %s within 30 s", what)
			}
		}
	}
	waitFor("consumer leader", func() bool {
		for i, n := range nc.c.Nodes {
			if n.IsConsumerLeader(s.name, durable) {
				node = i
			}
		}
		return node >= 0
	})
	viaCut := &natsStream{url: nc.c.Nodes[node].ClientURL(), name: s.name, leaders: nc.leaders}
	blind := &natsStream{url: viaCut.url, name: s.name}

	nc.isolate(node)
	majority := nc.c.Nodes[(node+1)%clusterNodes].ClientURL()
	waitFor("consumer leader in the majority", func() bool {
		return nc.c.Nodes[(node+1)%clusterNodes].IsConsumerLeader(s.name, durable) ||
			nc.c.Nodes[(node+2)%clusterNodes].IsConsumerLeader(s.name, durable)
	})
	publishAndAck(majority, before, during)
	want := uint64(before + during)
	if nc.c.Nodes[node].IsConsumerLeader(s.name, durable) {
		info, err := blind.consumerInfo(ctx, durable)
		switch {
		case !nc.c.Nodes[node].IsConsumerLeader(s.name, durable):
			t.Log("control: the cut-off node stepped down during the read")
		case brokerUnavailable(err):
			t.Logf("control: the cut-off node answered with a transient error (%v)", err)
		case err != nil:
			t.Errorf("control: consumer info without the leader check failed (%v), want the cut-off node's stale state", err)
		case info.AckFloor.Stream >= want:
			t.Errorf("control: consumer info without the leader check says ack floor %d, want short of %d", info.AckFloor.Stream, want)
		default:
			t.Logf("control: without the leader check the cut-off node said ack floor %d of %d, and no error", info.AckFloor.Stream, want)
		}
	} else {
		t.Log("control: the cut-off node had stepped down before it could be asked")
	}
	if info, err := viaCut.consumerInfo(ctx, durable); err == nil {
		t.Errorf("consumer info through the cut-off node: ack floor %d and no error, want a transient error", info.AckFloor.Stream)
	} else if !brokerUnavailable(err) {
		t.Errorf("consumer info through the cut-off node: %v, want a transient error", err)
	}

	nc.heal(node)
	healed := time.Now()
	for {
		info, err := viaCut.consumerInfo(ctx, durable)
		if err == nil {
			if info.AckFloor.Stream != want {
				t.Fatalf("consumer info after the heal: ack floor %d, want %d", info.AckFloor.Stream, want)
			}
			t.Logf("the majority's consumer state %v after the heal", time.Since(healed).Round(time.Millisecond))
			break
		}
		if !brokerUnavailable(err) {
			t.Fatalf("consumer info after the heal: %v", err)
		}
		if time.Since(healed) > healWait {
			t.Fatalf("no consumer info within %v of the heal: %v", healWait, err)
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	if done, err := viaCut.drained(ctx, durable); err != nil || !done {
		t.Errorf("drained after the heal: %v %v, want true", done, err)
	}
}
