package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// The matrix's columns are database × broker; a stack is named
// "<database>+<broker>", e.g. "postgres+kafka".
var (
	matrixDatabases = []string{"sqlite", "postgres", "mysql"}
	matrixBrokers   = []string{"nats", "nats-cluster", "kafka", "rabbitmq"}
)

// MatrixStackNames lists every stack of the full matrix, in column order:
// {sqlite, postgres, mysql} × {nats (embedded, one server), nats-cluster
// (prove's 3-node cluster), kafka (kfake), rabbitmq}.
func MatrixStackNames() []string {
	var out []string
	for _, d := range matrixDatabases {
		for _, b := range matrixBrokers {
			out = append(out, d+"+"+b)
		}
	}
	return out
}

// MatrixOptions say where the servers of the matrix's columns are and which
// columns to run.
type MatrixOptions struct {
	// PostgresURL, MySQLURL, RabbitMQURL: the servers of the postgres,
	// mysql and rabbitmq columns. A column whose URL is empty is reported
	// not applicable, with that reason; SQLite, NATS and kfake are
	// prove's own.
	PostgresURL, MySQLURL, RabbitMQURL string
	// Stacks restricts the columns (names from MatrixStackNames); empty:
	// all.
	Stacks []string
	// Progress gets one line per stack as it starts and ends; nil: none.
	Progress io.Writer
}

// MatrixReport is the grid: one row per scenario, one cell per stack.
type MatrixReport struct {
	Seed    int64         `json:"seed"`
	Events  int           `json:"events_per_scenario"`
	Stacks  []MatrixStack `json:"stacks"`
	Rows    []MatrixRow   `json:"rows"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// MatrixStack is one column: what ran and how long it took, or why the
// whole column did not run.
type MatrixStack struct {
	Name string `json:"name"`
	// Stack is Report.Stack of the run ("postgres+kafka(kfake)").
	Stack   string        `json:"stack,omitempty"`
	Status  string        `json:"status"` // "ran", StatusNotAvailable or StatusError
	Reason  string        `json:"reason,omitempty"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// MatrixRow is one scenario across the stacks; Cells are in Stacks order.
type MatrixRow struct {
	Scenario string       `json:"scenario"`
	Control  bool         `json:"control"`
	Cells    []MatrixCell `json:"cells"`
}

// MatrixCell is one scenario on one stack: Status as in Result; Summary
// the non-zero violation figures (a control's are the ones it was meant
// to show); Reason why it is not applicable or could not run.
type MatrixCell struct {
	Stack      string        `json:"stack"`
	Status     string        `json:"status"`
	Summary    string        `json:"summary,omitempty"`
	Reason     string        `json:"reason,omitempty"`
	Violations []string      `json:"violations,omitempty"`
	Figures    *Figures      `json:"figures,omitempty"`
	Elapsed    time.Duration `json:"elapsed_ns"`
}

// Failed reports whether any cell failed or errored.
func (m *MatrixReport) Failed() bool {
	for _, r := range m.Rows {
		for _, c := range r.Cells {
			if c.Status == StatusFail || c.Status == StatusError {
				return true
			}
		}
	}
	return false
}

// Cell returns the cell of scenario on stack.
func (m *MatrixReport) Cell(scenario, stack string) (MatrixCell, bool) {
	for _, r := range m.Rows {
		if r.Scenario != scenario {
			continue
		}
		for _, c := range r.Cells {
			if c.Stack == stack {
				return c, true
			}
		}
	}
	return MatrixCell{}, false
}

// RunMatrix runs the selected scenarios (WithScenarios; default all) on
// every selected stack, one Run per stack with WithDatabaseURL and
// WithBroker set for it, and gathers the grid. opts are Run's; their
// database and broker are the matrix's to set. The error is non-nil only
// for bad options; a stack that cannot run is a column of error cells.
func RunMatrix(ctx context.Context, mo MatrixOptions, opts ...Option) (*MatrixReport, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	stacks := mo.Stacks
	if len(stacks) == 0 {
		stacks = MatrixStackNames()
	}
	all := MatrixStackNames()
	for _, s := range stacks {
		if !slices.Contains(all, s) {
			return nil, fmt.Errorf("%w: stacks: unknown stack %q, want some of %s", ErrInvalidConfig, s, strings.Join(all, ","))
		}
	}
	names := cfg.scenarios
	if len(names) == 0 {
		for _, s := range allScenarios() {
			names = append(names, s.name)
		}
	}
	start := time.Now()
	m := &MatrixReport{Seed: cfg.seed, Events: cfg.events}
	for _, n := range names {
		sc, _ := lookupScenario(n)
		m.Rows = append(m.Rows, MatrixRow{Scenario: n, Control: sc.control})
	}
	for i, name := range stacks {
		col := MatrixStack{Name: name}
		db, br, _ := strings.Cut(name, "+")
		dbURL, brURL, why := mo.urls(db, br)
		if why != "" {
			col.Status, col.Reason = StatusNotAvailable, why
			m.addColumn(col, nil)
			continue
		}
		if mo.Progress != nil {
			fmt.Fprintf(mo.Progress, "matrix [%d/%d] %s: running %d scenarios\n", i+1, len(stacks), name, len(names))
		}
		t0 := time.Now()
		rep, err := Run(ctx, append(slices.Clip(opts), WithDatabaseURL(dbURL), WithBroker(brURL))...)
		col.Elapsed = time.Since(t0)
		switch {
		case err != nil:
			col.Status, col.Reason = StatusError, err.Error()
		default:
			col.Status, col.Stack = "ran", rep.Stack
		}
		if mo.Progress != nil {
			fmt.Fprintf(mo.Progress, "matrix [%d/%d] %s: %s in %s\n", i+1, len(stacks), name, col.Status, col.Elapsed.Round(time.Second))
		}
		m.addColumn(col, rep)
		if ctx.Err() != nil {
			break
		}
	}
	m.Elapsed = time.Since(start)
	return m, nil
}

// urls returns the database and broker URLs of a stack, or why it cannot
// run.
func (mo *MatrixOptions) urls(db, br string) (dbURL, brURL, why string) {
	switch db {
	case "postgres":
		if dbURL = mo.PostgresURL; dbURL == "" {
			return "", "", "no Postgres URL given (ferry prove --matrix-postgres)"
		}
	case "mysql":
		if dbURL = mo.MySQLURL; dbURL == "" {
			return "", "", "no MySQL/MariaDB URL given (ferry prove --matrix-mysql)"
		}
	}
	switch br {
	case "nats-cluster":
		brURL = BrokerNATSCluster
	case "kafka":
		brURL = "kafka://kfake"
	case "rabbitmq":
		if brURL = mo.RabbitMQURL; brURL == "" {
			return "", "", "no RabbitMQ URL given (ferry prove --matrix-rabbitmq)"
		}
	}
	return dbURL, brURL, ""
}

// addColumn appends the stack and its cells (rep nil: every cell carries
// the column's status and reason).
func (m *MatrixReport) addColumn(col MatrixStack, rep *Report) {
	m.Stacks = append(m.Stacks, col)
	for i := range m.Rows {
		row := &m.Rows[i]
		cell := MatrixCell{Stack: col.Name, Status: col.Status, Reason: col.Reason}
		if rep != nil {
			res, ok := rep.Result(row.Scenario)
			switch {
			case !ok:
				cell.Status, cell.Reason = StatusError, "the run ended before this scenario (cancelled)"
			default:
				cell.Status, cell.Elapsed, cell.Violations = res.Status, res.Elapsed, res.Violations
				switch res.Status {
				case StatusNotAvailable, StatusError:
					cell.Reason = res.Note
				default:
					f := res.Figures
					cell.Figures, cell.Summary = &f, violationSummary(f)
					if cell.Summary == "" && len(res.Violations) > 0 {
						cell.Summary = truncate(res.Violations[0], 60)
					}
					if res.Status == StatusFail && res.Control {
						cell.Reason = res.Note
					}
				}
			}
		}
		row.Cells = append(row.Cells, cell)
	}
}

// violationSummary lists the non-zero violation figures, "" if none.
func violationSummary(f Figures) string {
	var parts []string
	add := func(name string, n int) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", name, n))
		}
	}
	add("lost", f.Lost)
	add("undelivered", f.Undelivered)
	add("phantom", f.Phantom)
	add("dup-applies", f.DuplicateApplies)
	add("dup-effects", f.DuplicateEffects)
	add("order", f.OrderViolations)
	add("seq-errors", f.SequenceErrors)
	add("state-mismatch", f.StateMismatch)
	add("leaks", f.Leaks)
	add("held-or-unexpected", f.Classes["unknown"]+f.Classes["unexpected"])
	add("unknown-unresolved", f.Unknown-f.UnknownCommitted-f.UnknownAbsent)
	return strings.Join(parts, " ")
}

