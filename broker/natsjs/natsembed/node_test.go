//go:build linux

package natsembed

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSweepKillsOrphanNodes: a process plans a cluster and runs its nodes
// as processes of their own (RunNode) without a parent-death signal, then
// is SIGKILLed. Its nodes outlive it; the next PlanCluster kills them (a
// node's held store lock vouches for the pid beside it) and removes the
// directory.
func TestSweepKillsOrphanNodes(t *testing.T) {
	if raw := os.Getenv("NATSEMBED_NODE"); raw != "" {
		var n NodeConfig
		if err := json.Unmarshal([]byte(raw), &n); err != nil {
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		if err := RunNode(ctx, n); err != nil {
			os.Exit(3)
		}
		os.Exit(0)
	}
	if os.Getenv("NATSEMBED_ORPHAN_OWNER") == "1" {
		p, err := PlanCluster(3, "orphans", nil)
		if err != nil {
			os.Exit(2)
		}
		var pids []string
		for _, n := range p.Nodes {
			b, _ := json.Marshal(n)
			cmd := exec.Command(os.Args[0], "-test.run=^TestSweepKillsOrphanNodes$")
			cmd.Env = append(os.Environ(), "NATSEMBED_ORPHAN_OWNER=", "NATSEMBED_NODE="+string(b))
			if err := cmd.Start(); err != nil {
				os.Exit(2)
			}
			pids = append(pids, strconv.Itoa(cmd.Process.Pid))
		}
		for _, n := range p.Nodes { // every node running: its status written
			for readNodeStatusOK(n.StoreDir) != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
		fmt.Println("CLUSTER", p.Dir, strings.Join(pids, ","))
		time.Sleep(time.Minute) // killed long before
		os.Exit(0)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSweepKillsOrphanNodes$")
	cmd.Env = append(os.Environ(), "NATSEMBED_ORPHAN_OWNER=1", "TMPDIR="+tmp)
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
				n, _ := strconv.Atoi(p)
				pids = append(pids, n)
			}
			break
		}
	}
	if dir == "" || len(pids) != 3 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("owner did not start its nodes")
	}
	defer func() { // whatever happens, no node outlives the test
		for _, pid := range pids {
			if running(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	time.Sleep(200 * time.Millisecond)
	for _, pid := range pids {
		if !running(pid) {
			t.Fatalf("node %d died with its owner: nothing left for the sweep to do", pid)
		}
	}
	p, err := PlanCluster(3, "next", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, pid := range pids {
		if running(pid) {
			t.Errorf("orphan node %d still running after the sweep", pid)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the dead owner's directory %s is still there: %v", dir, err)
	}
}

// readNodeStatusOK is nil once the node in storeDir has written a status.
func readNodeStatusOK(storeDir string) error {
	_, err := ReadNodeStatus(storeDir)
	return err
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
