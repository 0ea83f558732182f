package prove

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/metricname"
	"github.com/ferryhq/ferry/internal/metricname/metriclint"
)

// TestProveMetricsLint runs promlint over the reference pipeline's
// ferry_prove_* series (a scenario's registry, read by the leakage check),
// each vector given a child so every family is gathered.
func TestProveMetricsLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.published.WithLabelValues("order.created").Inc()
	m.applied.WithLabelValues("acme", "order.created").Inc()
	m.parked.WithLabelValues("gap").Inc()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) != 3 {
		t.Fatalf("gathered %d families, want 3", len(fams))
	}
	problems, err := metriclint.Problems(fams, metricname.Prove)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}
