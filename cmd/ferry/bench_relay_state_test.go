package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/statebench"
	"github.com/ferryhq/ferry/internal/testenv"
)

// `ferry bench relay-state` reports every design with its mark cost and
// claim; an unknown design is refused by name.
func TestBenchRelayState(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: fills five scratch outboxes")
	}
	pg := testenv.PostgresURL(t)
	out, err := runCLI(t, "bench", "relay-state", "--database-url", pg, "--marked", "2000", "--batch-size", "32",
		"--batches", "2", "--rounds", "1", "--aggregates", "40", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep struct {
		LoadStart string              `json:"load_start"`
		Designs   []statebench.Result `json:"designs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not a report: %v\n%s", err, out)
	}
	if len(rep.Designs) != len(statebench.Variants) || rep.LoadStart == "" {
		t.Fatalf("report %+v", rep)
	}
	for _, d := range rep.Designs {
		if d.MicrosPer <= 0 || d.InsertWAL <= 0 || d.Claim.Rows <= 0 {
			t.Errorf("%s: %+v", d.Variant, d)
		}
	}
	if _, err := runCLI(t, "bench", "relay-state", "--database-url", pg, "--marked", "10", "--variants", "z_nothing"); err == nil || !strings.Contains(err.Error(), "z_nothing") {
		t.Errorf("unknown design: err = %v, want a refusal naming it", err)
	}
}
