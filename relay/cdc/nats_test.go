package cdc_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/relay/cdc"
)

// natsSink is an embedded JetStream server with one stream for the test
// topic; it can be shut down and restarted (same port and store).
type natsSink struct {
	t      testing.TB
	srv    *natsembed.Server
	stream string
}

func startNATS(t testing.TB, maxMsgSize int32) *natsSink {
	t.Helper()
	srv, err := natsembed.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	nc, err := natsjs.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{testTopic}, MaxMsgSize: maxMsgSize}); err != nil {
		t.Fatal(err)
	}
	return &natsSink{t: t, srv: srv, stream: "ORDERS"}
}

func (n *natsSink) publisher() *natsjs.Publisher {
	n.t.Helper()
	p, err := natsjs.DialPublisher(n.srv.ClientURL(), natsjs.WithAckTimeout(2*time.Second))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = p.Close() })
	return p
}

// read returns the stream's messages in stream order, polling until done.
func (n *natsSink) read(timeout time.Duration, done func([]record) bool) []record {
	n.t.Helper()
	nc, err := natsjs.Connect(n.srv.ClientURL())
	if err != nil {
		n.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		n.t.Fatal(err)
	}
	var out []record
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := js.Stream(ctx, n.stream)
		if err != nil {
			cancel()
			n.t.Fatal(err)
		}
		last := s.CachedInfo().State.LastSeq
		for seq := uint64(len(out)) + 1; seq <= last; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				cancel()
				n.t.Fatalf("get msg %d: %v", seq, err)
			}
			rec := record{id: m.Header.Get("ce-id"), key: m.Header.Get("ce-partitionkey"), offset: int64(seq)}
			rec.seq, _ = strconv.ParseInt(m.Header.Get("ce-sequence"), 10, 64)
			out = append(out, rec)
		}
		cancel()
		if done(out) || time.Now().After(deadline) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failCounting counts failed publish results.
type failCounting struct {
	*countingPublisher
	failed atomic.Int64
}

func (f *failCounting) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	res := f.countingPublisher.Publish(ctx, events)
	for _, r := range res {
		if r.Err != nil {
			f.failed.Add(1)
		}
	}
	return res
}

