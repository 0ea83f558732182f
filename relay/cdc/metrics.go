package cdc

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/metricname"
)

// metrics are the CDC relay's Prometheus series (prefix ferry_cdc_): only
// what this process knows. The WAL a slot retains is read from
// pg_replication_slots by ops.Collector (ferry_ops_cdc_slot_lag_bytes), the
// one exporter of that fact.
type metrics struct {
	published   prometheus.Counter
	dead        prometheus.Counter
	retries     prometheus.Counter
	slotLost    prometheus.Counter
	catchUp     prometheus.Counter
	reconciled  prometheus.Counter
	lagAlerts   prometheus.Counter
	lagSeconds  prometheus.Gauge
	confirmed   prometheus.Gauge
	active      prometheus.Gauge
	ackLatency  prometheus.Histogram
	sessionErrs prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, slot string) (*metrics, error) {
	labels := prometheus.Labels{"slot": slot}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.CDC + name, Help: help, ConstLabels: labels})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: metricname.CDC + name, Help: help, ConstLabels: labels})
	}
	m := &metrics{
		published:   counter("published_total", "Events acknowledged by the broker (stream and catch-up)."),
		dead:        counter("dead_total", "Events the broker permanently refused; their rows are marked dead."),
		retries:     counter("publish_retries_total", "Publish attempts retried after a transient broker failure."),
		slotLost:    counter("slot_lost_total", "Replication slots found lost (wal_status=lost) or dropped; each triggers a catch-up from the table."),
		catchUp:     counter("catchup_events_total", "Pending rows re-published from the table after a slot was (re)created."),
		reconciled:  counter("reconciled_events_total", "Rows found pending behind the slot's confirmed position and re-published and marked by the reconciler."),
		lagAlerts:   counter("lag_alerts_total", "Times slot lag crossed the alert threshold."),
		lagSeconds:  gauge("slot_lag_seconds", "Seconds since the slot's confirmed position last moved, while lag is positive."),
		confirmed:   gauge("confirmed_lsn", "The LSN this relay confirmed to Postgres (as a number)."),
		active:      gauge("active", "1 while this relay holds the slot and streams, 0 as standby."),
		sessionErrs: counter("session_errors_total", "Replication sessions that ended with an error (reconnects)."),
		ackLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricname.CDC + "commit_to_ack_seconds",
			Help: "Time from the outbox transaction's commit to the broker's acknowledgement.", ConstLabels: labels,
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.published, m.dead, m.retries, m.slotLost, m.catchUp, m.reconciled, m.lagAlerts,
		m.lagSeconds, m.confirmed, m.active, m.sessionErrs, m.ackLatency} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("cdc: metrics for slot %q already registered: %w", slot, err)
			}
			return nil, fmt.Errorf("cdc: register metrics: %w", err)
		}
	}
	return m, nil
}
