//go:build linux

package prove

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestRabbitMQNodeKill runs rabbitmq-node-kill on SQLite: the scenario's
// exchange and queues live on prove's own RabbitMQ node, which is
// SIGKILLed mid-run while a publish awaits its confirms and restarted.
// The --broker node only makes the stack a RabbitMQ one. 0 violations, the
// one kill fired, and it bit: publishes failed across it and the relay
// republished what was not confirmed. No node directory is left behind.
func TestRabbitMQNodeKill(t *testing.T) {
	if why := rabbitServerMissing(); why != "" {
		testenv.Unavailable(t, "rabbitmq-node-kill: %s", why)
	}
	before := tempPGDirs(t)
	rep, err := Run(context.Background(), small(WithBroker(testenv.RabbitMQURL(t)), WithScenarios(rabbitNodeKill))...)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	_ = rep.WriteTable(&buf)
	t.Log("\n" + buf.String())
	assertMatrix(t, rep, nil)
	r, ok := rep.Result(rabbitNodeKill)
	if !ok {
		t.Fatal("no result")
	}
	f := r.Figures
	if f.FaultsInjected != 1 || !strings.Contains(r.Note, "SIGKILLed") || !strings.Contains(r.Note, "queues survived") {
		t.Errorf("faults %d, note %q", f.FaultsInjected, r.Note)
	}
	// The fault bit: something the relay sent was not confirmed and went
	// out again (the scenario's own check already asks for a failed
	// publish across the kill).
	if f.DuplicatePublishes == 0 {
		t.Errorf("nothing republished across the node kill: %+v", f)
	}
	if f.Lost+f.Phantom+f.DuplicateApplies+f.DuplicateEffects+f.OrderViolations+f.StateMismatch != 0 {
		t.Errorf("violations in the figures: %+v", f)
	}
	assertNoOrphanDirs(t, before)
}

// TestTempRabbitMQSurvivesKilledOwner: a process that started a throwaway
// RabbitMQ node is SIGKILLed; the node and its epmd die with it, the next
// start sweeps the directory, and a new node survives a crash and restart.
func TestTempRabbitMQSurvivesKilledOwner(t *testing.T) {
	if why := rabbitServerMissing(); why != "" {
		testenv.Unavailable(t, "throwaway rabbitmq: %s", why)
	}
	testKilledOwner(t, serverRabbitMQ, "TestTempRabbitMQSurvivesKilledOwner", func(dir, _ string) []string {
		return []string{filepath.Join(dir, "server.pid"), filepath.Join(dir, "epmd.pid")}
	})
}
