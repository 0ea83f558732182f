package otelferry_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

// One trace shows command → publish → apply: the outbox captures the
// command's span into traceparent, the relay's publish span links to it and
// the inbox's apply span is its child, across the real relay, JetStream and
// inbox on the embedded stack.
func TestTraceCommandPublishApply(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(ctx) }()

	srv, err := natsembed.Start(natsembed.WithStoreDir(filepath.Join(dir, "nats")))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pub, err := natsjs.DialPublisher(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}}); err != nil {
		t.Fatal(err)
	}

	// The command: a span around the producer transaction.
	cmdCtx, cmdSpan := tp.Tracer("app").Start(ctx, "place order")
	w, err := outbox.New(drv, outbox.WithShardCount(2))
	if err != nil {
		t.Fatal(err)
	}
	inserted, err := w.Insert(cmdCtx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	eventID := inserted[0].ID.String()
	cmdSpan.End()
	cmdSC := cmdSpan.SpanContext()

	r, err := relay.New(drv, pub, relay.WithShardCount(2), relay.WithLeaseTTL(2*time.Second), relay.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan struct{}, 1)
	ib, err := inbox.New[*sql.Tx](drv, "shipping", func(context.Context, *sql.Tx, ferry.Event) error {
		select {
		case applied <- struct{}{}:
		default:
		}
		return nil
	}, inbox.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	consumer, err := natsjs.DialConsumer(ctx, srv.ClientURL(), "ORDERS", "shipping")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	relayDone, inboxDone := make(chan error, 1), make(chan error, 1)
	go func() { relayDone <- r.Run(runCtx) }()
	go func() { inboxDone <- ib.Run(runCtx, consumer) }()
	select {
	case <-applied:
	case <-time.After(30 * time.Second):
		t.Fatal("event not applied within 30s")
	}
	stop()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}
	if err := <-inboxDone; err != nil {
		t.Fatal(err)
	}
	_ = consumer.Close()

	var linked, child bool
	attrs := func(s sdktrace.ReadOnlySpan) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes() {
			m[string(kv.Key)] = kv.Value.Emit()
		}
		return m
	}
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
		switch s.Name() {
		case "send order.events":
			if s.SpanKind() != trace.SpanKindProducer {
				t.Errorf("send span kind %v, want producer", s.SpanKind())
			}
			for k, want := range map[string]string{"messaging.system": "nats", "messaging.destination.name": "order.events",
				"messaging.operation.type": "send", "messaging.operation.name": "send", "messaging.batch.message_count": "1"} {
				if got := attrs(s)[k]; got != want {
					t.Errorf("send span %s = %q, want %q", k, got, want)
				}
			}
			for _, l := range s.Links() {
				if l.SpanContext.TraceID() == cmdSC.TraceID() && l.SpanContext.SpanID() == cmdSC.SpanID() {
					linked = true
				}
			}
		case "process order.events":
			if s.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("process span kind %v, want consumer", s.SpanKind())
			}
			a := attrs(s)
			for k, want := range map[string]string{"messaging.system": "nats", "messaging.destination.name": "order.events",
				"messaging.operation.type": "process", "messaging.operation.name": "process", "messaging.consumer.group.name": "shipping",
				"messaging.message.id": eventID} {
				if got := a[k]; got != want {
					t.Errorf("process span %s = %q, want %q", k, got, want)
				}
			}
			if s.SpanContext().TraceID() == cmdSC.TraceID() && s.Parent().SpanID() == cmdSC.SpanID() {
				child = true
			}
		}
	}
	if !linked {
		t.Errorf("no \"send order.events\" span links to the command's span; spans: %v", names)
	}
	if !child {
		t.Errorf("no \"process order.events\" span is a child of the command's span; spans: %v", names)
	}
	// On the wire, the W3C traceparent header (what OpenTelemetry's broker
	// instrumentations read) carries the command's trace, beside the
	// CloudEvents extension.
	stream, err := pub.JetStream().Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	w3c, ext := msg.Header.Get("traceparent"), msg.Header.Get("ce-traceparent")
	if w3c == "" || w3c != ext || !strings.Contains(w3c, cmdSC.TraceID().String()) {
		t.Errorf("traceparent header %q, ce-traceparent %q; want both carrying trace %s", w3c, ext, cmdSC.TraceID())
	}
}