// Broker down: while the broker refuses, the slot's confirmed position does
// not move and nothing is acknowledged to Postgres; a relay restarted after
// the outage (the first one stopped while the broker was still down)
// publishes every event. With ConfirmBeforeAck (the negative control) the
// same sequence loses the outage's events.
func TestBrokerDown(t *testing.T) {
	for _, tc := range []struct {
		name     string
		faults   cdc.Faults
		wantLoss bool
	}{
		{"safe", cdc.Faults{}, false},
		{"negative_control_confirm_before_ack", cdc.Faults{ConfirmBeforeAck: true, NoReconcile: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			n := startNATS(t, 0)
			pub := &failCounting{countingPublisher: newCounting(n.publisher())}
			reg := prometheus.NewRegistry()
			r, stop := h.start(pub, cdc.WithFaults(tc.faults), cdc.WithRegisterer(reg), cdc.WithLagAlert(1<<40, 500*time.Millisecond))
			before := h.insert(ctx, 10, 3)
			n.read(60*time.Second, allDelivered(before))
			waitFor(t, 60*time.Second, "rows marked sent", func() bool { return h.statusCounts(ctx)["sent"] == 10 })

			n.srv.Shutdown()
			during := h.insert(ctx, 5, 3)
			waitFor(t, 60*time.Second, "a failed publish attempt", func() bool { return pub.failed.Load() > 0 })
			time.Sleep(400 * time.Millisecond) // any status update sent before the attempt has landed
			c1 := h.confirmed(ctx)
			during = append(during, h.insert(ctx, 10, 3)...)
			time.Sleep(1500 * time.Millisecond)
			c2 := h.confirmed(ctx)
			if !tc.wantLoss && c2 != c1 {
				t.Fatalf("slot confirmed position moved during the outage: %s -> %s", c1, c2)
			}
			if got := h.statusCounts(ctx)["sent"]; got != 10 {
				t.Fatalf("%d rows marked sent during the outage, want 10", got)
			}
			calls := pub.calls.Load()
			time.Sleep(time.Second)
			if d := pub.calls.Load() - calls; d > 15 {
				t.Errorf("%d publish attempts in 1s of outage: retry storm (backoff max 300ms)", d)
			}
			if !tc.wantLoss {
				// The stuck slot shows as lag and raises the age alert.
				st := r.Status()
				if st.LagBytes <= 0 || st.LagSeconds < 1 || st.WALStatus == "" {
					t.Errorf("during the outage Status() = lag %d bytes, %.1fs, wal_status %q; want positive lag, >= 1s", st.LagBytes, st.LagSeconds, st.WALStatus)
				}
				if got := gather(t, reg, "ferry_cdc_slot_lag_seconds"); got < 1 {
					t.Errorf("ferry_cdc_slot_lag_seconds = %v during the outage, want >= 1", got)
				}
				if got := gather(t, reg, "ferry_cdc_lag_alerts_total"); got < 1 {
					t.Errorf("ferry_cdc_lag_alerts_total = %v, want >= 1 (age threshold 500ms)", got)
				}
				if got := gather(t, reg, "ferry_cdc_publish_retries_total"); got < 1 {
					t.Errorf("ferry_cdc_publish_retries_total = %v, want >= 1", got)
				}
			}
			stop()

			if err := n.srv.Restart(); err != nil {
				t.Fatal(err)
			}
			pub2 := n.publisher()
			_, stop2 := h.start(pub2)
			defer stop2()
			all := append(before, during...)
			wait := 15 * time.Second
			if tc.wantLoss {
				wait = 3 * time.Second
			}
			got := n.read(wait, allDelivered(all))
			v := judge(all, got)
			if tc.wantLoss {
				if v.lost == 0 {
					t.Fatalf("confirming before the broker ack lost nothing (%d events): the safe test could not catch it", len(all))
				}
				return
			}
			if v.lost != 0 || v.phantom != 0 || v.orderViolations != 0 {
				t.Fatalf("after recovery: lost=%d phantom=%d order=%d", v.lost, v.phantom, v.orderViolations)
			}
			waitFor(t, 60*time.Second, "all rows sent", func() bool { return h.statusCounts(ctx)["sent"] == len(all) })
			waitFor(t, 60*time.Second, "slot confirmed past the outage", func() bool { return h.confirmed(ctx) > c2 })
		})
	}
}

