package relay

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/ops"
)

// backlog reads the outbox backlog the way an operator sees it: through
// ops.Collector, the one exporter of the tables' facts (the relay exports
// only its own work). It returns the pending rows, the oldest pending
// row's age in seconds and the dead rows, over all topics.
func (s *store) backlog(t testing.TB) (pending, oldestAge, dead float64) {
	t.Helper()
	o, err := ops.New(s.db, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ops.NewCollector(o))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue()
			switch f.GetName() {
			case ops.MetricTopicPending:
				pending += v
			case ops.MetricTopicOldestPending:
				oldestAge = max(oldestAge, v)
			case ops.MetricTopicDead:
				dead += v
			}
		}
	}
	return pending, oldestAge, dead
}
