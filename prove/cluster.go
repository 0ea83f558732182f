package prove

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/internal/faultproxy"
)

// BrokerNATSCluster is the --broker value that makes prove run its own
// 3-node JetStream cluster (in process, loopback ports, one store dir per
// node) with every stream at 3 replicas.
const BrokerNATSCluster = "nats-cluster"

// clusterNodes is the cluster's size; streams are replicated to all.
const clusterNodes = 3

// natsCluster is the stack's cluster: the nodes, and one fault proxy per
// ordered pair of nodes carrying that pair's route connections, so that
// cutting a node off is a matter of its proxies alone.
type natsCluster struct {
	c       *natsembed.Cluster
	proxies map[[2]int]*faultproxy.Proxy // [from, to]
}

func startNATSCluster() (*natsCluster, error) {
	// Three tries on fresh ports and proxies: a node's port, found free,
	// may be taken by another process before the node binds it.
	var err error
	for range 3 {
		nc := &natsCluster{proxies: map[[2]int]*faultproxy.Proxy{}}
		var c *natsembed.Cluster
		if c, err = natsembed.StartCluster(clusterNodes, "ferry-prove", routeProxies(nc.proxies)); err == nil {
			nc.c = c
			return nc, nil
		}
		nc.closeProxies()
	}
	return nil, fmt.Errorf("prove: nats cluster: %w", err)
}

// routeProxies is the route dialer of prove's clusters: a fault proxy per
// ordered pair of nodes, recorded in proxies.
func routeProxies(proxies map[[2]int]*faultproxy.Proxy) natsembed.RouteDialer {
	return func(from, to int, addr string) (string, error) {
		p, err := faultproxy.New(addr)
		if err != nil {
			return "", err
		}
		proxies[[2]int{from, to}] = p
		return p.Addr(), nil
	}
}

// isolate cuts node off from every other node: its route connections are
// reset and new ones black-holed, in both directions. Clients still reach
// it on its client port (the minority side of a partition).
func (nc *natsCluster) isolate(node int) {
	for k, p := range nc.proxies {
		if k[0] == node || k[1] == node {
			p.Set(faultproxy.Blackhole)
			p.ResetAll()
		}
	}
}

// heal lets node's routes through again. Route dials accepted while black
// holed hang without ever reaching the node, so they are reset to make
// the nodes dial again.
func (nc *natsCluster) heal(node int) {
	for k, p := range nc.proxies {
		if k[0] == node || k[1] == node {
			p.Set(faultproxy.Pass)
			p.ResetAll()
		}
	}
}

// leaders counts the nodes that take themselves for the leader of stream
// (consumer "") or of one of its consumers: more than one while a cut-off
// leader has not stepped down yet, none during an election.
func (nc *natsCluster) leaders(stream, consumer string) int {
	n := 0
	for _, node := range nc.c.Nodes {
		if consumer == "" && node.IsStreamLeader(stream) || consumer != "" && node.IsConsumerLeader(stream, consumer) {
			n++
		}
	}
	return n
}

func (nc *natsCluster) closeProxies() { closeProxies(nc.proxies) }

func closeProxies(proxies map[[2]int]*faultproxy.Proxy) {
	for _, p := range proxies {
		_ = p.Close()
	}
}

func (nc *natsCluster) close() {
	if nc.c != nil {
		_ = nc.c.Close()
	}
	nc.closeProxies()
}

