//go:build linux

package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/internal/faultproxy"
)

// procCluster is prove's 3-node JetStream cluster with every node a
// process of its own — this program re-executed as a prove worker (role
// "nats-node", natsembed.RunNode), so the nodes run the same nats-server
// as the in-process cluster with the same configuration
// (natsembed.PlanCluster) — and the route fault proxies in this process.
// nats-leader-sigkill runs on it: a node can be SIGKILLed for real and
// restarted on its store and ports.
//
// Cleanup when prove itself dies: every node gets a parent-death signal
// (SIGKILL) and its own process group (a terminal's Ctrl-C reaches prove,
// which stops the nodes); the cluster directory is held by prove
// (internal/ownerdir), so the next cluster start removes it, SIGKILLing
// first any node process that outlived its parent (natsembed's sweep).
type procCluster struct {
	plan    *natsembed.ClusterPlan
	proxies map[[2]int]*faultproxy.Proxy
	argv    []string

	mu    sync.Mutex
	nodes []*nodeProc // nil while a node is down
}

type nodeProc struct {
	cmd    *exec.Cmd
	exited <-chan struct{}
	log    *os.File
}

// procClusterReady bounds how long a start or restart waits for every
// running node to be routed to the others and current with the meta leader.
const procClusterReady = 30 * time.Second

// startProcCluster starts the three node processes and waits until they
// are ready. The plan's ports are found free here and bound by the node processes
// later: on a busy machine another process can take one in between (as
// the local port of an outgoing connection), and that node never becomes
// ready. A start that fails is retried on fresh ports, up to three times.
func startProcCluster(argv []string) (*procCluster, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("prove: nats node processes need a worker command")
	}
	var err error
	for try := 1; try <= 3; try++ {
		var pc *procCluster
		if pc, err = startProcClusterOnce(argv); err == nil {
			return pc, nil
		}
		err = fmt.Errorf("start %d of 3: %w", try, err)
	}
	return nil, err
}

func startProcClusterOnce(argv []string) (*procCluster, error) {
	pc := &procCluster{proxies: map[[2]int]*faultproxy.Proxy{}, argv: argv}
	plan, err := natsembed.PlanCluster(clusterNodes, "ferry-prove-procs", routeProxies(pc.proxies))
	if err != nil {
		closeProxies(pc.proxies)
		return nil, fmt.Errorf("prove: nats cluster of processes: %w", err)
	}
	pc.plan, pc.nodes = plan, make([]*nodeProc, len(plan.Nodes))
	for i := range plan.Nodes {
		if _, err := pc.start(i); err != nil {
			pc.close()
			return nil, err
		}
	}
	if err := pc.waitReady(procClusterReady); err != nil {
		pc.close()
		return nil, err
	}
	return pc, nil
}

// clientURL lists every node's client URL.
func (pc *procCluster) clientURL() string { return pc.plan.ClientURL() }

// start runs node i's process and returns its pid.
func (pc *procCluster) start(i int) (int, error) {
	node := pc.plan.Nodes[i]
	if err := natsembed.ClearNodeStatus(node.StoreDir); err != nil {
		return 0, fmt.Errorf("prove: node %s: %w", node.ServerName, err)
	}
	job, err := json.Marshal(workerJob{Role: "nats-node", ID: node.ServerName, Node: &node})
	if err != nil {
		return 0, err
	}
	// The node's output (nothing, normally: NoLog) goes to a file beside
	// its store, for a failed start's error.
	logf, err := os.OpenFile(filepath.Join(pc.plan.Dir, node.ServerName+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("prove: node log: %w", err)
	}
	cmd, exited, err := startWorkerProc(pc.argv, string(job), func(c *exec.Cmd) {
		c.Stdout, c.Stderr = logf, logf
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	})
	if err != nil {
		_ = logf.Close()
		return 0, fmt.Errorf("prove: start node %s: %w", node.ServerName, err)
	}
	pc.mu.Lock()
	pc.nodes[i] = &nodeProc{cmd: cmd, exited: exited, log: logf}
	pc.mu.Unlock()
	return cmd.Process.Pid, nil
}

// kill SIGKILLs node i's process (no shutdown of any kind: open files and
// connections are dropped by the kernel), waits until it is reaped and
// returns its pid.
func (pc *procCluster) kill(i int) (int, error) {
	pc.mu.Lock()
	np := pc.nodes[i]
	pc.nodes[i] = nil
	pc.mu.Unlock()
	if np == nil {
		return 0, fmt.Errorf("prove: node %d is not running", i)
	}
	pid := np.cmd.Process.Pid
	if err := np.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return pid, fmt.Errorf("prove: SIGKILL node %d (pid %d): %w", i, pid, err)
	}
	<-np.exited
	_ = np.log.Close()
	if processAlive(pid) {
		return pid, fmt.Errorf("prove: node %d (pid %d) still alive after SIGKILL", i, pid)
	}
	return pid, nil
}

