package prove

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the soak report as indented JSON.
func (r *SoakReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("prove: write json: %w", err)
	}
	return nil
}

func kib(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fMiB", float64(n)/1024)
}

func count(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// faultKinds is "kind n, kind n, ..." in the rotation's order of first
// firing, then the kinds that never fired.
func (r *SoakReport) faultKinds() string {
	var parts []string
	done := map[string]bool{}
	for _, f := range r.Faults {
		if !done[f.Kind] {
			done[f.Kind] = true
			parts = append(parts, fmt.Sprintf("%s %d", f.Kind, r.FaultsByKind[f.Kind]))
		}
	}
	var never []string
	for k, n := range r.FaultsByKind {
		if n == 0 {
			never = append(never, k)
		}
	}
	sort.Strings(never)
	for _, k := range never {
		parts = append(parts, k+" 0")
	}
	return strings.Join(parts, ", ")
}

// WriteTable writes the soak report: one row per interval, the processes
// at both samples, the faults, the growth findings and the checker's
// verdict.
func (r *SoakReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "ferry prove --soak — stack %s, seed %d, %d tx/s for %s, a row every %s, a fault every %s; took %s\n\n",
		r.Stack, r.Seed, r.Rate, r.Period, r.Interval, r.FaultEvery, r.Elapsed.Round(time.Second))
	tw := tabwriter.NewWriter(w, 2, 2, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "INTERVAL\tPHASE\tCOMMITTED\tPUBLISHED\tAPPLIED\tTOTAL COMMITTED\tTOTAL PUBLISHED\tTOTAL APPLIED\tNOT YET APPLIED\tLAG P99\tFAULTS\t")
	for _, row := range r.Rows {
		faults := "-"
		if len(row.Faults) > 0 {
			faults = fmt.Sprint(row.Faults)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t\n", row.At.Round(time.Second), row.Phase, row.Committed, row.Published, row.Applied,
			row.CommittedTotal, row.PublishedTotal, row.AppliedTotal, row.CommittedTotal-row.AppliedTotal, ms(row.LagP99), faults)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, row := range r.Rows {
		if row.Note != "" {
			fmt.Fprintf(w, "at %s: %s\n", row.At.Round(time.Second), row.Note)
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 2, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PROCESS\tPID\tRSS\tGO HEAP\tGOROUTINES\tPID END\tRSS END\tGO HEAP END\tGOROUTINES END\tRESTARTS\tRUNS\t")
	for _, p := range r.Processes {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t\n", p.Name, p.Start.PID, kib(p.Start.RSSKiB), kib(p.Start.HeapKiB), count(p.Start.Goroutines),
			p.End.PID, kib(p.End.RSSKiB), kib(p.End.HeapKiB), count(p.End.Goroutines), p.Restarts, p.Runs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Processes) > 0 {
		fmt.Fprintf(w, "(sampled at %s, after the first interval, and at %s, after settling; a restarted worker's end sample is of a younger process)\n",
			r.Processes[0].Start.At.Round(time.Second), r.Processes[0].End.At.Round(time.Second))
	}
	fmt.Fprintf(w, "\nfaults (%d): %s\n", len(r.Faults), r.faultKinds())
	for _, f := range r.Faults {
		fmt.Fprintf(w, "  %8s  %-16s %s\n", f.At.Round(100*time.Millisecond), f.Kind, f.Note)
	}
	fmt.Fprintln(w)
	if len(r.Findings) == 0 {
		fmt.Fprintln(w, "growth: no finding (thresholds: resident memory ×1.5, goroutines +10 and +20%, for a process alive at both samples)")
	}
	for _, f := range r.Findings {
		fmt.Fprintf(w, "FINDING: %s\n", f)
	}
	res := r.Result
	f := res.Figures
	c := f.Classes
	fmt.Fprintf(w, "\nchecker: %s — committed %d, rolled back or not run %d, published %d; lost %d, undelivered %d, phantom %d, duplicate applies %d, duplicate effects %d, order violations %d, sequence errors %d, state mismatch %d; faults %d; classes ok/recovered/dup/lost/unknown/unexpected %d/%d/%d/%d/%d/%d; lag p99 %s\n",
		res.Status, f.Committed, f.RolledBack, f.Published, f.Lost, f.Undelivered, f.Phantom, f.DuplicateApplies, f.DuplicateEffects, f.OrderViolations,
		f.SequenceErrors, f.StateMismatch, f.FaultsInjected, c["ok"], c["recovered"], c["duplicated"], c["lost"], c["unknown"], c["unexpected"], ms(f.LagP99))
	if res.Note != "" {
		fmt.Fprintf(w, "note: %s\n", res.Note)
	}
	for _, v := range res.Violations {
		fmt.Fprintf(w, "VIOLATION: %s\n", v)
	}
	verdict := "PASS: no violation over the whole soak"
	if r.Failed() {
		verdict = "FAIL: see above"
	}
	_, err := fmt.Fprintf(w, "\n%s\n", verdict)
	return err
}