// WriteJSON writes the matrix as indented JSON.
func (m *MatrixReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(m); err != nil {
		return fmt.Errorf("prove: write json: %w", err)
	}
	return nil
}

// WriteTable writes the grid: scenario × stack, each cell pass, caught
// (a control's first violation figure), FAIL with its figures, n/a or error with a note
// number; the notes follow the table.
func (m *MatrixReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "ferry prove --matrix — seed %d, %d events per scenario, %d stacks, %s\n\n", m.Seed, m.Events, len(m.Stacks), m.Elapsed.Round(time.Second))
	var notes []string
	note := func(s string) int {
		if i := slices.Index(notes, s); i >= 0 {
			return i + 1
		}
		notes = append(notes, s)
		return len(notes)
	}
	tw := tabwriter.NewWriter(w, 2, 2, 2, ' ', 0)
	head := []string{"SCENARIO"}
	for _, s := range m.Stacks {
		head = append(head, s.Name)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, r := range m.Rows {
		line := []string{r.Scenario}
		for _, c := range r.Cells {
			line = append(line, cellText(r.Control, c, note))
		}
		fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
	}
	times := []string{"(time)"}
	for _, s := range m.Stacks {
		t := "-"
		if s.Elapsed > 0 {
			t = s.Elapsed.Round(time.Second).String()
		}
		times = append(times, t)
	}
	fmt.Fprintln(tw, strings.Join(times, "\t")+"\t")
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
	}
	for i, n := range notes {
		fmt.Fprintf(w, "[%d] %s\n", i+1, n)
	}
	verdict := "PASS: every cell that ran passed; every control that ran was caught"
	if m.Failed() {
		verdict = "FAIL: see the FAIL and error cells"
	}
	_, err := fmt.Fprintf(w, "\n%s\n", verdict)
	return err
}

func cellText(control bool, c MatrixCell, note func(string) int) string {
	switch {
	case c.Status == StatusNotAvailable:
		return fmt.Sprintf("n/a [%d]", note(c.Reason))
	case c.Status == StatusError:
		return fmt.Sprintf("error [%d]", note(c.Reason))
	case control && c.Status == StatusPass:
		// The first figure keeps the grid narrow; --json has them all.
		first, _, _ := strings.Cut(c.Summary, " ")
		return strings.TrimSpace("caught " + first)
	case control:
		return fmt.Sprintf("FAIL not caught [%d]", note(c.Reason))
	case c.Status == StatusPass:
		return "pass"
	}
	return "FAIL " + c.Summary
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
