package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// Flags of one prove mode are refused in another, naming the flag.
func TestProveModeFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"prove", "--soak", "20s", "--matrix"}, "--soak and --matrix"},
		{[]string{"prove", "--soak", "20s", "--scenario", "producer-rollback"}, "--scenario does not apply to --soak"},
		{[]string{"prove", "--soak", "20s", "--events", "50"}, "--events does not apply to --soak"},
		{[]string{"prove", "--soak-interval", "5s"}, "--soak-interval needs --soak"},
		{[]string{"prove", "--matrix", "--broker", "kafka://kfake"}, "--broker does not apply to --matrix"},
		{[]string{"prove", "--stacks", "sqlite+nats"}, "--stacks needs --matrix"},
		{[]string{"prove", "--matrix", "--stacks", "oracle+nats"}, `unknown stack "oracle+nats"`},
		{[]string{"prove", "--soak", "1s"}, "soak must be in 10s..24h"},
	} {
		_, err := runCLI(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ferry %s: err %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

// `ferry prove --matrix --json` on one stack and one scenario: the JSON
// grid has the row, the cell passed, and the rabbitmq column without a
// URL is not applicable with its reason.
func TestProveMatrixJSON(t *testing.T) {
	out, err := runCLI(t, "prove", "--matrix", "--json", "--stacks", "sqlite+nats,sqlite+rabbitmq", "--scenario", "producer-rollback", "--events", "40")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var m struct {
		Rows []struct {
			Scenario string `json:"scenario"`
			Cells    []struct {
				Stack, Status, Reason string
			} `json:"cells"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &m); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(m.Rows) != 1 || len(m.Rows[0].Cells) != 2 {
		t.Fatalf("grid %+v, want 1 row × 2 cells", m)
	}
	if c := m.Rows[0].Cells[0]; c.Stack != "sqlite+nats" || c.Status != "pass" {
		t.Errorf("sqlite+nats: %+v, want pass", c)
	}
	if c := m.Rows[0].Cells[1]; c.Status != "not_available" || !strings.Contains(c.Reason, "--matrix-rabbitmq") {
		t.Errorf("sqlite+rabbitmq without a URL: %+v, want not_available naming --matrix-rabbitmq", c)
	}
}
