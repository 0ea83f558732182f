package prove

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestMatrixTwoStacks runs two cheap scenarios on SQLite + embedded NATS
// and Postgres + kfake, plus a MySQL column without a URL: the grid has
// one row per scenario and one cell per stack, database-outage is not
// applicable on SQLite with its reason, the MySQL column is not
// applicable with its reason, and everything that ran passed.
func TestMatrixTwoStacks(t *testing.T) {
	parallelUnlessRace(t)
	pg := testenv.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	m, err := RunMatrix(ctx, MatrixOptions{PostgresURL: pg, Stacks: []string{"sqlite+nats", "postgres+kafka", "mysql+nats"}, Progress: &progress},
		small(WithScenarios("producer-rollback", "database-outage"))...)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := m.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	t.Log(table.String())
	if len(m.Stacks) != 3 || len(m.Rows) != 2 {
		t.Fatalf("%d stacks × %d rows, want 3 × 2", len(m.Stacks), len(m.Rows))
	}
	for _, r := range m.Rows {
		if len(r.Cells) != 3 {
			t.Fatalf("%s: %d cells, want 3", r.Scenario, len(r.Cells))
		}
		for _, c := range r.Cells {
			if c.Status == StatusNotAvailable && c.Reason == "" {
				t.Errorf("%s on %s: not applicable without a reason", r.Scenario, c.Stack)
			}
		}
	}
	want := map[[2]string]string{
		{"producer-rollback", "sqlite+nats"}:    StatusPass,
		{"producer-rollback", "postgres+kafka"}: StatusPass,
		{"database-outage", "sqlite+nats"}:      StatusNotAvailable,
		{"database-outage", "postgres+kafka"}:   StatusPass,
		{"producer-rollback", "mysql+nats"}:     StatusNotAvailable,
		{"database-outage", "mysql+nats"}:       StatusNotAvailable,
	}
	for k, st := range want {
		c, ok := m.Cell(k[0], k[1])
		if !ok || c.Status != st {
			t.Errorf("%s on %s: %+v, want %s", k[0], k[1], c, st)
		}
	}
	if c, _ := m.Cell("database-outage", "sqlite+nats"); !strings.Contains(c.Reason, "SQLite") {
		t.Errorf("database-outage on SQLite: reason %q does not say why", c.Reason)
	}
	if c, _ := m.Cell("producer-rollback", "mysql+nats"); !strings.Contains(c.Reason, "--matrix-mysql") {
		t.Errorf("mysql column without a URL: reason %q does not name the flag", c.Reason)
	}
	if m.Failed() {
		t.Errorf("matrix failed:\n%s", table.String())
	}
	lines := strings.Split(table.String(), "\n")
	if !strings.HasPrefix(lines[2], "SCENARIO") || !strings.Contains(lines[2], "postgres+kafka") || !strings.Contains(table.String(), "[1] ") {
		t.Errorf("table header or notes missing:\n%s", table.String())
	}
	var js bytes.Buffer
	if err := m.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back MatrixReport
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Rows) != 2 || len(back.Rows[0].Cells) != 3 {
		t.Errorf("json round trip: %v, %+v", err, back)
	}
	if !strings.Contains(progress.String(), "matrix [2/3] postgres+kafka") {
		t.Errorf("progress lines missing: %q", progress.String())
	}
}

// TestMatrixFailedCell: a failing cell (a control that catches nothing is
// reported as fail) makes the matrix fail; a stack name outside the grid is
// refused naming the flag.
func TestMatrixFailedCell(t *testing.T) {
	m := &MatrixReport{}
	m.Rows = []MatrixRow{{Scenario: "producer-rollback"}}
	m.addColumn(MatrixStack{Name: "sqlite+nats", Status: "ran"}, &Report{Results: []Result{{Scenario: "producer-rollback", Status: StatusFail,
		Figures: Figures{Lost: 3, Classes: map[string]int{}}, Violations: []string{"3 committed events lost"}}}})
	if !m.Failed() {
		t.Fatal("a failed cell did not fail the matrix")
	}
	var b bytes.Buffer
	_ = m.WriteTable(&b)
	if !strings.Contains(b.String(), "FAIL lost=3") {
		t.Errorf("failed cell not shown with its figure:\n%s", b.String())
	}
	m.addColumn(MatrixStack{Name: "postgres+nats", Status: "ran"}, &Report{Results: []Result{{Scenario: "producer-rollback", Status: StatusFail,
		Figures: Figures{Unknown: 3, UnknownCommitted: 1, Classes: map[string]int{}}, Violations: []string{"2 of 3 events with an unknown commit outcome resolved to neither"}}}})
	if c, _ := m.Cell("producer-rollback", "postgres+nats"); c.Summary != "unknown-unresolved=2" {
		t.Errorf("unresolved unknowns: summary %q", c.Summary)
	}
	if _, err := RunMatrix(context.Background(), MatrixOptions{Stacks: []string{"oracle+nats"}}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "stacks") {
		t.Errorf("unknown stack: %v", err)
	}
}
