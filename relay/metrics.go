package relay

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/metricname"
)

// metrics are the relay's Prometheus series: only what this process knows
// (its own work, its breaker). The backlog, dead letters and leases are
// facts of the tables and are exported once, by ops.Collector
// (ferry_ops_*). docs/OPERATIONS.md lists every metric.
type metrics struct {
	published       prometheus.Counter
	duplicates      prometheus.Counter
	latency         prometheus.Histogram
	retries         prometheus.Counter
	deadTotal       prometheus.Counter
	fenced          prometheus.Counter
	breaker         *prometheus.GaugeVec
	brokerCalls     *prometheus.CounterVec
	batches         prometheus.Counter
	pipelined       prometheus.Counter
	phase           *prometheus.HistogramVec
	destMissing     prometheus.Gauge
	destUnavailable prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "published_total",
			Help: "Events acknowledged by the broker and marked sent."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "duplicates_total",
			Help: "Events the broker recognised as already stored (republished after a crash or lost lease)."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricname.Relay + "publish_latency_seconds",
			Help:    "Time from an event's occurred_at to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20)}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "retries_total",
			Help: "Rows whose publish failed transiently and were scheduled for a retry."}),
		deadTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "dead_total",
			Help: "Rows this relay moved to dead (permanent failure or max attempts)."}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "fenced_writes_total",
			Help: "Row updates rejected because this relay's lease or fence was no longer current."}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricname.Relay + "breaker_state",
			Help: "Circuit breaker state, one series per state (closed, open): 1 for the current state, 0 for the others. Open: broker unreachable, only probes are sent."},
			[]string{"state"}),
		brokerCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricname.Relay + "broker_calls_total",
			Help: "Calls to the broker publisher, by op (publish, ping)."}, []string{"op"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "batches_total",
			Help: "Claim-publish-mark cycles that published at least one row."}),
		pipelined: prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Relay + "pipelined_batches_total",
			Help: "Batches claimed while another batch of one of their shards was in flight (WithShardPipeline)."}),
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: metricname.Relay + "cycle_phase_seconds",
			Help:    "Duration of each phase of a relay cycle (claim, publish, mark_sent, mark_failed), for finding what limits throughput.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"phase"}),
		destMissing: prometheus.NewGauge(prometheus.GaugeOpts{Name: metricname.Relay + "destination_missing",
			Help: "Destinations (Kafka topics, NATS subjects, RabbitMQ routing keys) the broker reported missing on the latest publish; their events are held (no attempt charged, never dead) until they exist. 0 when none."}),
		destUnavailable: prometheus.NewGauge(prometheus.GaugeOpts{Name: metricname.Relay + "destination_unavailable",
			Help: "Destinations every publish of a batch to which failed (none accepted) while the broker answered — a stream without a quorum, a partition without a leader; their events are held (no attempt charged, never dead). 0 when none."}),
	}
	// Every series exists from the start (at 0), so rate() and alerts see
	// them before the first call.
	m.brokerCalls.WithLabelValues("publish")
	m.brokerCalls.WithLabelValues("ping")
	for _, p := range []string{"claim", "publish", "mark_sent", "mark_failed"} {
		m.phase.WithLabelValues(p)
	}
	m.setBreaker(BreakerClosed)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.duplicates, m.latency,
		m.retries, m.deadTotal, m.fenced, m.breaker, m.brokerCalls, m.batches, m.pipelined, m.phase, m.destMissing, m.destUnavailable} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("relay: metrics already registered (one registry per relay, or wrap it): %w", err)
			}
			return nil, fmt.Errorf("relay: register metrics: %w", err)
		}
	}
	return m, nil
}

// setBreaker exports s as the current breaker state.
func (m *metrics) setBreaker(s BreakerState) {
	for _, st := range []BreakerState{BreakerClosed, BreakerOpen} {
		v := 0.0
		if st == s {
			v = 1
		}
		m.breaker.WithLabelValues(st.String()).Set(v)
	}
}
