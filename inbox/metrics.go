package inbox

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/metricname"
)

// metrics are the ferry_inbox_* series, labelled with the consumer name:
// what this process knows (counters of its own work, the handler's time,
// the broker's lag) and the overdue-gap count, which depends on this
// consumer's [WithGapAlert]. The open parked rows and gaps are facts of the
// tables, exported once by ops.Collector (ferry_ops_inbox_*).
type metrics struct {
	applied, duplicates, stale, collisions, retries, ackErrors prometheus.Counter
	parked                                                     *prometheus.CounterVec
	handlerSeconds                                             prometheus.Histogram
	gauges                                                     *gaugeCollector
}

func newMetrics(consumer string, reg prometheus.Registerer, collect func(ctx context.Context) (gaugeSnapshot, error)) (*metrics, error) {
	labels := prometheus.Labels{"consumer": consumer}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: metricname.Inbox + name, Help: help, ConstLabels: labels})
	}
	m := &metrics{
		applied:    counter("applied_total", "Events whose effect committed (including parked successors and replays)."),
		duplicates: counter("duplicates_total", "Deliveries absorbed as duplicates (same tenant, event id and fingerprint)."),
		stale:      counter("stale_total", "Deliveries skipped because the aggregate cursor was already past them."),
		collisions: counter("collisions_total", "Deliveries with a known (tenant, event id) but a different fingerprint; parked."),
		retries:    counter("retries_total", "Deliveries rolled back and left for redelivery (handler or database error)."),
		ackErrors:  counter("ack_errors_total", "Broker acks that failed after the commit (the redelivery is absorbed as a duplicate)."),
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricname.Inbox + "parked_total",
			Help: "Park events by reason (a redelivered parked message counts again).", ConstLabels: labels}, []string{"reason"}),
		handlerSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricname.Inbox + "handler_duration_seconds",
			Help: "Time spent in the handler per event.", ConstLabels: labels,
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
		gauges: newGaugeCollector(labels, collect),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.applied, m.duplicates, m.stale, m.collisions, m.retries, m.ackErrors, m.parked, m.handlerSeconds, m.gauges} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(errors.New("inbox: register metrics (one Inbox per consumer name per registry)"), err)
		}
	}
	return m, nil
}

// gaugeSnapshot is what the scrape-time query returns.
type gaugeSnapshot struct {
	gapsOverdue int64 // parked gap messages older than the gap alert age
	lag         float64
	lagKnown    bool
}

var _ prometheus.Collector = (*gaugeCollector)(nil)

type gaugeCollector struct {
	collect          func(ctx context.Context) (gaugeSnapshot, error)
	overdue, lag, up *prometheus.Desc
}

func newGaugeCollector(labels prometheus.Labels, collect func(ctx context.Context) (gaugeSnapshot, error)) *gaugeCollector {
	d := func(name, help string, vars ...string) *prometheus.Desc {
		return prometheus.NewDesc(metricname.Inbox+name, help, vars, labels)
	}
	return &gaugeCollector{
		collect: collect,
		overdue: d("gaps_overdue", "Parked gap messages older than this consumer's gap alert age (WithGapAlert): alert on > 0."),
		lag:     d("consumer_lag", "Messages the broker holds for this consumer not yet delivered (where the adapter reports it)."),
		up:      d("stats_up", "1 when the scrape-time database query for ferry_inbox_gaps_overdue succeeded."),
	}
}

func (g *gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.overdue, g.lag, g.up} {
		ch <- d
	}
}

func (g *gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := g.collect(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(g.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(g.overdue, prometheus.GaugeValue, float64(s.gapsOverdue))
	if s.lagKnown {
		ch <- prometheus.MustNewConstMetric(g.lag, prometheus.GaugeValue, s.lag)
	}
}

// LagReporter is implemented by broker consumers that can say how many
// messages wait for this consumer (JetStream num_pending, Kafka lag). The
// inbox exports it as ferry_inbox_consumer_lag while Run is running.
type LagReporter interface {
	Lag(ctx context.Context) (int64, error)
}

// pendingReporter is the natsjs consumer's form of LagReporter.
type pendingReporter interface {
	Pending(ctx context.Context) (uint64, error)
}

// ParkedSummary is the open parked rows of one reason.
type ParkedSummary struct {
	Count  int64
	Oldest time.Time
}

// Summary returns the open parked rows by reason and the number of
// aggregates waiting on a gap (the numbers ops.Collector exports as
// ferry_ops_inbox_parked and ferry_ops_inbox_open_gaps).
func (ib *Inbox[TTx]) Summary(ctx context.Context) (map[Reason]ParkedSummary, int64, error) {
	s, err := ib.summary(ctx)
	if err != nil {
		return nil, 0, err
	}
	return s.byReason, s.gapsOpen, nil
}

type summary struct {
	byReason    map[Reason]ParkedSummary
	gapsOpen    int64
	gapsOverdue int64
}

func (ib *Inbox[TTx]) summary(ctx context.Context) (summary, error) {
	s := summary{byReason: map[Reason]ParkedSummary{}}
	now := ib.cfg.now().UTC()
	exec := ib.drv.Executor()
	rows, err := exec.Query(ctx, ib.q.parkedStats, ib.name, now.Add(-ib.cfg.gapAlert))
	if err != nil {
		return s, err
	}
	defer rows.Close()
	for rows.Next() {
		var reason string
		var n, overdue int64
		var oldest any
		if err := rows.Scan(&reason, &n, &oldest, &overdue); err != nil {
			return s, err
		}
		ps := ParkedSummary{Count: n, Oldest: asTime(oldest)}
		s.byReason[Reason(reason)] = ps
		if Reason(reason) == ReasonGap {
			s.gapsOverdue = overdue
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return s, err
	}
	if err := queryRow(ctx, exec, ib.q.gapAggregates, []any{ib.name}, nil, &s.gapsOpen); err != nil {
		return s, err
	}
	return s, nil
}

// asTime reads an aggregate timestamp: a time on Postgres, text on SQLite
// (aggregates lose the column's declared type there).
func asTime(v any) time.Time {
	switch t := v.(type) {
	case time.Time:
		return t
	case string:
		for _, layout := range []string{"2006-01-02 15:04:05.999999999-07:00", time.RFC3339Nano, "2006-01-02 15:04:05.999999999", "2006-01-02T15:04:05.999999999Z07:00"} {
			if p, err := time.Parse(layout, t); err == nil {
				return p
			}
		}
	case []byte:
		return asTime(string(t))
	}
	return time.Time{}
}

func (ib *Inbox[TTx]) collectGauges(ctx context.Context) (gaugeSnapshot, error) {
	s, err := ib.summary(ctx)
	if err != nil {
		return gaugeSnapshot{}, err
	}
	g := gaugeSnapshot{gapsOverdue: s.gapsOverdue}
	if ib.cfg.lag != nil {
		if n, err := ib.cfg.lag(ctx); err == nil {
			g.lag, g.lagKnown = float64(n), true
		}
	} else if c := ib.running.Load(); c != nil {
		switch lr := (*c).(type) {
		case LagReporter:
			if n, err := lr.Lag(ctx); err == nil {
				g.lag, g.lagKnown = float64(n), true
			}
		case pendingReporter:
			if n, err := lr.Pending(ctx); err == nil {
				g.lag, g.lagKnown = float64(n), true
			}
		}
	}
	return g, nil
}
