package prove

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNATSCluster runs the cluster scenarios on prove's own 3-node
// JetStream cluster (R3 streams) with SQLite: the stream leader shut down
// and restarted mid-drain, the leader partitioned from both other nodes
// and healed, a relay frozen past its lease (SIGSTOP), a relay SIGKILLed,
// and a negative control that must still lose on the cluster. Afterwards
// no cluster store directory is left behind.
func TestNATSCluster(t *testing.T) {
	// A private temp dir: other processes (another package's tests, a
	// ferry prove beside the suite) make cluster dirs of their own in the
	// shared one, which would read as left behind here.
	t.Setenv("TMPDIR", t.TempDir())
	before := clusterDirs(t)
	rep, err := Run(context.Background(), small(WithBroker(BrokerNATSCluster), WithScenarios(
		"nats-leader-kill", "nats-partition", "concurrent-relays", "relay-sigkill", "broker-outage",
		"control-mark-before-ack"))...)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stack != "sqlite+nats(3-node cluster, R3)" {
		t.Errorf("stack %q", rep.Stack)
	}
	assertMatrix(t, rep, map[string]bool{"broker-outage": true})
	for name, want := range map[string]string{"nats-leader-kill": "took over", "nats-partition": "partition healed"} {
		r, _ := rep.Result(name)
		if r.Status != StatusPass || !strings.Contains(r.Note, want) || r.Figures.FaultsInjected != 1 {
			t.Errorf("%s: status %s, note %q, faults %d", name, r.Status, r.Note, r.Figures.FaultsInjected)
		}
	}
	if r, _ := rep.Result("concurrent-relays"); r.Figures.FencedWrites == 0 {
		t.Errorf("concurrent-relays on the cluster: nothing fenced: %+v", r.Figures)
	}
	if r, _ := rep.Result("broker-outage"); r.Status != StatusNotAvailable {
		t.Errorf("broker-outage on the cluster: %s, want not_available", r.Status)
	}
	for d := range clusterDirs(t) {
		if !before[d] {
			t.Errorf("cluster store dir %s left behind", d)
		}
	}
}

// TestClusterScenariosNeedCluster: on the single embedded server the
// cluster scenarios say why they cannot run instead of passing vacuously.
func TestClusterScenariosNeedCluster(t *testing.T) {
	rep, err := Run(context.Background(), small(WithScenarios("nats-leader-kill", "nats-partition", "nats-leader-sigkill"))...)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Status != StatusNotAvailable || !strings.Contains(r.Note, BrokerNATSCluster) {
			t.Errorf("%s: %s %q", r.Scenario, r.Status, r.Note)
		}
	}
}

func clusterDirs(t *testing.T) map[string]bool {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(os.TempDir(), "ferry-nats-cluster-*"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, d := range m {
		out[d] = true
	}
	return out
}
