package prove

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("prove: write json: %w", err)
	}
	return nil
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
}

// WriteTable writes the human-readable report: one row per scenario with
// the safety figures, then the operational ones, then every violation.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "ferry prove — stack %s, seed %d, %d events per scenario, %s\n\n", r.Stack, r.Seed, r.Events, r.Elapsed.Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 2, 2, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SCENARIO\tSTATUS\tCOMMITTED\tROLLED BACK\tLOST\tUNDELIVERED\tPHANTOM\tUNKNOWN (COMMITTED/ABSENT)\tDUP PUBLISH\tDUP DELIVER\tDUP EFFECT\tORDER\tSTATE MISMATCH\tGAPS FOUND/HEALED\tPARKED\tDLQ\tRECONCILED\tFAULTS\t")
	for _, res := range r.Results {
		f := res.Figures
		name := res.Scenario
		if res.Status == StatusNotAvailable || res.Status == StatusError {
			fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", name, res.Status)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%d\t%d\t%d\t%d\t\n",
			name, res.Status, f.Committed, f.RolledBack, f.Lost, f.Undelivered, f.Phantom, unknownCell(f), f.DuplicatePublishes, f.DuplicateDeliveries,
			f.DuplicateEffects, f.OrderViolations, f.StateMismatch, f.GapsFound, f.GapsHealed, f.Parked, f.DeadLetters, f.Reconciliations, f.FaultsInjected)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 2, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SCENARIO\tLAG P50\tP99\tMAX\tPARKED MAX AGE\tBROKER CALLS/EVENT\tPROVIDER CALLS/EFFECT\tFENCED\tCLASSES (ok/recovered/dup/lost/unknown/unexpected)\t")
	for _, res := range r.Results {
		if res.Status == StatusNotAvailable || res.Status == StatusError {
			continue
		}
		f := res.Figures
		c := f.Classes
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%d\t%d/%d/%d/%d/%d/%d\t\n", res.Scenario, ms(f.LagP50), ms(f.LagP99), ms(f.LagMax), ms(f.ParkedMaxAge),
			f.BrokerCallsPerEvent, f.ProviderCallsPerEffect, f.FencedWrites,
			c["ok"], c["recovered"], c["duplicated"], c["lost"], c["unknown"], c["unexpected"])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, res := range r.Results {
		switch {
		case res.Status == StatusNotAvailable:
			fmt.Fprintf(w, "%s: not available — %s\n", res.Scenario, res.Note)
		case res.Status == StatusError:
			fmt.Fprintf(w, "%s: ERROR — %s\n", res.Scenario, res.Note)
		case res.Control && len(res.Violations) > 0:
			fmt.Fprintf(w, "%s (negative control, violations expected): %s\n", res.Scenario, summarize(res.Violations))
		case len(res.Violations) > 0 || res.Status == StatusFail:
			fmt.Fprintf(w, "%s: FAIL — %s %s\n", res.Scenario, summarize(res.Violations), res.Note)
		case res.Note != "":
			fmt.Fprintf(w, "%s: %s\n", res.Scenario, res.Note)
		}
	}
	verdict := "PASS: no violation outside the negative controls; every control showed its violation"
	if r.Failed() {
		verdict = "FAIL: see above"
	}
	_, err := fmt.Fprintf(w, "\n%s\n", verdict)
	return err
}

// unknownCell is "n (committed/absent)", or "0".
func unknownCell(f Figures) string {
	if f.Unknown == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%d/%d)", f.Unknown, f.UnknownCommitted, f.UnknownAbsent)
}

func summarize(v []string) string {
	if len(v) > 4 {
		return strings.Join(v[:4], "; ") + fmt.Sprintf("; … %d more", len(v)-4)
	}
	return strings.Join(v, "; ")
}
