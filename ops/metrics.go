package ops

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/metricname"
)

// Collector exports Status as Prometheus metrics (prefix ferry_ops_),
// computed from the tables at scrape time. It runs outside the relay and
// the consumers on purpose: when the relay stops, its own gauges stop with
// it, while these keep reporting the backlog growing — which is what the
// "oldest pending age" alert must see.
//
// Register it once per process: prometheus.MustRegister(ops.NewCollector(o)).
type Collector struct {
	o       *Ops
	timeout time.Duration
	softCap int64
	hardCap int64
	up      *prometheus.Desc
	section *prometheus.Desc
	pending *prometheus.Desc
	oldest  *prometheus.Desc
	dead    *prometheus.Desc
	discard *prometheus.Desc
	soft    *prometheus.Desc
	hard    *prometheus.Desc
	unowned *prometheus.Desc
	owned   *prometheus.Desc
	live    *prometheus.Desc
	parked  *prometheus.Desc
	parkAge *prometheus.Desc
	gaps    *prometheus.Desc
	gapAge  *prometheus.Desc
	applied *prometheus.Desc
	effects *prometheus.Desc
	unknown *prometheus.Desc
	slotLag *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// CollectorOption configures a Collector.
type CollectorOption func(*Collector)

// WithScrapeTimeout bounds the queries of one scrape (default 5 s).
func WithScrapeTimeout(d time.Duration) CollectorOption { return func(c *Collector) { c.timeout = d } }

// WithCaps exports the outbox soft and hard caps (ferry_ops_outbox_soft_cap,
// ferry_ops_outbox_hard_cap) so an alert can compare the backlog with them;
// zero leaves a cap unexported.
func WithCaps(soft, hard int64) CollectorOption {
	return func(c *Collector) { c.softCap, c.hardCap = soft, hard }
}

// Metric names the Collector exports (a contract: deploy/ alerts use them).
// The Collector is the one exporter of every fact read from Ferry's tables
// (the backlog, dead letters, leases, parked messages, gaps, effect intents,
// slot lag); the relay, inbox and effect worker export only what exists in
// their own process (docs/OPERATIONS.md, "Metrics").
const (
	MetricUp                   = metricname.Ops + "up"
	MetricSectionUp            = metricname.Ops + "section_up"
	MetricTopicPending         = metricname.Ops + "outbox_pending"
	MetricTopicOldestPending   = metricname.Ops + "outbox_oldest_pending_age_seconds"
	MetricTopicDead            = metricname.Ops + "outbox_dead"
	MetricDiscarded            = metricname.Ops + "outbox_discarded"
	MetricSoftCap              = metricname.Ops + "outbox_soft_cap"
	MetricHardCap              = metricname.Ops + "outbox_hard_cap"
	MetricUnownedShards        = metricname.Ops + "relay_unowned_shards"
	MetricRelayOwnedShards     = metricname.Ops + "relay_owned_shards"
	MetricRelayLive            = metricname.Ops + "relay_live_instances"
	MetricParked               = metricname.Ops + "inbox_parked"
	MetricParkedOldest         = metricname.Ops + "inbox_parked_oldest_age_seconds"
	MetricOpenGaps             = metricname.Ops + "inbox_open_gaps"
	MetricOldestGap            = metricname.Ops + "inbox_oldest_gap_age_seconds"
	MetricLastApplied          = metricname.Ops + "inbox_last_applied_timestamp_seconds"
	MetricEffects              = metricname.Ops + "effects"
	MetricEffectsOldestUnknown = metricname.Ops + "effects_oldest_unknown_age_seconds"
	MetricCDCSlotLag           = metricname.Ops + "cdc_slot_lag_bytes"
)

// NewCollector returns a Collector over o.
func NewCollector(o *Ops, opts ...CollectorOption) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	c := &Collector{
		o:       o,
		timeout: 5 * time.Second,
		up:      d(MetricUp, "1 when the last scrape read every table that should exist, 0 when any section failed or the database was unreachable."),
		section: d(MetricSectionUp, "Per status section (outbox, relay, inbox, effects, ops, cdc) that should exist: 1 when read, 0 when a table is missing or unreadable; absent for a section that is not installed.", "section"),
		pending: d(MetricTopicPending, "Pending outbox rows per topic.", "topic"),
		oldest:  d(MetricTopicOldestPending, "Age (now - created_at) of the oldest pending outbox row per topic; 0 when none.", "topic"),
		dead:    d(MetricTopicDead, "Dead letters (dead, not discarded) per topic.", "topic"),
		discard: d(MetricDiscarded, "Discarded dead letters kept for evidence."),
		soft:    d(MetricSoftCap, "Configured soft cap on pending outbox rows (alert threshold)."),
		hard:    d(MetricHardCap, "Configured hard cap on pending outbox rows (producers fail fast beyond it)."),
		unowned: d(MetricUnownedShards, "Shards with pending rows and no live relay lease."),
		owned:   d(MetricRelayOwnedShards, "Shards leased by each live relay instance (heartbeat not expired); the label is not \"instance\", which Prometheus sets to the scrape target.", "relay_instance"),
		live:    d(MetricRelayLive, "Relay instances with a live heartbeat."),
		parked:  d(MetricParked, "Open parked messages per consumer and reason.", "consumer", "reason"),
		parkAge: d(MetricParkedOldest, "Age of the oldest open parked message per consumer and reason.", "consumer", "reason"),
		gaps:    d(MetricOpenGaps, "Aggregates with an open sequence gap per consumer.", "consumer"),
		gapAge:  d(MetricOldestGap, "Age of the oldest open gap per consumer.", "consumer"),
		applied: d(MetricLastApplied, "Unix time of the newest applied event each consumer's inbox table holds; absent before the first. The applied rate is rate(ferry_inbox_applied_total), a counter of the consumer process.", "consumer"),
		effects: d(MetricEffects, "Effect intents per consumer and state.", "consumer", "state"),
		unknown: d(MetricEffectsOldestUnknown, "Age of the oldest effect intent in state unknown per consumer.", "consumer"),
		slotLag: d(MetricCDCSlotLag, "WAL bytes retained for each CDC replication slot.", "slot"),
	}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.section, c.pending, c.oldest, c.dead, c.discard, c.soft, c.hard,
		c.unowned, c.owned, c.live, c.parked, c.parkAge, c.gaps, c.gapAge, c.applied, c.effects, c.unknown, c.slotLag} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one Status read per scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	st, err := c.o.Status(ctx)
	if err != nil {
		c.o.cfg.log.WarnContext(ctx, "ferry ops scrape failed", logattr.Err(err))
	}
	if err != nil && !errors.Is(err, ErrStatusIncomplete) {
		g(c.up, 0)
		return
	}
	// A failed section exports no gauges of its own (unknown is not zero)
	// and its ferry_ops_section_up is 0; the others report as usual.
	up := 1.0
	for _, s := range st.Sections {
		switch s.State {
		case SectionOK:
			g(c.section, 1, s.Name)
		case SectionFailed:
			g(c.section, 0, s.Name)
			up = 0
		}
	}
	g(c.up, up)
	if c.softCap > 0 {
		g(c.soft, float64(c.softCap))
	}
	if c.hardCap > 0 {
		g(c.hard, float64(c.hardCap))
	}
	if st.SectionOK(SectionOutbox) {
		for _, t := range st.Topics {
			g(c.pending, float64(t.Pending), t.Topic)
			g(c.oldest, t.OldestPendingAge, t.Topic)
			g(c.dead, float64(t.Dead), t.Topic)
		}
		g(c.discard, float64(st.Outbox.Discarded))
	}
	if st.SectionOK(SectionRelay) {
		if st.SectionOK(SectionOutbox) {
			g(c.unowned, float64(st.UnownedShards))
		}
		live := 0
		for _, r := range st.Relays {
			if r.Live {
				g(c.owned, float64(len(r.OwnedShards)), r.InstanceID)
				live++
			}
		}
		g(c.live, float64(live))
	}
	for _, cs := range st.Consumers {
		for _, p := range cs.Parked {
			g(c.parked, float64(p.Count), cs.Consumer, p.Reason)
			g(c.parkAge, p.OldestAge, cs.Consumer, p.Reason)
		}
		g(c.gaps, float64(cs.OpenGaps), cs.Consumer)
		g(c.gapAge, cs.OldestGapAge, cs.Consumer)
		if cs.LastAppliedAt != nil {
			g(c.applied, float64(cs.LastAppliedAt.UnixNano())/1e9, cs.Consumer)
		}
	}
	for _, e := range st.Effects {
		for state, n := range e.ByState {
			g(c.effects, float64(n), e.Consumer, state)
		}
		g(c.unknown, e.OldestUnknownAge, e.Consumer)
	}
	for _, s := range st.CDC {
		g(c.slotLag, s.LagBytes, s.Slot)
	}
}

// MetricNames lists every metric the Collector exports.
func MetricNames() []string {
	return []string{MetricUp, MetricSectionUp, MetricTopicPending, MetricTopicOldestPending, MetricTopicDead, MetricDiscarded,
		MetricSoftCap, MetricHardCap, MetricUnownedShards, MetricRelayOwnedShards, MetricRelayLive,
		MetricParked, MetricParkedOldest, MetricOpenGaps, MetricOldestGap, MetricLastApplied, MetricEffects,
		MetricEffectsOldestUnknown, MetricCDCSlotLag}
}