// createReplicated makes the scenario's stream with a replica on every
// node, and the consumer's durable (which inherits the replicas).
func (s *natsStream) createReplicated(ctx context.Context) error {
	nc, js, err := natsConnect(s.url, "ferry-prove-admin")
	if err != nil {
		return err
	}
	defer nc.Close()
	// After a fault the meta leader may still count a restarted or healed
	// node offline for a few seconds ("no suitable peers for placement"):
	// retry within a bound. Under CI's load (-race, other packages beside)
	// a fresh cluster once let every request of 20 s time out; the bound
	// is a minute, and the error keeps the attempts' count.
	deadline := time.Now().Add(time.Minute)
	for attempt := 1; ; attempt++ {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name: s.name, Subjects: []string{s.name + ".>"}, Storage: jetstream.FileStorage,
			Duplicates: 2 * time.Minute, Replicas: clusterNodes,
		})
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("prove: create replicated stream %s (%d attempts): %w", s.name, attempt, err)
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
	// Same durable config as create's; createReplayConsumer makes exactly it.
	return s.createReplayConsumer(ctx, "prove")
}

// clusterQueryTimeout bounds one stream info request of the cluster
// faults' waits: a request the stream's (absent) leader never answers
// waits for its context, and a caller's context may have no deadline
// (the soak's), which held a wait for a new leader for minutes.
const clusterQueryTimeout = 3 * time.Second

// streamLeader is the server name of the stream's current leader.
func streamLeader(ctx context.Context, url, stream string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, clusterQueryTimeout)
	defer cancel()
	nc, js, err := natsConnect(url, "ferry-prove-checker")
	if err != nil {
		return "", err
	}
	defer nc.Close()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return "", fmt.Errorf("prove: stream %s: %w", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return "", fmt.Errorf("prove: stream info: %w", err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", errors.New("prove: stream has no leader")
	}
	return info.Cluster.Leader, nil
}

