package effect

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/metricname"
)

// metrics are the worker's Prometheus instruments (prefix ferry_effect_):
// only what this process knows. The intents by state and the oldest unknown
// intent are facts of the ledger, exported once by ops.Collector
// (ferry_ops_effects, ferry_ops_effects_oldest_unknown_age_seconds).
// They exist even without a Registerer, so the code needs no nil checks.
type metrics struct {
	reconciliations    *prometheus.CounterVec
	attempts           *prometheus.CounterVec
	attemptsPerEffect  *prometheus.HistogramVec
	released           *prometheus.CounterVec
	breakerState       *prometheus.GaugeVec
	breakerTransitions *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reconciliations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricname.Effect + "reconciliations_total",
			Help: "Status queries run for unknown intents, by target and outcome (found, not_found, unknown).",
		}, []string{"target", "outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricname.Effect + "attempts_total",
			Help: "Execution attempts by target and outcome (succeeded, failed, unknown, not_sent; not_called: started, not called, taken back).",
		}, []string{"target", "outcome"}),
		attemptsPerEffect: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricname.Effect + "attempts_per_effect",
			Help:    "Execution attempts an intent needed, observed when it reaches succeeded or failed.",
			Buckets: []float64{0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20},
		}, []string{"target", "state"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricname.Effect + "released_total",
			Help: "Claimed intents handed back unattempted, due again, by target and reason (breaker_open, rate_limited, no_call_slot: the target's call slots stayed busy past what the claim's lease covers, shutdown).",
		}, []string{"target", "reason"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metricname.Effect + "breaker_state",
			Help: "Per-target circuit breaker state, one series per state (closed, open, half_open): 1 for the current state, 0 for the others.",
		}, []string{"target", "state"}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricname.Effect + "breaker_transitions_total",
			Help: "Per-target circuit breaker transitions, by the state entered.",
		}, []string{"target", "to"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.reconciliations, m.attempts,
		m.attemptsPerEffect, m.released, m.breakerState, m.breakerTransitions} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("effect: metrics already registered (one worker per Registerer, or wrap it with prometheus.WrapRegistererWith): %w", err)
			}
			return nil, fmt.Errorf("effect: register metrics: %w", err)
		}
	}
	return m, nil
}

// setBreaker exports s as target's current breaker state.
func (m *metrics) setBreaker(target string, s BreakerState) {
	for _, st := range []BreakerState{BreakerClosed, BreakerOpen, BreakerHalfOpen} {
		v := 0.0
		if st == s {
			v = 1
		}
		m.breakerState.WithLabelValues(target, st.String()).Set(v)
	}
}
