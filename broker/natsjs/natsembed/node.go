package natsembed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/ferryhq/ferry/internal/ownerdir"
)

// A cluster node run as a process of its own (RunNode), so that it can be
// killed for real — SIGKILL: no Shutdown, files not closed, whatever the
// kernel had not been handed lost — and restarted on the same store and
// ports. The parent plans the cluster (PlanCluster) and starts one process
// per node; each node process locks its store directory (internal/ownerdir)
// for as long as it lives, writes its pid next to the lock and keeps a
// status file current, which is how the parent tells when the cluster is
// ready without a monitoring port.

// Files a node process keeps in its store directory.
const (
	nodePidFile    = "node.pid"
	nodeStatusFile = "status.json"
)

// nodeStatusEvery is how often a node process rewrites its status file.
const nodeStatusEvery = 50 * time.Millisecond

// NodeStatus is what a node process reports about itself.
type NodeStatus struct {
	Pid       int       `json:"pid"`
	Clustered bool      `json:"clustered"` // JetStream runs clustered (sees a meta group)
	Current   bool      `json:"current"`   // and is current with the meta leader
	Routes    int       `json:"routes"`    // distinct servers it has a route to
	At        time.Time `json:"at"`
}

// RunNode runs node as a JetStream server in this process until ctx ends,
// then shuts it down. It is the body of a node process: it holds the
// store directory's lock and keeps its pid and status files there while
// it runs.
func RunNode(ctx context.Context, node NodeConfig) error {
	lock, err := ownerdir.Lock(node.StoreDir)
	if err != nil {
		return fmt.Errorf("natsembed: node %s: %w", node.ServerName, err)
	}
	defer lock.Close()
	statusPath := filepath.Join(node.StoreDir, nodeStatusFile)
	if err := writeFileAtomic(filepath.Join(node.StoreDir, nodePidFile), []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		return err
	}
	opts := node.options()
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("natsembed: node %s: %w", node.ServerName, err)
	}
	srv.Start()
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.Remove(statusPath)
	}()
	if !srv.ReadyForConnections(10 * time.Second) {
		return fmt.Errorf("natsembed: node %s on port %d not ready within 10s", node.ServerName, node.ClientPort)
	}
	t := time.NewTicker(nodeStatusEvery)
	defer t.Stop()
	for {
		st := NodeStatus{Pid: os.Getpid(), Clustered: srv.JetStreamIsClustered(), Current: srv.JetStreamIsCurrent(),
			Routes: routedPeers(srv), At: time.Now()}
		b, _ := json.Marshal(st)
		_ = writeFileAtomic(statusPath, b)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ReadNodeStatus reads the status a node process last wrote into its
// store directory. A node that has not started yet, or stopped cleanly,
// has none (an error); one that was SIGKILLed leaves its last one behind,
// so callers compare Pid with the process they started.
func ReadNodeStatus(storeDir string) (NodeStatus, error) {
	var st NodeStatus
	b, err := os.ReadFile(filepath.Join(storeDir, nodeStatusFile))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("natsembed: node status: %w", err)
	}
	return st, nil
}

// ClearNodeStatus removes a node's status file (before a restart, so that
// a status read afterwards is the new process's).
func ClearNodeStatus(storeDir string) error {
	err := os.Remove(filepath.Join(storeDir, nodeStatusFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// NodesReady reports whether every node process named by pids (store
// directory → pid of the process started there) has written a status and
// is clustered, current with the meta leader and routed to every other
// one; otherwise why not.
func NodesReady(pids map[string]int) (bool, string) {
	for dir, pid := range pids {
		st, err := ReadNodeStatus(dir)
		switch {
		case err != nil:
			return false, filepath.Base(dir) + ": no status yet"
		case st.Pid != pid:
			return false, fmt.Sprintf("%s: status of pid %d, not %d", filepath.Base(dir), st.Pid, pid)
		case !st.Clustered || !st.Current || st.Routes < len(pids)-1:
			return false, fmt.Sprintf("%s: clustered=%v current=%v routes=%d", filepath.Base(dir), st.Clustered, st.Current, st.Routes)
		}
	}
	return true, ""
}

// killOrphanNodes SIGKILLs the node processes still running in the
// directory of a cluster whose owner died (a parent-death signal can
// miss): a node's store lock is held only while its process lives, so a
// held lock means the pid beside it is that process, not a reused pid.
func killOrphanNodes(dir string) {
	nodes, _ := filepath.Glob(filepath.Join(dir, "node-*"))
	for _, nd := range nodes {
		if !ownerdir.Held(nd) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(nd, nodePidFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 || pid == os.Getpid() {
			continue
		}
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
		for i := 0; i < 200 && ownerdir.Held(nd); i++ {
			time.Sleep(25 * time.Millisecond)
		}
	}
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("natsembed: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("natsembed: write %s: %w", path, err)
	}
	return nil
}
