package effect

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the worker's Prometheus instruments (prefix ferry_effect_).
// They exist even without a Registerer, so the code needs no nil checks.
type metrics struct {
	intents            *prometheus.GaugeVec
	oldestUnknown      prometheus.Gauge
	reconciliations    *prometheus.CounterVec
	attempts           *prometheus.CounterVec
	attemptsPerEffect  *prometheus.HistogramVec
	breakerState       *prometheus.GaugeVec
	breakerTransitions *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		intents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_effect_intents",
			Help: "Effect intents in the ledger by state (refreshed by the worker).",
		}, []string{"state"}),
		oldestUnknown: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ferry_effect_oldest_unknown_age_seconds",
			Help: "Age of the oldest intent whose outcome is unknown; 0 when none. Alert when it grows.",
		}),
		reconciliations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_effect_reconciliations_total",
			Help: "Status queries run for unknown intents, by target and outcome (found, not_found, unknown).",
		}, []string{"target", "outcome"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_effect_attempts_total",
			Help: "Execution attempts by target and outcome (succeeded, failed, unknown, not_sent).",
		}, []string{"target", "outcome"}),
		attemptsPerEffect: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_effect_attempts_per_effect",
			Help:    "Execution attempts an intent needed, observed when it reaches succeeded or failed.",
			Buckets: []float64{0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20},
		}, []string{"target", "state"}),
		breakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_effect_breaker_state",
			Help: "Per-target circuit breaker: 0 closed, 1 open, 2 half-open.",
		}, []string{"target"}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_effect_breaker_transitions_total",
			Help: "Per-target circuit breaker transitions, by the state entered.",
		}, []string{"target", "to"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.intents, m.oldestUnknown, m.reconciliations, m.attempts,
		m.attemptsPerEffect, m.breakerState, m.breakerTransitions} {
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
