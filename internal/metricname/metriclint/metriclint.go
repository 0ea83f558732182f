// Package metriclint checks gathered metric families against Prometheus's
// conventions with client_golang's promlint, for Ferry's tests. It is a
// package of its own so that no library package links promlint.
package metriclint

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferryhq/ferry/internal/metricname"
)

// Problems returns every problem promlint finds in fams, every family
// without HELP, and every family whose name starts with "ferry" but not
// with one of prefixes (the subsystems the registry's components own;
// other families, such as go_* and process_*, are linted but not named).
func Problems(fams []*dto.MetricFamily, prefixes ...string) ([]string, error) {
	for _, p := range prefixes {
		if !slices.Contains(metricname.Prefixes(), p) {
			return nil, fmt.Errorf("metriclint: %q is not a metricname prefix", p)
		}
	}
	lint, err := promlint.NewWithMetricFamilies(fams).Lint()
	if err != nil {
		return nil, fmt.Errorf("metriclint: promlint: %w", err)
	}
	var out []string
	for _, p := range lint {
		out = append(out, fmt.Sprintf("%s: %s", p.Metric, p.Text))
	}
	for _, f := range fams {
		name := f.GetName()
		if strings.TrimSpace(f.GetHelp()) == "" {
			out = append(out, name+": no HELP")
		}
		if strings.HasPrefix(name, metricname.Namespace) && !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			out = append(out, fmt.Sprintf("%s: not under the registry's prefixes %v", name, prefixes))
		}
	}
	return out, nil
}

// Described returns the name of every descriptor c describes.
func Described(c prometheus.Collector) ([]string, error) {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var out []string
	var errs []error
	for d := range ch {
		// Desc has no accessor for its name; its String form is stable:
		// Desc{fqName: "name", help: ...}.
		s := d.String()
		const key = `fqName: "`
		i := strings.Index(s, key)
		if i < 0 {
			errs = append(errs, fmt.Errorf("metriclint: cannot read the name of %s", s))
			continue
		}
		rest := s[i+len(key):]
		out = append(out, rest[:strings.IndexByte(rest, '"')])
	}
	return out, errors.Join(errs...)
}

// Children is a Registerer that registers into Registerer and then gives
// every vector (counter, gauge, histogram, summary) one child with the
// label values "x", so Gather shows every family of a component that has
// not run yet (a vector without children is absent from Gather).
type Children struct{ prometheus.Registerer }

// Register implements prometheus.Registerer.
func (c Children) Register(col prometheus.Collector) error {
	if err := c.Registerer.Register(col); err != nil {
		return err
	}
	return touch(col)
}

// MustRegister implements prometheus.Registerer.
func (c Children) MustRegister(cs ...prometheus.Collector) {
	for _, col := range cs {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

// touch creates one child of a vector, trying label counts up to 8.
func touch(col prometheus.Collector) error {
	var get func(lvs ...string) error
	switch v := col.(type) {
	case *prometheus.CounterVec:
		get = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
	case *prometheus.GaugeVec:
		get = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
	case *prometheus.HistogramVec:
		get = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
	case *prometheus.SummaryVec:
		get = func(lvs ...string) error { _, err := v.GetMetricWithLabelValues(lvs...); return err }
	default:
		return nil
	}
	var lvs []string
	for range 9 {
		if get(lvs...) == nil {
			return nil
		}
		lvs = append(lvs, "x")
	}
	return fmt.Errorf("metriclint: could not create a child of %T", col)
}
