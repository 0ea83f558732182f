package relay

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the relay's Prometheus series. Names are a contract: alert
// rules reference them (docs/RELAY.md lists them).
type metrics struct {
	pending       prometheus.Gauge
	oldestAge     prometheus.Gauge
	deadRows      prometheus.Gauge
	published     prometheus.Counter
	duplicates    prometheus.Counter
	latency       prometheus.Histogram
	retries       prometheus.Counter
	deadTotal     prometheus.Counter
	fenced        prometheus.Counter
	breaker       prometheus.Gauge
	ownedShards   prometheus.Gauge
	liveInstances prometheus.Gauge
	brokerCalls   *prometheus.CounterVec
	batches       prometheus.Counter
	phase         *prometheus.HistogramVec
	destMissing   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_outbox_pending",
			Help: "Pending outbox rows in the shards this relay owns."}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_outbox_oldest_pending_age_seconds",
			Help: "Age (now - created_at) of the oldest pending row in the shards this relay owns; 0 when none."}),
		deadRows: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_outbox_dead",
			Help: "Dead outbox rows (the dead-letter set) in the shards this relay owns."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_relay_published_total",
			Help: "Events acknowledged by the broker and marked sent."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_relay_duplicates_total",
			Help: "Events the broker recognised as already stored (republished after a crash or lost lease)."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_relay_publish_latency_seconds",
			Help:    "Time from an event's occurred_at to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20)}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_relay_retries_total",
			Help: "Rows whose publish failed transiently and were scheduled for a retry."}),
		deadTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_relay_dead_total",
			Help: "Rows this relay moved to dead (permanent failure or max attempts)."}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_relay_fenced_writes_total",
			Help: "Row updates rejected because this relay's lease or fence was no longer current."}),
		breaker: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_relay_breaker_open",
			Help: "1 while the circuit breaker is open (broker unreachable, only probes are sent), else 0."}),
		ownedShards: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_relay_owned_shards",
			Help: "Shards this relay currently holds a lease on."}),
		liveInstances: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_relay_live_instances",
			Help: "Relay instances with a live heartbeat, as seen by this relay."}),
		brokerCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_relay_broker_calls_total",
			Help: "Calls to the broker publisher, by op (publish, ping)."}, []string{"op"}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_relay_batches_total",
			Help: "Claim-publish-mark cycles that published at least one row."}),
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_relay_cycle_phase_seconds",
			Help:    "Duration of each phase of a relay cycle (claim, publish, mark), for finding what limits throughput.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"phase"}),
		destMissing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_relay_destination_missing",
			Help: "Destinations (Kafka topics, NATS subjects, RabbitMQ routing keys) the broker reported missing on the latest publish; their events are held (no attempt charged, never dead) until they exist. 0 when none."}),
	}
	// Both series exist from the start (at 0), so rate() and alerts see
	// them before the first call.
	m.brokerCalls.WithLabelValues("publish")
	m.brokerCalls.WithLabelValues("ping")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.pending, m.oldestAge, m.deadRows, m.published, m.duplicates, m.latency,
		m.retries, m.deadTotal, m.fenced, m.breaker, m.ownedShards, m.liveInstances, m.brokerCalls, m.batches, m.phase, m.destMissing} {
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
