package inbox

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetrics(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			var now time.Time
			clock := func() time.Time {
				if now.IsZero() {
					return time.Now()
				}
				return now
			}
			ib := newInbox(t, s, nil, WithRegisterer(reg), WithGapAlert(time.Minute), WithClock(clock))
			e1 := event(t, "acme", "o1", 1, "a")
			mustDeliver(t, ib, e1)
			mustDeliver(t, ib, e1)
			mustDeliver(t, ib, event(t, "acme", "o1", 3, "c"))
			mustDeliver(t, ib, event(t, "acme", "o2", 5, "c"))
			forged := e1
			forged.Payload = []byte("forged")
			mustDeliver(t, ib, forged)

			now = time.Now().Add(2 * time.Minute) // both gaps are now overdue
			for name, want := range map[string]float64{
				"ferry_inbox_applied_total": 1, "ferry_inbox_collisions_total": 1, "ferry_inbox_duplicates_total": 1,
				"ferry_inbox_gaps_overdue": 2, "ferry_inbox_stats_up": 1,
			} {
				if got := metricValue(t, reg, name); got != want {
					t.Errorf("%s = %v, want %v", name, got, want)
				}
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, mf := range mfs {
				got[mf.GetName()] = true
			}
			for _, name := range []string{"ferry_inbox_stale_total", "ferry_inbox_retries_total", "ferry_inbox_ack_errors_total",
				"ferry_inbox_parked_total", "ferry_inbox_handler_duration_seconds", "ferry_inbox_gaps_overdue", "ferry_inbox_stats_up"} {
				if !got[name] {
					t.Errorf("metric %s not exported", name)
				}
			}
			// The open parked rows and gaps are the tables' facts, exported by
			// ops.Collector from the numbers Summary returns; the inbox does
			// not export them a second time.
			for _, name := range []string{"ferry_inbox_parked", "ferry_inbox_parked_oldest_age_seconds", "ferry_inbox_gaps_open", "ferry_inbox_gap_oldest_age_seconds"} {
				if got[name] {
					t.Errorf("metric %s exported by the inbox; ops.Collector owns it", name)
				}
			}
			byReason, gaps, err := ib.Summary(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if gaps != 2 || byReason[ReasonGap].Count != 2 || byReason[ReasonCollision].Count != 1 {
				t.Errorf("Summary = %+v, %d gaps; want 2 gap rows, 1 collision, 2 gaps", byReason, gaps)
			}
			// A second Inbox of the same name on the same registry is refused.
			if _, err := New[*sql.Tx](s.drv, "shipping", writeEffect, WithRegisterer(reg)); err == nil {
				t.Fatal("duplicate registration accepted")
			}
		})
	}
}

// metricValue returns the value of the first series of a counter or gauge.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.Metric) == 0 {
			continue
		}
		m := mf.Metric[0]
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	t.Fatalf("metric %s not found", name)
	return 0
}
