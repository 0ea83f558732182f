package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v3"
)

// ErrNoPromtool is returned when Prometheus's promtool cannot be found.
// Debian and Ubuntu ship it in the "prometheus" package.
var ErrNoPromtool = errors.New("deploy: promtool not found (install Prometheus's promtool, e.g. the Debian package prometheus, or set FERRY_PROMTOOL)")

// Promtool returns the path of promtool: $FERRY_PROMTOOL, else promtool on
// PATH.
func Promtool() (string, error) {
	if p := os.Getenv("FERRY_PROMTOOL"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("FERRY_PROMTOOL=%s: %w", p, err)
		}
		return p, nil
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		return "", ErrNoPromtool
	}
	return p, nil
}

// CheckFiring asks Prometheus itself — promtool's rule unit tests, not a
// reimplementation of PromQL — whether, on the series in fams, each rule of
// rulesYAML selects exactly the label sets in want[alert] (alerts absent
// from want must select nothing). fams are typically gathered from a real
// Ferry registry after a real fault, so a test shows that the shipped rule
// fires on what the code exports. A rule's "for" is not waited out: this
// checks the condition, promtool's own tests (TestAlertRuleUnitTests) check
// the timing.
//
// Values are compared through count without () (…), so the check is exact
// on labels and independent of ages that change from run to run; callers
// assert values on the gathered metrics themselves.
func CheckFiring(ctx context.Context, rulesYAML []byte, fams []*dto.MetricFamily, want map[string][]map[string]string) error {
	tool, err := Promtool()
	if err != nil {
		return err
	}
	rules, err := ParseRules(rulesYAML)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, r := range rules {
		known[r.Alert] = true
	}
	for a := range want {
		if !known[a] {
			return fmt.Errorf("deploy: want names alert %q, which the rule file does not define", a)
		}
	}
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	type exprTest struct {
		Expr       string   `yaml:"expr"`
		EvalTime   string   `yaml:"eval_time"`
		ExpSamples []sample `yaml:"exp_samples"`
	}
	type series struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type group struct {
		Interval    string     `yaml:"interval"`
		InputSeries []series   `yaml:"input_series"`
		ExprTests   []exprTest `yaml:"promql_expr_test"`
	}
	g := group{Interval: "1m"}
	for _, s := range seriesOf(fams) {
		// Constant over ten minutes, so range functions see a steady series.
		g.InputSeries = append(g.InputSeries, series{Series: s.selector, Values: formatValue(s.value) + "x10"})
	}
	for _, r := range rules {
		t := exprTest{Expr: "count without () (" + r.Expr + ")", EvalTime: "5m", ExpSamples: []sample{}}
		for _, ls := range want[r.Alert] {
			t.ExpSamples = append(t.ExpSamples, sample{Labels: labelString(ls), Value: 1})
		}
		g.ExprTests = append(g.ExprTests, t)
	}
	dir, err := os.MkdirTemp("", "ferry-promtool-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), rulesYAML, 0o600); err != nil {
		return err
	}
	test, err := yaml.Marshal(map[string]any{"rule_files": []string{"rules.yml"}, "evaluation_interval": "1m", "tests": []group{g}})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yml"), test, 0o600); err != nil {
		return err
	}
	return runPromtool(ctx, tool, dir, "test", "rules", "test.yml")
}

// runPromtool runs promtool in dir and returns its output as the error when
// it fails.
func runPromtool(ctx context.Context, tool, dir string, args ...string) error {
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("promtool %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

type flatSeries struct {
	selector string
	value    float64
}

// seriesOf flattens gathered families into Prometheus series as a scrape
// would store them (histograms and summaries as their _bucket/_sum/_count
// and quantile series).
func seriesOf(fams []*dto.MetricFamily) []flatSeries {
	var out []flatSeries
	add := func(name string, labels map[string]string, v float64) {
		out = append(out, flatSeries{selector: name + labelString(labels), value: v})
	}
	for _, f := range fams {
		name := f.GetName()
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			with := func(k, v string) map[string]string {
				c := map[string]string{k: v}
				for a, b := range labels {
					c[a] = b
				}
				return c
			}
			switch {
			case m.Gauge != nil:
				add(name, labels, m.GetGauge().GetValue())
			case m.Counter != nil:
				add(name, labels, m.GetCounter().GetValue())
			case m.Untyped != nil:
				add(name, labels, m.GetUntyped().GetValue())
			case m.Histogram != nil:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", with("le", formatValue(b.GetUpperBound())), float64(b.GetCumulativeCount()))
				}
				add(name+"_bucket", with("le", "+Inf"), float64(h.GetSampleCount()))
				add(name+"_sum", labels, h.GetSampleSum())
				add(name+"_count", labels, float64(h.GetSampleCount()))
			case m.Summary != nil:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					add(name, with("quantile", formatValue(q.GetQuantile())), q.GetValue())
				}
				add(name+"_sum", labels, s.GetSampleSum())
				add(name+"_count", labels, float64(s.GetSampleCount()))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].selector < out[j].selector })
	return out
}

// labelString renders {a="x",b="y"} in sorted order ("" for no labels is
// rendered as {} so promtool reads an empty set).
func labelString(ls map[string]string) string {
	keys := make([]string, 0, len(ls))
	for k := range ls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+strconv.Quote(ls[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
