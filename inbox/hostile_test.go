package inbox

// Hostile-input defects of issue 21 (items 3, 5, 6 and 7), each on a real
// broker where the defect lives in the broker path.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
)

// Item 5: the gap error of an aggregate the consumer has never seen names
// sequence 1 as the next expected (it said 0), on the single-message path
// and on the batch path (bulk claim on Postgres), and the known-cursor case
// still names cursor + 1.
func TestGapErrorNamesNextExpectedSequence(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil)
			mustDeliver(t, ib, event(t, "acme", "never-seen", 2, "x"))
			mustDeliver(t, ib, event(t, "acme", "known", 1, "x"))
			mustDeliver(t, ib, event(t, "acme", "known", 3, "x"))
			rec := &settled{}
			batch := []*message{newMessage(delivery(event(t, "acme", "batch-a", 3, "x"), 1, rec)),
				newMessage(delivery(event(t, "acme", "batch-b", 5, "x"), 1, rec))}
			if err := ib.process(context.Background(), batch); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"never-seen": "expected sequence 1, got 2",
				"known":      "expected sequence 2, got 3",
				"batch-a":    "expected sequence 1, got 3",
				"batch-b":    "expected sequence 1, got 5",
			}
			gaps := openParked(t, ib, ReasonGap)
			if len(gaps) != len(want) {
				t.Fatalf("open gaps = %d, want %d: %+v", len(gaps), len(want), gaps)
			}
			for _, g := range gaps {
				if w := want[g.Event.AggregateID]; g.LastError != w {
					t.Errorf("aggregate %s: gap error %q, want %q", g.Event.AggregateID, g.LastError, w)
				}
			}
		})
	}
}

// newStream gives a test (or a trial) a stream and subject of its own on
// the stack's server.
func (s *natsStack) newStream(t testing.TB) (stream, subject string) {
	t.Helper()
	suffix := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	stream, subject = "INBOXTEST_"+suffix, "inboxtest."+suffix+".order.events"
	if _, err := natsjs.EnsureStream(context.Background(), s.pub.JetStream(), natsjs.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.pub.JetStream().DeleteStream(context.Background(), stream) })
	return stream, subject
}

