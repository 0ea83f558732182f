package natsjs

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

// TestInteropCloudEventsSDK reads every message the Publisher stored back
// from the stream (by the sequence in its receipt) and decodes it with the
// official CloudEvents Go SDK's NATS JetStream binding: the event must be
// binary mode, valid, and carry every attribute and extension Ferry wrote.
func TestInteropCloudEventsSDK(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			stream, prefix := newStream(t, nc)
			p, err := NewPublisher(nc, WithSource("ferry://orders-service"))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			topic := prefix + ".events"
			full := testEvent(t, topic, "order-1", 1)
			full.Headers = ferry.Headers{
				Traceparent:   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
				CorrelationID: "corr-7", CausationID: "cmd-3",
				Principal: "user:alice", Action: "order.create", Target: "order/order-1",
			}
			minimal := testEvent(t, topic, "order-2", 1)
			minimal.Payload = []byte(`{}`)
			text := testEvent(t, topic, "order-3", 12)
			text.ContentType, text.Payload, text.SchemaVersion = "text/plain", []byte("hello"), 3
			evs := []ferry.Event{full, minimal, text}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res := p.Publish(ctx, evs)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, stream)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Err != nil {
					t.Fatal(r.Err)
				}
				raw, err := st.GetMsg(ctx, uint64(r.Receipt.Offset))
				if err != nil {
					t.Fatal(err)
				}
				msg := &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
				if got := msg.Header.Get(jetstream.MsgIDHeader); got != evs[i].ID.String() {
					t.Errorf("Nats-Msg-Id = %q, want event id %s", got, evs[i].ID)
				}
				checkSDK(t, msg, evs[i])
			}
		})
	}
}

func checkSDK(t *testing.T, msg *nats.Msg, want ferry.Event) {
	t.Helper()
	m := cejs.NewMessage(msg)
	if enc := m.ReadEncoding(); enc != binding.EncodingBinary {
		t.Fatalf("SDK sees encoding %v, want binary", enc)
	}
	ev, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		t.Fatalf("SDK ToEvent: %v", err)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("SDK Validate: %v", err)
	}
	check := func(name, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	check("specversion", ev.SpecVersion(), "1.0")
	check("id", ev.ID(), want.ID.String())
	check("source", ev.Source(), "ferry://orders-service")
	check("type", ev.Type(), want.EventType)
	check("subject", ev.Subject(), want.AggregateID)
	check("datacontenttype", ev.DataContentType(), want.ContentType)
	check("dataschema", ev.DataSchema(), "")
	if !ev.Time().Equal(want.OccurredAt) {
		t.Errorf("time = %v, want %v", ev.Time(), want.OccurredAt)
	}
	if !bytes.Equal(ev.Data(), want.Payload) {
		t.Errorf("data = %q, want %q", ev.Data(), want.Payload)
	}
	exts := map[string]string{
		"sequence":      fmt.Sprint(want.AggregateSeq),
		"partitionkey":  ferry.AggregateKey(want.TenantID, want.AggregateType, want.AggregateID),
		"tenantid":      want.TenantID,
		"aggregatetype": want.AggregateType,
		"schemaversion": fmt.Sprint(want.SchemaVersion),
		"traceparent":   want.Headers.Traceparent,
		"correlationid": want.Headers.CorrelationID,
		"causationid":   want.Headers.CausationID,
		"principal":     want.Headers.Principal,
		"action":        want.Headers.Action,
		"target":        want.Headers.Target,
	}
	got := ev.Extensions()
	for name, v := range exts {
		raw, ok := got[name]
		if v == "" {
			if ok {
				t.Errorf("extension %s present (%v) for an empty field", name, raw)
			}
			continue
		}
		if !ok {
			t.Errorf("extension %s missing (extensions: %v)", name, got)
			continue
		}
		s, err := types.ToString(raw)
		if err != nil {
			t.Errorf("extension %s: %v", name, err)
			continue
		}
		check("extension "+name, s, v)
	}
	for name := range got {
		if _, ok := exts[name]; !ok {
			t.Errorf("unexpected extension %s", name)
		}
	}
}

// TestInteropNegativeControl shows the interop check can fail: the same
// message with the header capitalised as "Content-Type" (what a naive
// http.Header-style encoder writes) loses its content type in the SDK
// without any error, and a missing ce-specversion makes the SDK take the
// message for structured mode and reject it.
func TestInteropNegativeControl(t *testing.T) {
	ev := testEvent(t, "x.events", "order-1", 1)
	headers, body := encodeForTest(ev)

	capital := &nats.Msg{Subject: "x.events", Header: nats.Header{}, Data: body}
	for k, v := range headers {
		if k == "content-type" {
			k = "Content-Type"
		}
		capital.Header.Set(k, v)
	}
	got, err := binding.ToEvent(context.Background(), cejs.NewMessage(capital))
	if err != nil {
		t.Fatal(err)
	}
	if got.DataContentType() != "" {
		t.Fatalf("SDK read capitalised Content-Type as %q; the negative control no longer shows the pitfall", got.DataContentType())
	}

	nospec := &nats.Msg{Subject: "x.events", Header: nats.Header{}, Data: body}
	for k, v := range headers {
		if k != "ce-specversion" {
			nospec.Header.Set(k, v)
		}
	}
	if _, err := binding.ToEvent(context.Background(), cejs.NewMessage(nospec)); err == nil {
		t.Fatal("SDK accepted a message without ce-specversion")
	}
}

func encodeForTest(ev ferry.Event) (map[string]string, []byte) {
	return cloudevents.Encode(cloudevents.NATS, ev, cloudevents.EncodeOptions{Source: "ferry://orders-service"})
}
