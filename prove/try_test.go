package prove

import (
	"context"
	"os"
	"strings"
	"testing"
)

func TestTry(t *testing.T) {
	rep, err := Run(context.Background(), WithEvents(200), WithAggregates(10), WithScenarios(strings.Fields(os.Getenv("SC"))...), WithProgress(os.Stderr), WithWorkerCommand(os.Args[0], "-test.run=^$"))
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteTable(os.Stdout)
	for _, r := range rep.Results {
		t.Logf("%s %s %s %d", r.Scenario, r.Status, r.Elapsed, r.Figures.FencedWrites)
	}
}

func TestTryDemo(t *testing.T) {
	if _, err := RunDemo(context.Background(), os.Stdout); err != nil {
		t.Fatal(err)
	}
}