// runOn runs ib on c until cond holds (or 60s pass: -race on a loaded
// machine is slow; nothing here depends on speed).
func runOn[TTx any](t *testing.T, ib *Inbox[TTx], c broker.Consumer, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(ctx, c) }()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("condition not reached; stats %+v", ib.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Item 3: two messages with the same (tenant, event id) and different
// content, on different aggregates, so on different workers. The copy
// published first in the stream is the original and is applied; the later
// one is parked as a collision — in every trial, whether the original's
// worker is idle (a pure race between two workers) or busy with earlier
// events of its aggregate (then, before the fix, the copy's idle worker
// claimed first almost every time).
func TestCollisionFirstInStreamOrderWinsAcrossWorkers(t *testing.T) {
	s := newNATSStack(t, "")
	const trials = 30
	lost := 0
	for i := range trials {
		tenant := fmt.Sprintf("race%d", i)
		ib, err := New[pgx.Tx](s.drv, fmt.Sprintf("race-%d", i), pgxEffect, WithWorkers(8),
			WithLogger(testLogger(t)), WithBackoff(10*time.Millisecond, 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		routeOf := func(agg string) int {
			return ib.route(&message{ev: ferry.Event{TenantID: tenant, AggregateType: "order", AggregateID: agg}})
		}
		aggB := ""
		for j := 0; aggB == ""; j++ {
			if b := fmt.Sprintf("b%d", j); routeOf(b) != routeOf("a") {
				aggB = b
			}
		}
		backlog := i % 4 // 0: both workers idle; else the original's worker has earlier events to apply first
		var evs []ferry.Event
		for seq := 1; seq <= backlog; seq++ {
			evs = append(evs, event(t, tenant, "a", int64(seq), "earlier"))
		}
		orig := event(t, tenant, "a", int64(backlog+1), "original")
		dup := event(t, tenant, aggB, 1, "copy")
		dup.ID = orig.ID
		stream, subject := s.newStream(t)
		for _, ev := range append(evs, orig, dup) {
			m := natsMsg(ev, subject)
			if ev.AggregateID == aggB {
				// JetStream would drop the copy as a duplicate of the
				// original's Nats-Msg-Id within the stream's dedup window;
				// a producer that reuses an event id later (or through
				// another path) gets both into the stream.
				m.Header.Set(nats.MsgIdHdr, uuid.NewString())
			}
			if _, err := s.pub.JetStream().PublishMsg(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
		c, err := natsjs.DialConsumer(context.Background(), s.url, stream, "race", natsjs.WithAckWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		runOn(t, ib, c, func() bool {
			st := ib.Stats()
			return st.Applied == int64(backlog+1) && st.Parked[ReasonCollision] == 1
		})
		_ = c.Close()
		var payload string
		if err := s.drv.Pool().QueryRow(context.Background(), `SELECT payload FROM effects WHERE event_id = $1`, orig.ID.String()).Scan(&payload); err != nil {
			t.Fatal(err)
		}
		ps, err := ib.ListParked(context.Background(), ParkedFilter{Reason: ReasonCollision})
		if err != nil || len(ps) != 1 {
			t.Fatalf("trial %d: collision rows %+v %v", i, ps, err)
		}
		if payload != "original" || string(ps[0].Event.Payload) != "copy" || ps[0].Event.AggregateID != aggB {
			lost++
			t.Logf("trial %d (backlog %d): applied %q, parked %q on %s", i, backlog, payload, ps[0].Event.Payload, ps[0].Event.AggregateID)
		}
	}
	if lost > 0 {
		t.Fatalf("the copy later in the stream was applied (the original parked) in %d of %d trials", lost, trials)
	}
}

// natsMsg builds the NATS message Ferry's publisher would send for ev,
// through the codec, so a test can then tamper with its headers.
func natsMsg(ev ferry.Event, subject string) *nats.Msg {
	h, body := cloudevents.Encode(cloudevents.NATS, ev, cloudevents.EncodeOptions{})
	m := nats.NewMsg(subject)
	for k, v := range h {
		m.Header.Set(k, v)
	}
	m.Header.Set(nats.MsgIdHdr, ev.ID.String())
	m.Data = body
	return m
}

// Item 6: a CloudEvents attribute given twice (a repeated NATS header) is
// ambiguous: the message is parked as undecodable, the error naming the
// attribute, the raw headers keeping both values; nothing is applied. A
// repeated header that is not an attribute is harmless.
func TestNATSRepeatedAttributeHeaderParked(t *testing.T) {
	s := newNATSStack(t, "")
	js := s.pub.JetStream()
	bad := event(t, "acme", "o1", 1, `{"n":1}`)
	m := natsMsg(bad, s.subject)
	m.Header.Add("ce-tenantid", "victim")
	ct := event(t, "acme", "o2", 1, `{"n":2}`)
	m2 := natsMsg(ct, s.subject)
	m2.Header.Add("content-type", "text/plain")
	ok := event(t, "acme", "o3", 1, `{"n":3}`)
	m3 := natsMsg(ok, s.subject)
	m3.Header.Add("x-app-tag", "one")
	m3.Header.Add("x-app-tag", "two")
	// NATS header names are case-sensitive: a second tenant under another
	// case is the same attribute given twice (the exact-case one used to win).
	cased := event(t, "acme", "o4", 1, `{"n":4}`)
	m4 := natsMsg(cased, s.subject)
	m4.Header.Set("CE-TENANTID", "victim")
	for _, msg := range []*nats.Msg{m, m2, m3, m4} {
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	ib := s.inbox(t)
	s.runUntil(t, ib, func() bool { st := ib.Stats(); return st.Parked[ReasonUndecodable] == 3 && st.Applied == 1 })
	if got := s.effectSeqs(t, ""); len(got) != 1 {
		t.Fatalf("effects %v, want only the clean message's", got)
	}
	if got := s.effectSeqs(t, ok.ID.String()); len(got) != 1 {
		t.Fatalf("the message with a repeated non-attribute header was not applied: %v", got)
	}
	ps, err := ib.ListParked(context.Background(), ParkedFilter{Reason: ReasonUndecodable})
	if err != nil || len(ps) != 3 {
		t.Fatalf("parked %+v %v", ps, err)
	}
	byAttr := map[string]Parked{}
	for _, p := range ps {
		if strings.Contains(p.LastError, "attribute tenantid") && strings.Contains(p.LastError, "differing in case") {
			byAttr["cased"] = p
		}
	}
	if _, found := byAttr["cased"]; !found {
		t.Fatalf("no undecodable row naming tenantid under two cases: %+v", ps)
	}
	for _, p := range ps {
		switch {
		case strings.Contains(p.LastError, "attribute tenantid") && strings.Contains(p.LastError, "given"):
			byAttr["tenantid"] = p
		case strings.Contains(p.LastError, "attribute datacontenttype"):
			byAttr["datacontenttype"] = p
		}
	}
	p, found := byAttr["tenantid"]
	if !found || !strings.Contains(p.LastError, "2 values") {
		t.Fatalf("no undecodable row naming tenantid given twice: %+v", ps)
	}
	if !strings.Contains(p.Raw.Headers, `"ce-tenantid":"acme, victim"`) {
		t.Fatalf("raw headers %s do not keep both values", p.Raw.Headers)
	}
	if _, found := byAttr["datacontenttype"]; !found {
		t.Fatalf("no undecodable row naming datacontenttype given twice: %+v", ps)
	}
}

// Item 6 on Kafka: record headers may repeat a key too; the adapter used
// to keep the last value silently.
func TestKafkaRepeatedAttributeHeaderParked(t *testing.T) {
	const topic = "order.events"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ev := event(t, "acme", "o1", 1, `{"n":1}`)
	h, body := cloudevents.Encode(cloudevents.Kafka, ev, cloudevents.EncodeOptions{})
	rec := &kgo.Record{Topic: topic, Key: []byte(ferry.AggregateKey(ev.TenantID, ev.AggregateType, ev.AggregateID)), Value: body}
	for k, v := range h {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	// The hostile copy repeats the tenant and a partition key that matches
	// it: before the fix the adapter kept the last value of each and
	// applied the event as tenant victim.
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: "ce_tenantid", Value: []byte("victim")},
		kgo.RecordHeader{Key: "ce_partitionkey", Value: []byte(ferry.AggregateKey("victim", ev.AggregateType, ev.AggregateID))})
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	st := stores(t)
	s := st[len(st)-1] // sqlite
	c, err := kafka.NewConsumer(cluster.ListenAddrs(), "shipping", []string{topic}, kafka.WithCommitInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ib := newInbox(t, s, nil)
	runOn(t, ib, c, func() bool { return ib.Stats().Parked[ReasonUndecodable] == 1 })
	if es := effects(t, s.db); len(es) != 0 {
		t.Fatalf("applied %+v", es)
	}
	ps := openParked(t, ib, ReasonUndecodable)
	// Both attributes are repeated; the first in name order is named.
	if len(ps) != 1 || !strings.Contains(ps[0].LastError, "attribute partitionkey") || !strings.Contains(ps[0].LastError, "given 2 values") {
		t.Fatalf("parked %+v, want one undecodable row naming partitionkey given twice", ps)
	}
	if !strings.Contains(ps[0].Raw.Headers, `"ce_tenantid":"acme, victim"`) {
		t.Fatalf("raw headers %s do not keep both values", ps[0].Raw.Headers)
	}
}

// Item 7: the consumer refuses what the producer would refuse — a payload
// over the limit (5 MB against the 256 KiB default) and a content type not
// in the list — parking it as undecodable with the field and the limit in
// the reason; WithLimits raises the limits to what a producer configured.
func TestNATSConsumerLimits(t *testing.T) {
	const unknownCT = "application/x-unheard-of"
	publish := func(s *natsStack) (big, odd, fine ferry.Event) {
		big = event(t, "acme", "big", 1, "")
		big.Payload = []byte(`"` + strings.Repeat("x", 5<<20) + `"`)
		odd = event(t, "acme", "odd", 1, "hello")
		odd.ContentType = unknownCT
		fine = event(t, "acme", "fine", 1, `{"n":1}`)
		s.publish(t, big, odd, fine)
		return big, odd, fine
	}
	t.Run("defaults", func(t *testing.T) {
		s := newNATSStack(t, "", natsembed.WithMaxPayload(8<<20))
		_, _, fine := publish(s)
		ib := s.inbox(t)
		runOn(t, ib, s.consumer(t), func() bool { st := ib.Stats(); return st.Parked[ReasonUndecodable] == 2 && st.Applied == 1 })
		if got := s.effectSeqs(t, ""); len(got) != 1 || len(s.effectSeqs(t, fine.ID.String())) != 1 {
			t.Fatalf("effects %v, want only the event within the limits", got)
		}
		ps, err := ib.ListParked(context.Background(), ParkedFilter{Reason: ReasonUndecodable})
		if err != nil || len(ps) != 2 {
			t.Fatalf("parked %+v %v", ps, err)
		}
		var sawSize, sawCT bool
		for _, p := range ps {
			switch p.Event.AggregateID {
			case "big":
				sawSize = strings.Contains(p.LastError, "payload") && strings.Contains(p.LastError, "exceeds the limit of 262144 bytes")
				if len(p.Raw.Body) > 64<<10 {
					t.Errorf("raw body kept %d bytes, more than the raw limit", len(p.Raw.Body))
				}
			case "odd":
				sawCT = strings.Contains(p.LastError, "content_type") && strings.Contains(p.LastError, unknownCT)
			}
			t.Logf("parked %s: %s", p.Event.AggregateID, p.LastError)
		}
		if !sawSize || !sawCT {
			t.Fatalf("reasons do not name the field and the limit: %+v", ps)
		}
	})
	t.Run("raised", func(t *testing.T) {
		s := newNATSStack(t, "", natsembed.WithMaxPayload(8<<20))
		publish(s)
		ib := s.inbox(t, WithLimits(ferry.Limits{MaxPayloadBytes: 6 << 20, ContentTypes: append(ferry.DefaultContentTypes(), unknownCT)}))
		runOn(t, ib, s.consumer(t), func() bool { return ib.Stats().Applied == 3 })
		if st := ib.Stats(); len(st.Parked) != 0 {
			t.Fatalf("parked %+v with raised limits", st.Parked)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		st := stores(t)
		_, err := New[*sql.Tx](st[len(st)-1].drv, "shipping", writeEffect, WithLimits(ferry.Limits{MaxPayloadBytes: -1}))
		var ce *ferry.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(ce.Field, "max_payload_bytes") {
			t.Fatalf("negative limit: err = %v, want a ConfigError naming max_payload_bytes", err)
		}
	})
}
