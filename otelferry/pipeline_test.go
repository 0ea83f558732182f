package otelferry_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
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
	db, err := databasesql.OpenSQLite(filepath.Join(dir, "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	drv := databasesql.New(db, driver.SQLite)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(ctx) }()

	srv, err := natsjs.StartEmbedded(natsjs.WithStoreDir(filepath.Join(dir, "nats")))
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
	if _, err := w.Insert(cmdCtx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
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
	}, inbox.WithTracerProvider[*sql.Tx](tp))
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
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "ferry.relay.publish":
			for _, l := range s.Links() {
				if l.SpanContext.TraceID() == cmdSC.TraceID() && l.SpanContext.SpanID() == cmdSC.SpanID() {
					linked = true
				}
			}
		case "ferry.inbox.apply":
			if s.SpanContext().TraceID() == cmdSC.TraceID() && s.Parent().SpanID() == cmdSC.SpanID() {
				child = true
			}
		}
	}
	if !linked {
		t.Error("no ferry.relay.publish span links to the command's span")
	}
	if !child {
		t.Error("no ferry.inbox.apply span is a child of the command's span")
	}
}