// waitReady waits until every running node has reported itself clustered,
// current and routed to every other running node, failing early when a
// node's process exits.
func (pc *procCluster) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		pids := map[string]int{}
		pc.mu.Lock()
		for i, np := range pc.nodes {
			if np == nil {
				continue
			}
			select {
			case <-np.exited:
				pc.mu.Unlock()
				b, _ := os.ReadFile(np.log.Name())
				return fmt.Errorf("prove: node %s exited (%v): %s", pc.plan.Nodes[i].ServerName, np.cmd.ProcessState, tail(string(b), 400))
			default:
			}
			pids[pc.plan.Nodes[i].StoreDir] = np.cmd.Process.Pid
		}
		pc.mu.Unlock()
		ok, why := natsembed.NodesReady(pids)
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("prove: nats node processes not ready within %s: %s", limit, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// close stops every node (SIGTERM: a clean shutdown; SIGKILL after 5 s),
// closes the proxies and removes the cluster's directory.
func (pc *procCluster) close() {
	pc.mu.Lock()
	nodes := pc.nodes
	pc.nodes = make([]*nodeProc, len(nodes))
	pc.mu.Unlock()
	for _, np := range nodes {
		if np != nil {
			terminate(np.cmd.Process)
		}
	}
	for _, np := range nodes {
		if np == nil {
			continue
		}
		select {
		case <-np.exited:
		case <-time.After(5 * time.Second):
			_ = np.cmd.Process.Kill()
			<-np.exited
		}
		_ = np.log.Close()
	}
	closeProxies(pc.proxies)
	if pc.plan != nil {
		_ = pc.plan.Close()
	}
}

// runLeaderSigkill: the leader of the scenario's stream is found, its
// node's process SIGKILLed (and checked gone), another node must take the
// stream over; after clusterFaultHold the node is restarted on the same
// store directory and ports, and prove waits until the node processes
// report themselves routed and current and the stream's replicas are all
// current with two full reads.
func runLeaderSigkill(ctx context.Context, pc *procCluster, s *natsStream, faults *atomic.Int64) (string, error) {
	old, err := waitLeader(ctx, s.url, s.name, "", 10*time.Second)
	if err != nil {
		return "", err
	}
	node := pc.plan.NodeByName(old)
	if node < 0 {
		return "", fmt.Errorf("prove: leader %q is not a node of the cluster", old)
	}
	faults.Add(1)
	killed := time.Now()
	pid, err := pc.kill(node)
	if err != nil {
		return "", err
	}
	// Ask a live node: the killed one is gone, a client would only fail
	// over to another anyway. Unlike server.Shutdown (nats-leader-kill),
	// which steps its raft leaders down before it quits, a killed leader
	// hands nothing over: the followers wait out their election timeout.
	survivor := pc.plan.Nodes[(node+1)%len(pc.plan.Nodes)].ClientURL()
	newLeader, lerr := waitLeader(ctx, survivor, s.name, old, 15*time.Second)
	elected := time.Since(killed)
	sleepCtx(ctx, clusterFaultHold)
	newPid, err := pc.start(node)
	if err != nil {
		return "", fmt.Errorf("prove: restart %s: %w", old, err)
	}
	if lerr != nil {
		return "", lerr
	}
	if err := pc.waitReady(procClusterReady); err != nil {
		return "", err
	}
	if err := waitReplicasCurrent(ctx, s, clusterConverge); err != nil {
		return "", err
	}
	return fmt.Sprintf("stream leader %s (pid %d) SIGKILLed, %s took over after %s, %s restarted on its store and ports (pid %d)",
		old, pid, newLeader, elected.Round(100*time.Millisecond), old, newPid), nil
}

// needsProcCluster: nats-leader-sigkill needs the cluster stack (its
// scenario starts node processes of its own beside it), a worker command
// to start them with and Linux (parent-death signal, /proc).
func needsProcCluster(st *stack, c *config) string {
	if why := needsNATSCluster(st, c); why != "" {
		return why
	}
	if len(c.worker) == 0 {
		return "no worker command (run through `ferry prove`, or pass WithWorkerCommand): the cluster's nodes run as worker processes"
	}
	return ""
}