// waitLeader polls until the stream has a leader other than not (""
// accepts any), within limit.
func waitLeader(ctx context.Context, url, stream, not string, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		// Each ask bounded: during an election a stream info request can
		// hang for the client's whole default timeout (5 s), which would
		// show a new leader seconds late.
		actx, cancel := context.WithTimeout(ctx, time.Second)
		l, err := streamLeader(actx, url, stream)
		cancel()
		if err == nil && l != not {
			return l, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("prove: no new stream leader within %s (last: %q, %v)", limit, l, err)
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// waitReplicasCurrent polls until the stream has a leader and every
// replica is online and current, so the checker reads a converged stream.
// The stream must also answer a full read (what the checker does) twice
// in a row: right after a heal a node may still answer 503 "JetStream
// system temporarily unavailable".
func waitReplicasCurrent(ctx context.Context, s *natsStream, limit time.Duration) error {
	url, stream := s.url, s.name
	deadline := time.Now().Add(limit)
	reads := 0
	for {
		ok, why := replicasCurrent(ctx, url, stream)
		if ok {
			rctx, cancel := context.WithTimeout(ctx, max(clusterQueryTimeout, time.Until(deadline)))
			_, err := s.readAll(rctx)
			cancel()
			if err != nil {
				ok, why, reads = false, err.Error(), 0
			} else if reads++; reads >= 2 {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("prove: stream %s replicas not current within %s: %s", stream, limit, why)
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

func replicasCurrent(ctx context.Context, url, stream string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, clusterQueryTimeout)
	defer cancel()
	nc, js, err := natsConnect(url, "ferry-prove-checker")
	if err != nil {
		return false, err.Error()
	}
	defer nc.Close()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return false, err.Error()
	}
	info, err := st.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return false, "no leader"
	}
	if len(info.Cluster.Replicas) != clusterNodes-1 {
		return false, fmt.Sprintf("%d followers", len(info.Cluster.Replicas))
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			return false, fmt.Sprintf("replica %s current=%v offline=%v lag=%d", r.Name, r.Current, r.Offline, r.Lag)
		}
	}
	return true, ""
}

// Cluster faults (scenario.clusterFault).
const (
	clusterLeaderKill    = "leader-kill"
	clusterPartition     = "partition"
	clusterLeaderSigkill = "leader-sigkill" // on a cluster of node processes (nodeproc_linux.go)
)

// clusterFaultHold is how long the fault lasts before the node is
// restarted or the partition healed.
const clusterFaultHold = 2 * time.Second

// clusterConverge bounds how long a cluster fault waits, after the node is
// back, for every replica of the stream to be current again. A restarted
// or healed replica catches up by replaying what it missed; on a loaded
// 2-core CI machine one was still 16 messages behind after 20 s (twice,
// in soak runs beside the full -race suite), so the limit is generous:
// it only delays the next fault, it does not hide a replica that never
// catches up.
const clusterConverge = 60 * time.Second

// runClusterFault injects the scenario's cluster fault against the
// current leader of the scenario's stream while the producers commit and
// the relay publishes: leader-kill shuts the leader's server down (no
// graceful leadership transfer: clients see their connection drop) and
// restarts it on the same ports and store; partition cuts the leader's
// routes to both other nodes (it keeps its clients) and heals them. It
// returns what happened, for the report, and an error when the fault
// could not be placed or the cluster did not recover.
func runClusterFault(ctx context.Context, e *env, kind string) (string, error) {
	if kind == clusterLeaderSigkill {
		s, ok := e.tr.(*natsStream)
		if e.st.procs == nil || !ok {
			return "", errors.New("prove: leader SIGKILL without a cluster of node processes")
		}
		return runLeaderSigkill(ctx, e.st.procs, s, &e.faults)
	}
	nc := e.st.cluster
	s, ok := e.tr.(*natsStream)
	if nc == nil || !ok {
		return "", errors.New("prove: cluster fault without a nats cluster")
	}
	old, err := waitLeader(ctx, s.url, s.name, "", 10*time.Second)
	if err != nil {
		return "", err
	}
	node := nc.c.NodeByName(old)
	if node < 0 {
		return "", fmt.Errorf("prove: leader %q is not a node of the cluster", old)
	}
	e.faults.Add(1)
	switch kind {
	case clusterLeaderKill:
		nc.c.Nodes[node].Shutdown()
		newLeader, lerr := waitLeader(ctx, s.url, s.name, old, 15*time.Second)
		sleepCtx(ctx, clusterFaultHold)
		if err := nc.c.Nodes[node].Restart(); err != nil {
			return "", fmt.Errorf("prove: restart %s: %w", old, err)
		}
		if lerr != nil {
			return "", lerr
		}
		if err := nc.c.WaitReady(20 * time.Second); err != nil {
			return "", err
		}
		if err := waitReplicasCurrent(ctx, s, clusterConverge); err != nil {
			return "", err
		}
		return fmt.Sprintf("stream leader %s shut down, %s took over, %s restarted", old, newLeader, old), nil
	case clusterPartition:
		nc.isolate(node)
		// Ask the majority side: the cut-off node keeps answering stream
		// info with itself as leader until it notices it lost quorum, and
		// a client given every node's URL may well be connected to it.
		majority := nc.c.Nodes[(node+1)%clusterNodes].ClientURL()
		newLeader, lerr := waitLeader(ctx, majority, s.name, old, 15*time.Second)
		sleepCtx(ctx, clusterFaultHold)
		nc.heal(node)
		if lerr != nil {
			return "", lerr
		}
		if err := nc.c.WaitReady(20 * time.Second); err != nil {
			return "", err
		}
		if err := waitReplicasCurrent(ctx, s, clusterConverge); err != nil {
			return "", err
		}
		return fmt.Sprintf("stream leader %s cut off from the other nodes, %s took over, partition healed", old, newLeader), nil
	}
	return "", fmt.Errorf("prove: unknown cluster fault %q", kind)
}

func needsNATSCluster(st *stack, _ *config) string {
	if st.cluster == nil {
		return "needs the in-process NATS cluster (--broker " + BrokerNATSCluster + ")"
	}
	return ""
}

// clusterFaultBit checks the cluster fault fired during the run.
func clusterFaultBit(e *env, f *Figures, _ *truth) []string {
	if f.FaultsInjected != 1 {
		return []string{fmt.Sprintf("%d cluster faults fired, want 1", f.FaultsInjected)}
	}
	return nil
}
