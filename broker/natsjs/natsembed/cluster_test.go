package natsembed

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestStartClusterRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		n    int
		name string
		want string
	}{{2, "c", "n 2 is outside 3..7"}, {8, "c", "n 8 is outside 3..7"}, {3, "", "name must not be empty"}} {
		_, err := StartCluster(tc.n, tc.name, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StartCluster(%d, %q): %v, want %q", tc.n, tc.name, err, tc.want)
		}
	}
}

// TestClusterNodeRestart: a 3-node cluster forms, a node shut down and
// restarted rejoins on the same ports, and Close removes every store.
func TestClusterNodeRestart(t *testing.T) {
	c, err := StartCluster(3, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(c.ClientURL(), "nats://"); got != 3 {
		t.Errorf("ClientURL %q lists %d servers", c.ClientURL(), got)
	}
	if c.NodeByName("ferry-node-2") != 2 || c.NodeByName("nope") != -1 {
		t.Error("NodeByName")
	}
	c.Nodes[0].Shutdown()
	if err := c.Nodes[0].Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	dir := c.dir
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster dir %s still there: %v", dir, err)
	}
}