// An idle outbox on a busy database: business transactions (and
// heartbeats) produce no messages, yet the slot's confirmed position keeps
// up with the WAL, so the slot does not pin it. Without idle advancing
// (negative control) it stays put.
func TestIdleOutboxAdvancesSlot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		faults  cdc.Faults
		advance bool
	}{
		{"safe", cdc.Faults{}, true},
		{"negative_control_no_idle_advance", cdc.Faults{NoIdleAdvance: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			n := startNATS(t, 0)
			pub := newCounting(n.publisher())
			r, _ := h.start(pub, cdc.WithFaults(tc.faults), cdc.WithHeartbeat(50*time.Millisecond))
			start := h.confirmed(ctx)
			for i := range 300 {
				if _, err := h.s.Pool.Exec(ctx, `INSERT INTO orders (id, note) VALUES ($1, repeat('x', 500))`, fmt.Sprintf("b-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			target := h.currentWAL(ctx)
			if tc.advance {
				waitFor(t, 15*time.Second, "slot confirmed past the business writes", func() bool { return h.confirmed(ctx) >= target })
				waitFor(t, 5*time.Second, "lag sampled", func() bool { return !r.Status().SampledAt.IsZero() })
			} else {
				time.Sleep(2 * time.Second)
				if c := h.confirmed(ctx); c >= target || c != start {
					t.Fatalf("without idle advance the slot still moved %s -> %s (target %s): the safe test proves nothing", start, c, target)
				}
			}
			if c := pub.calls.Load(); c != 0 {
				t.Fatalf("%d publish calls for business-only transactions and heartbeats, want 0", c)
			}
			if got := n.read(200*time.Millisecond, func([]record) bool { return false }); len(got) != 0 {
				t.Fatalf("broker holds %d messages, want 0", len(got))
			}
		})
	}
}

// A slot dropped while no relay runs is detected (alert, metric,
// Status().SlotLosses) and the rows committed meanwhile are re-published
// from the table. With NoCatchUp (the negative control) they are lost.
func TestSlotDroppedWhileStopped(t *testing.T) {
	for _, tc := range []struct {
		name     string
		faults   cdc.Faults
		wantLoss bool
	}{
		{"safe", cdc.Faults{}, false},
		{"negative_control_no_catch_up", cdc.Faults{NoCatchUp: true, NoReconcile: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			n := startNATS(t, 0)
			_, stop := h.start(n.publisher())
			before := h.insert(ctx, 10, 3)
			n.read(60*time.Second, allDelivered(before))
			waitFor(t, 60*time.Second, "rows marked sent", func() bool { return h.statusCounts(ctx)["sent"] == 10 })
			stop()

			while := h.insert(ctx, 15, 3)
			if _, err := h.s.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, h.slot); err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			r, _ := h.start(n.publisher(), cdc.WithRegisterer(reg), cdc.WithFaults(tc.faults))
			after := h.insert(ctx, 5, 3)
			all := append(append(before, while...), after...)
			wait := 10 * time.Second
			if tc.wantLoss {
				wait = 3 * time.Second
			}
			got := n.read(wait, allDelivered(all))
			v := judge(all, got)
			if tc.wantLoss {
				if v.lost == 0 {
					t.Fatal("without catch-up nothing was lost: the safe test proves nothing")
				}
				return
			}
			if v.lost != 0 || v.orderViolations != 0 || v.phantom != 0 {
				t.Fatalf("after slot loss: %+v", v)
			}
			if st := r.Status(); st.SlotLosses != 1 {
				t.Fatalf("Status().SlotLosses = %d, want 1", st.SlotLosses)
			}
			if got := gather(t, reg, "ferry_cdc_slot_lost_total"); got != 1 {
				t.Fatalf("ferry_cdc_slot_lost_total = %v, want 1", got)
			}
			if got := gather(t, reg, "ferry_cdc_catchup_events_total"); got != 15 {
				t.Errorf("ferry_cdc_catchup_events_total = %v, want 15 (the rows committed while the slot was gone)", got)
			}
			info, err := cdc.Inspect(ctx, h.s.Pool, h.tables, h.slot)
			if err != nil {
				t.Fatal(err)
			}
			if !info.Exists || !info.Active || !info.Recorded || info.LostCount != 1 || info.LostAt == nil || info.WALStatus == "" {
				t.Fatalf("Inspect after recovery: %+v; want an active recreated slot with lost_count 1", info)
			}
			waitFor(t, 60*time.Second, "catch-up marker cleared", func() bool {
				info, err := cdc.Inspect(ctx, h.s.Pool, h.tables, h.slot)
				return err == nil && !info.CatchUpNeeded
			})
			waitFor(t, 60*time.Second, "all rows sent", func() bool { return h.statusCounts(ctx)["sent"] == len(all) })
		})
	}
}

func gather(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				if c := m.GetCounter(); c != nil {
					sum += c.GetValue()
				} else if g := m.GetGauge(); g != nil {
					sum += g.GetValue()
				}
			}
			return sum
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// A second relay on the same slot waits as standby (Postgres refuses a
// second consumer) and takes over when the first stops.
func TestStandbyTakesOver(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	n := startNATS(t, 0)
	a, stopA := h.start(newCounting(n.publisher()))
	pubB := newCounting(n.publisher())
	b, err := cdc.New(h.s.URL, pubB, h.relayOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancelB := context.WithCancel(ctx)
	bdone := make(chan error, 1)
	go func() { bdone <- b.Run(bctx) }()
	defer func() {
		cancelB()
		if err := <-bdone; err != nil {
			t.Errorf("relay b: %v", err)
		}
	}()
	bstate := func() any { return fmt.Sprintf("a=%+v b=%+v", a.Status(), b.Status()) }
	waitForState(t, 20*time.Second, "b standing by", func() bool { return b.Status().Role == cdc.RoleStandby }, bstate)
	first := h.insert(ctx, 10, 2)
	if v := judge(first, n.read(20*time.Second, allDelivered(first))); v.lost != 0 {
		t.Fatalf("a did not publish the first batch: %+v; %v", v, bstate())
	}
	if b.Status().Role != cdc.RoleStandby || pubB.calls.Load() != 0 {
		t.Fatalf("standby published while the active relay held the slot: role %s, calls %d", b.Status().Role, pubB.calls.Load())
	}
	if a.Status().Role != cdc.RoleActive {
		t.Fatalf("a: role %s", a.Status().Role)
	}
	stopA()
	waitForState(t, 20*time.Second, "b active", func() bool { return b.Status().Role == cdc.RoleActive }, bstate)
	second := h.insert(ctx, 10, 2)
	all := append(first, second...)
	got := n.read(20*time.Second, allDelivered(all))
	if v := judge(all, got); v.lost != 0 || v.orderViolations != 0 || v.phantom != 0 {
		t.Fatalf("after takeover: %+v; %v", v, bstate())
	}
	if pubB.ackedCount() < len(second) {
		t.Fatalf("b acked %d events, want >= %d", pubB.ackedCount(), len(second))
	}
}

// A permanent broker refusal (message larger than the stream allows)
// marks that row dead with the reason and counts it; the relay continues
// with everything else (CDC mode does not hold the aggregate).
func TestPermanentFailureMarksDead(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	n := startNATS(t, 1024)
	reg := prometheus.NewRegistry()
	r, _ := h.start(n.publisher(), cdc.WithRegisterer(reg))
	small := h.insert(ctx, 3, 1)
	big := event("o-0")
	big.Payload = []byte(`"` + strings.Repeat("x", 4000) + `"`)
	bigs, err := h.w.Insert(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	more := h.insert(ctx, 3, 1)
	ok := append(small, more...)
	got := n.read(60*time.Second, allDelivered(ok))
	if v := judge(ok, got); v.lost != 0 || v.phantom != 0 {
		t.Fatalf("%+v", v)
	}
	waitFor(t, 60*time.Second, "rows recorded", func() bool {
		c := h.statusCounts(ctx)
		return c["sent"] == 6 && c["dead"] == 1
	})
	var status, lastErr string
	if err := h.s.Pool.QueryRow(ctx, fmt.Sprintf(`SELECT status, last_error FROM %s WHERE event_id = $1`, h.tables.Name("outbox")), bigs[0].ID).Scan(&status, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "dead" || !strings.Contains(lastErr, "permanent") || strings.Contains(lastErr, "xxxx") {
		t.Fatalf("big row: status %q, last_error %q (want dead, a permanent reason, no payload)", status, lastErr)
	}
	if r.Status().Dead != 1 || gather(t, reg, "ferry_cdc_dead_total") != 1 {
		t.Fatalf("dead count: Status().Dead %d, ferry_cdc_dead_total %v, want 1", r.Status().Dead, gather(t, reg, "ferry_cdc_dead_total"))
	}
}

// Every field survives the trip table → WAL (pgoutput text form) →
// CloudEvents → broker: the same event the polling relay would publish,
// including binary payload bytes, headers and microsecond occurred_at.
func TestEventFieldsRoundTrip(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	n := startNATS(t, 0)
	h.start(n.publisher())
	in := ferry.Event{TenantID: "tenant-1", AggregateType: "order", AggregateID: "o-42.x_y", EventType: "order.created",
		SchemaVersion: 3, ContentType: "application/octet-stream", Payload: []byte{0, 1, 2, 0xff, 0xfe, '\\', 'x', '\n'},
		OccurredAt: time.Date(2026, 11, 30, 12, 34, 56, 123456000, time.UTC),
		Headers: ferry.Headers{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", CorrelationID: "corr-1",
			CausationID: "cause-1", Principal: "user:alice", Action: "order.create", Target: "order/42"}}
	out, err := h.w.Insert(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	want := out[0]
	nc, err := natsjs.Connect(n.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var msg *jetstream.RawStreamMsg
	waitFor(t, 60*time.Second, "message stored", func() bool {
		s, err := js.Stream(ctx, n.stream)
		if err != nil {
			return false
		}
		msg, err = s.GetMsg(ctx, 1)
		return err == nil
	})
	hdr := map[string]string{}
	for k, v := range msg.Header {
		hdr[strings.ToLower(k)] = v[0]
	}
	got, err := cloudevents.Decode(cloudevents.NATS, hdr, msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !got.OccurredAt.Equal(want.OccurredAt) {
		t.Fatalf("occurred_at %v, want %v", got.OccurredAt, want.OccurredAt)
	}
	got.OccurredAt = want.OccurredAt
	// The topic is the message's subject; the shard is not on the wire.
	got.Topic, want.Shard = msg.Subject, 0
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("decoded event differs:\n got %+v\nwant %+v", got, want)
	}
}
