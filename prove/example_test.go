package prove_test

import (
	"context"
	"fmt"

	"github.com/ferryhq/ferry/prove"
)

// Run one real scenario and one negative control on the embedded stack.
// The real scenario must show no violation; the control must show one.
func ExampleRun() {
	rep, err := prove.Run(context.Background(),
		prove.WithSeed(42), prove.WithEvents(60), prove.WithAggregates(5),
		prove.WithScenarios("consumer-ack-loss", "control-inline-effect"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rep.Results {
		fmt.Printf("%s: %s, lost %d, duplicate effects>0: %v\n", r.Scenario, r.Status, r.Figures.Lost, r.Figures.DuplicateEffects > 0)
	}
	fmt.Println("failed:", rep.Failed())
	// Output:
	// consumer-ack-loss: pass, lost 0, duplicate effects>0: false
	// control-inline-effect: pass, lost 0, duplicate effects>0: true
	// failed: false
}

func ExampleScenarios() {
	for _, s := range prove.Scenarios()[:3] {
		fmt.Println(s.Name, s.Control)
	}
	// Output:
	// producer-rollback false
	// relay-crash-after-publish false
	// consumer-ack-loss false
}
