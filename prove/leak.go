package prove

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/metricname"
)

// metrics are the reference pipeline's Prometheus series, registered in
// the scenario's own registry so the leakage check can read every label.
// Labels carry ids and classes, never payload.
type metrics struct {
	published *prometheus.CounterVec
	applied   *prometheus.CounterVec
	parked    *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricname.Prove + "published_total", Help: "Events published by the reference relay."}, []string{"event_type"}),
		applied:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricname.Prove + "applied_total", Help: "Events applied by the reference inbox."}, []string{"tenant", "event_type"}),
		parked:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricname.Prove + "parked_total", Help: "Messages parked by the reference inbox."}, []string{"reason"}),
	}
	reg.MustRegister(m.published, m.applied, m.parked)
	return m
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// findLeaks returns where any canary appears: captured logs, collected
// error strings, and every metric's name, help and label pairs.
func findLeaks(canaries []string, logs string, errs []string, reg *prometheus.Registry) ([]string, error) {
	var where []string
	scan := func(source, text string) {
		for _, c := range canaries {
			if strings.Contains(text, c) {
				where = append(where, fmt.Sprintf("canary %s in %s", c, source))
			}
		}
	}
	scan("logs", logs)
	scan("errors", strings.Join(errs, "\n"))
	if reg != nil {
		mfs, err := reg.Gather()
		if err != nil {
			return nil, fmt.Errorf("prove: gather metrics: %w", err)
		}
		var sb strings.Builder
		for _, mf := range mfs {
			sb.WriteString(mf.GetName() + " " + mf.GetHelp() + "\n")
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					sb.WriteString(lp.GetName() + "=" + lp.GetValue() + "\n")
				}
			}
		}
		scan("metric labels", sb.String())
	}
	return where, nil
}
