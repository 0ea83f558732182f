package ops_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/ops"
)

// TestStatusWatermark (Postgres): the outbox backlog as ops reads it under
// both relay state designs. Under the status design, and with a watermark
// in use that no row is at or below, Status reads exactly the same. Then a
// shard gets a watermark (relay.WithSentWatermark): its 'pending' rows at or
// below it are sent and no longer counted, a 'retry' row below it is
// pending, and the oldest pending age is the retry row's, not the older
// sent row's. Exact and bounded Status, the collector's gauges,
// CountPending, Message and SearchOutbox all agree; the dead counts do not
// change. On a plain and on a partitioned outbox.
func TestStatusWatermark(t *testing.T) {
	t.Run("plain", func(t *testing.T) { statusWatermark(t, newPostgres(t)) })
	t.Run("partitioned", func(t *testing.T) {
		e, _, _ := partitionedEnv(t)
		// The rows made older below may fall before today's partition.
		day := time.Now().UTC().Truncate(24 * time.Hour)
		if _, err := partition.Create(context.Background(), e.exec, tables, partition.Outbox, day.Add(-24*time.Hour), 24*time.Hour); err != nil {
			t.Fatal(err)
		}
		statusWatermark(t, e)
	})
}

func statusWatermark(t *testing.T, e *env) {
	ctx := context.Background()
	var evs []ferry.Event
	for i := range 48 {
		ev := event(fmt.Sprint("wm-", i), "order.created")
		if i%4 == 3 {
			ev.EventType = "user.created"
			ev.AggregateType = "user"
		}
		evs = append(evs, ev)
	}
	evs = e.insert(t, evs...)
	markSent(t, e, time.Now(), evs[0].ID.String(), evs[1].ID.String())
	markDead(t, e, evs[2].ID.String(), evs[3].ID.String())
	if _, err := e.ops.DiscardDead(ctx, ops.Filter{EventIDs: []string{evs[3].ID.String()}}, approve); err != nil {
		t.Fatal(err)
	}

	status := func(opts ...ops.StatusOption) ops.Status {
		t.Helper()
		st, err := e.ops.Status(ctx, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	same := func(what string, a, b ops.Status) {
		t.Helper()
		ao, bo := a.Outbox, b.Outbox
		if math.Abs(ao.OldestPendingAge-bo.OldestPendingAge) > 1 {
			t.Fatalf("%s: totals %+v, want %+v", what, bo, ao)
		}
		ao.OldestPendingAge, bo.OldestPendingAge = 0, 0
		if ao != bo || len(a.Shards) != len(b.Shards) || len(a.Topics) != len(b.Topics) {
			t.Fatalf("%s: %+v %+v, want %+v %+v", what, bo, b.Shards, ao, a.Shards)
		}
		for i := range a.Shards {
			x, y := a.Shards[i], b.Shards[i]
			if x.Topic != y.Topic || x.Shard != y.Shard || x.Pending != y.Pending || x.Dead != y.Dead || x.CountsCapped != y.CountsCapped ||
				math.Abs(x.OldestPendingAge-y.OldestPendingAge) > 1 {
				t.Fatalf("%s: shard %d %+v, want %+v", what, i, y, x)
			}
		}
		for i := range a.Topics {
			x, y := a.Topics[i], b.Topics[i]
			if x.Topic != y.Topic || x.Pending != y.Pending || x.Dead != y.Dead || math.Abs(x.OldestPendingAge-y.OldestPendingAge) > 1 {
				t.Fatalf("%s: topic %+v, want %+v", what, y, x)
			}
		}
	}

	// The status design: no watermark, no retry row.
	base := status()
	if base.Outbox.Pending != 44 || base.Outbox.Dead != 1 || base.Outbox.Discarded != 1 {
		t.Fatalf("status design: %+v", base.Outbox)
	}
	same("status design, bounded", base, status(ops.WithCountCap(1000)))
	countPending := func(limit int64) int64 {
		t.Helper()
		n, err := ops.CountPending(ctx, e.exec, tables, limit)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := countPending(1000); n != 44 {
		t.Fatalf("status design: CountPending %d, want 44", n)
	}
	// A watermark in use, but on a shard with no rows: the watermark
	// statements run and must read what the status design's did.
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (shard, sent_up_to) VALUES (99, 1000000000)`, tn("relay_leases")))
	same("watermark at no row", base, status())
	if n := countPending(1000); n != 44 {
		t.Fatalf("watermark at no row: CountPending %d, want 44", n)
	}
	same("watermark at no row, bounded", base, status(ops.WithCountCap(1000)))
	mustExec(t, e, fmt.Sprintf(`DELETE FROM %s WHERE shard = 99`, tn("relay_leases")))

	// The shard with the most pending rows gets a watermark halfway.
	var shard int
	if err := e.pg.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT shard FROM %s WHERE status = 'pending' GROUP BY shard ORDER BY count(*) DESC, shard LIMIT 1`, tn("outbox"))).Scan(&shard); err != nil {
		t.Fatal(err)
	}
	type row struct {
		id    int64
		event string
		topic string
	}
	var rows []row
	pr, err := e.pg.Pool.Query(ctx, fmt.Sprintf(`SELECT id, event_id::text, topic FROM %s WHERE status = 'pending' AND shard = $1 ORDER BY id`, tn("outbox")), shard)
	if err != nil {
		t.Fatal(err)
	}
	for pr.Next() {
		var r row
		if err := pr.Scan(&r.id, &r.event, &r.topic); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	pr.Close()
	if len(rows) < 6 {
		t.Fatalf("shard %d has %d pending rows; want at least 6", shard, len(rows))
	}
	mid := len(rows) / 2
	wm := rows[mid-1].id
	below, above := rows[:mid], rows[mid:]
	retry, sentOld := below[0], below[1]
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (shard, sent_up_to) VALUES ($1, $2)`, tn("relay_leases")), shard, wm)
	now := time.Now().UTC()
	mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'retry', created_at = $1 WHERE id = $2`, tn("outbox")), now.Add(-time.Hour), retry.id)
	// Sent by the watermark and older than anything unsent: a reader that
	// took status 'pending' for unsent would report it as the oldest.
	mustExec(t, e, fmt.Sprintf(`UPDATE %s SET created_at = $1 WHERE id = $2`, tn("outbox")), now.Add(-2*time.Hour), sentOld.id)

	// Expected: base, with the shard's pending rows at or below the
	// watermark gone but the retry one.
	wantShard := map[string]int64{}
	for _, r := range above {
		wantShard[r.topic]++
	}
	wantShard[retry.topic]++
	var wantTotal int64
	got := status()
	for _, s := range base.Shards {
		want := s.Pending
		if s.Shard == shard {
			want = wantShard[s.Topic]
		}
		wantTotal += want
	}
	if got.Outbox.Pending != wantTotal || got.Outbox.Pending != base.Outbox.Pending-int64(len(below))+1 {
		t.Fatalf("pending %d, want %d", got.Outbox.Pending, wantTotal)
	}
	// The negative check: status 'pending' or 'retry' counts more.
	if all := count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s WHERE status IN ('pending', 'retry')`, tn("outbox"))); all <= got.Outbox.Pending {
		t.Fatalf("test data: %d rows pending or retry, %d counted; no row is below the watermark", all, got.Outbox.Pending)
	}
	if n := countPending(1000); n != wantTotal {
		t.Fatalf("CountPending %d, want %d", n, wantTotal)
	}
	if n := countPending(3); n != 3 {
		t.Fatalf("CountPending up to 3: %d", n)
	}
	if got.Outbox.Dead != 1 || got.Outbox.Discarded != 1 {
		t.Fatalf("dead counts changed: %+v", got.Outbox)
	}
	if a := got.Outbox.OldestPendingAge; a < 3590 || a > 3700 {
		t.Fatalf("oldest pending age %.0f s, want the retry row's hour (the sent row is two hours old)", a)
	}
	sawShard := false
	for _, s := range got.Shards {
		if s.Shard != shard {
			continue
		}
		sawShard = true
		if s.Pending != wantShard[s.Topic] {
			t.Fatalf("shard %d topic %s: pending %d, want %d", shard, s.Topic, s.Pending, wantShard[s.Topic])
		}
		if s.Topic == retry.topic && (s.OldestPendingAge < 3590 || s.OldestPendingAge > 3700) {
			t.Fatalf("shard %d topic %s: oldest %.0f s, want the retry row's hour", shard, s.Topic, s.OldestPendingAge)
		}
	}
	if !sawShard {
		t.Fatalf("shard %d missing from %+v", shard, got.Shards)
	}
	same("watermark, bounded", got, status(ops.WithCountCap(1000)))

	// Capped at 2: the watermarked shard reports 2 and is marked, and its
	// oldest pending age stays the retry row's.
	capped := status(ops.WithCountCap(2))
	for _, s := range capped.Shards {
		if s.Shard == shard && s.Topic == retry.topic {
			if s.Pending != min(wantShard[s.Topic], 2) || s.CountsCapped != (wantShard[s.Topic] > 2) ||
				s.OldestPendingAge < 3590 || s.OldestPendingAge > 3700 {
				t.Fatalf("capped shard %+v, want pending %d", s, wantShard[s.Topic])
			}
		}
	}

	// The collector's per-topic gauges.
	reg := prometheus.NewRegistry()
	reg.MustRegister(ops.NewCollector(e.ops))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gauges := map[string]map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "topic" {
					if gauges[f.GetName()] == nil {
						gauges[f.GetName()] = map[string]float64{}
					}
					gauges[f.GetName()][l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	for _, tp := range got.Topics {
		if g := gauges[ops.MetricTopicPending][tp.Topic]; g != float64(tp.Pending) {
			t.Fatalf("%s{topic=%q} = %v, want %d", ops.MetricTopicPending, tp.Topic, g, tp.Pending)
		}
		if g := gauges[ops.MetricTopicOldestPending][tp.Topic]; math.Abs(g-tp.OldestPendingAge) > 5 {
			t.Fatalf("%s{topic=%q} = %v, want %.0f", ops.MetricTopicOldestPending, tp.Topic, g, tp.OldestPendingAge)
		}
	}
	if g := gauges[ops.MetricTopicOldestPending][retry.topic]; g < 3590 {
		t.Fatalf("%s{topic=%q} = %v, want the retry row's hour", ops.MetricTopicOldestPending, retry.topic, g)
	}

	// Rows as operators read them: their state.
	for _, c := range []struct {
		event, want string
	}{{retry.event, "pending"}, {sentOld.event, "sent"}, {below[mid-1].event, "sent"}, {above[0].event, "pending"},
		{evs[0].ID.String(), "sent"}, {evs[2].ID.String(), "dead"}} {
		m, err := e.ops.Message(ctx, c.event)
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != c.want {
			t.Fatalf("message %s (id %d, watermark %d): status %q, want %q", c.event, m.ID, wm, m.Status, c.want)
		}
	}
	search := func(status string) map[string]string {
		t.Helper()
		out := map[string]string{}
		q := ops.OutboxQuery{Status: status, Limit: 5}
		for range 40 {
			p, err := e.ops.SearchOutbox(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range p.Rows {
				if _, dup := out[m.EventID]; dup {
					t.Fatalf("search %s: %s twice", status, m.EventID)
				}
				out[m.EventID] = m.Status
			}
			if p.NextCursor == "" {
				return out
			}
			q.After = p.NextCursor
		}
		t.Fatal("no end of pages")
		return nil
	}
	pending, sent := search("pending"), search("sent")
	if int64(len(pending)) != wantTotal || len(sent) != 2+len(below)-1 {
		t.Fatalf("search: %d pending (want %d), %d sent (want %d)", len(pending), wantTotal, len(sent), 2+len(below)-1)
	}
	for id, st := range pending {
		if st != "pending" {
			t.Fatalf("search pending: %s is %q", id, st)
		}
	}
	for id, st := range sent {
		if st != "sent" {
			t.Fatalf("search sent: %s is %q", id, st)
		}
	}
	if _, ok := pending[retry.event]; !ok {
		t.Fatal("search pending: the retry row is missing")
	}
	if _, ok := sent[sentOld.event]; !ok {
		t.Fatal("search sent: the row below the watermark is missing")
	}
}
