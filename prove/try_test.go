package prove

import (
	"context"
	"os"
	"testing"
)

func TestTry(t *testing.T) {
	rep, err := Run(context.Background(), WithEvents(200), WithAggregates(10), WithScenarios(os.Getenv("SC")), WithProgress(os.Stderr))
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteTable(os.Stdout)
	for _, r := range rep.Results {
		t.Logf("%s %s %v", r.Scenario, r.Status, r.Violations)
	}
}
