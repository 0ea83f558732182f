//go:build linux

package prove

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
)

// TestNATSLeaderSIGKILL runs nats-leader-sigkill on SQLite: the stream
// leader's process is SIGKILLed mid-drain and restarted; nothing may be
// lost, duplicated or reordered, exactly one fault fires and the note
// names the old and the new leader. No cluster directory is left behind.
func TestNATSLeaderSIGKILL(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	rep, err := Run(context.Background(), small(WithBroker(BrokerNATSCluster), WithScenarios("nats-leader-sigkill"))...)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := rep.Result("nats-leader-sigkill")
	if !ok {
		t.Fatal("no result")
	}
	f := r.Figures
	if r.Status != StatusPass || len(r.Violations) > 0 || f.Lost != 0 || f.Phantom != 0 || f.OrderViolations != 0 ||
		f.DuplicateApplies != 0 || f.DuplicateEffects != 0 || f.StateMismatch != 0 || f.FaultsInjected != 1 {
		t.Fatalf("status %s, violations %v, figures %+v, note %q", r.Status, r.Violations, f, r.Note)
	}
	if !strings.Contains(r.Note, "SIGKILLed") || !strings.Contains(r.Note, "took over") || strings.Count(r.Note, "ferry-node-") != 3 {
		t.Errorf("note %q does not name the killed and the new leader", r.Note)
	}
	if !strings.Contains(strings.Join(r.Components, " "), "3 node processes") {
		t.Errorf("components %v", r.Components)
	}
	if left := clusterDirs(t); len(left) > 0 {
		t.Errorf("cluster dirs left behind: %v", left)
	}
}

// TestNodeProcessSIGKILL: on a cluster of node processes, messages
// acknowledged before and while the stream leader's process is SIGKILLed
// are all there after it restarts on its store and ports — read with the
// restarted node leading the stream again — and the killed process is gone
// (its pid no longer exists), not merely disconnected.
func TestNodeProcessSIGKILL(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	pc, err := startProcCluster([]string{os.Args[0], "-test.run=^$"})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.close()
	ctx := context.Background()
	s := &natsStream{url: pc.clientURL(), name: "SIGKILL_" + randHex(4), ackWait: 5 * time.Second}
	if err := s.createReplicated(ctx); err != nil {
		t.Fatal(err)
	}
	nc, js, err := natsConnect(s.url, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	acked := 0
	publish := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("m-%d", acked)
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, err := js.Publish(ctx, s.name+".x", []byte(id), jetstream.WithMsgID(id))
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("publish %s: %v", id, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			acked++
		}
	}
	publish(200)

	old, err := streamLeader(ctx, s.url, s.name)
	if err != nil {
		t.Fatal(err)
	}
	node := pc.plan.NodeByName(old)
	pid, err := pc.kill(node)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("killed node's pid %d: kill(0) = %v, want ESRCH", pid, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !os.IsNotExist(err) {
		t.Fatalf("/proc/%d still there: %v", pid, err)
	}
	publish(100) // acked by the two survivors while the node is dead

	newPid, err := pc.start(node)
	if err != nil {
		t.Fatal(err)
	}
	if newPid == pid {
		t.Fatalf("restart reused pid %d", pid)
	}
	if err := pc.waitReady(procClusterReady); err != nil {
		t.Fatal(err)
	}
	if err := waitReplicasCurrent(ctx, s, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// Hand the stream back to the restarted node, so the read below is
	// served from its store.
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, _ := streamLeader(ctx, s.url, s.name)
		if l == old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream leader still %q, not the restarted %s", l, old)
		}
		req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": old}})
		_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+s.name, req, 2*time.Second)
		time.Sleep(500 * time.Millisecond)
	}
	msgs, err := s.readAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range msgs {
		got[string(m.Body)] = true
	}
	for i := 0; i < acked; i++ {
		if id := fmt.Sprintf("m-%d", i); !got[id] {
			t.Errorf("acked message %s missing after the restart", id)
		}
	}
	if len(msgs) != acked {
		t.Errorf("%d messages in the stream, %d acked", len(msgs), acked)
	}
}

// TestNodeProcessesDieWithProve: a process running a cluster of node
// processes is SIGKILLed; its nodes die with it (parent-death signal) and
// the next cluster start removes its directory.
func TestNodeProcessesDieWithProve(t *testing.T) {
	if os.Getenv("PROVE_NODEPROC_CHILD") == "1" {
		pc, err := startProcCluster([]string{os.Args[0], "-test.run=^$"})
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(2)
		}
		var pids []string
		for _, np := range pc.nodes {
			pids = append(pids, fmt.Sprint(np.cmd.Process.Pid))
		}
		fmt.Println("CLUSTER", pc.plan.Dir, strings.Join(pids, ","))
		time.Sleep(time.Minute) // killed long before
		os.Exit(0)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cmd := exec.Command(os.Args[0], "-test.run=^TestNodeProcessesDieWithProve$")
	cmd.Env = append(os.Environ(), "PROVE_NODEPROC_CHILD=1", "TMPDIR="+tmp)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dir string
	var pids []int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "CLUSTER "); ok {
			d, list, _ := strings.Cut(rest, " ")
			dir = d
			for _, p := range strings.Split(list, ",") {
				var n int
				fmt.Sscan(p, &n)
				pids = append(pids, n)
			}
			break
		}
		t.Log(sc.Text())
	}
	if dir == "" || len(pids) != clusterNodes {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("child did not start its cluster")
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no close, no cleanup
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for processAlive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("node process %d outlived its SIGKILLed parent", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node-0")); err != nil {
		t.Fatalf("the killed run's directory is not there to sweep: %v", err)
	}
	p, err := natsembed.PlanCluster(3, "next", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the SIGKILLed run's directory %s is still there: %v", dir, err)
	}
}
