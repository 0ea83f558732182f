package prove

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// demoScenario is the story `ferry demo` tells: one run with every common
// fault at once — rollbacks, the relay killed after a publish, a duplicate
// delivered, the payment provider's response lost, events arriving out of
// order. It is not part of the default crash matrix (each fault has its
// own scenario there).
func demoScenario() *scenario {
	return &scenario{name: "demo", desc: "the demo story: rollbacks, relay crash, duplicate delivery, lost provider response, reordering",
		plan: planOptions{rollbackRate: 0.1, faultRates: map[int]float64{
			faultRelayCrash: 0.01, faultEffectCrash: 0.1, faultReorder: 0.03, faultAckLoss: 0.01}},
		relays: 1, duplicates: 5}
}

// DemoResult is what RunDemo measured, for a caller that tells the story
// its own way.
type DemoResult struct {
	Stack   string
	Result  Result
	Elapsed time.Duration
}

// RunDemo runs the demo story on the embedded stack (SQLite in a temp dir,
// in-process NATS) and writes a short narrative and the evidence table to
// out. It returns ErrViolation if the checker found any violation. opts
// may override scale and seed (WithEvents, WithSeed); the default is a
// run of a few seconds.
func RunDemo(ctx context.Context, out io.Writer, opts ...Option) (*DemoResult, error) {
	cfg := config{seed: 1, events: 300, aggregates: 30, tenants: 3, producers: 4, duration: 30 * time.Second, ackWait: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	cfg.scenarios = nil
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.logger == nil {
		cfg.logger = discardLogger()
	}
	start := time.Now()
	st, err := openStack(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer st.close()
	sc := demoScenario()
	fmt.Fprintf(out, "Ferry demo — %s\n", st.describe())
	fmt.Fprintf(out, "  %d producers write an order flow (create, pay, ship, cancel) for %d tenants x %d orders;\n", cfg.producers, cfg.tenants, cfg.aggregates)
	fmt.Fprintln(out, "  about 1 transaction in 10 rolls back on purpose. Meanwhile the relay is killed after a")
	fmt.Fprintln(out, "  publish, the consumer dies after a commit, the broker delivers duplicates and out of order,")
	fmt.Fprintln(out, "  and the payment provider's response is lost after it charged.")
	res := runScenario(ctx, &cfg, st, sc, newProgress(cfg.progress))
	d := &DemoResult{Stack: st.describe(), Result: res, Elapsed: time.Since(start)}
	if res.Status == StatusError {
		return d, fmt.Errorf("prove: demo: %s", res.Note)
	}
	f := res.Figures
	fmt.Fprintf(out, "\nWhat happened (measured from the tables, the stream and the provider's books):\n")
	tw := tabwriter.NewWriter(out, 2, 2, 2, ' ', tabwriter.AlignRight)
	rows := []struct {
		k string
		v any
	}{
		{"events committed", f.Committed},
		{"events rolled back", f.RolledBack},
		{"faults injected", f.FaultsInjected},
		{"lost", f.Lost},
		{"phantom", f.Phantom},
		{"duplicate effects (charges)", f.DuplicateEffects},
		{"order violations", f.OrderViolations},
		{"duplicate publishes absorbed", f.DuplicatePublishes},
		{"duplicate deliveries absorbed", f.DuplicateDeliveries},
		{"gaps found / healed", fmt.Sprintf("%d / %d", f.GapsFound, f.GapsHealed)},
		{"unknown outcomes reconciled", f.Reconciliations},
		{"relay lag p50 / p99", fmt.Sprintf("%s / %s", ms(f.LagP50), ms(f.LagP99))},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\t%v\t\n", r.k, r.v)
	}
	if err := tw.Flush(); err != nil {
		return d, err
	}
	if len(res.Violations) > 0 {
		fmt.Fprintf(out, "\nVIOLATIONS: %s\n", summarize(res.Violations))
		return d, ErrViolation
	}
	fmt.Fprintf(out, "\nEvery committed event applied exactly once, in order; no rolled-back event escaped; no customer charged twice. (%s)\n", d.Elapsed.Round(100*time.Millisecond))
	return d, nil
}
