package otelferry_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
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

// spanLog is a slog.Handler that records, for every line, the span context
// of the context it was written with: what a handler attaching trace ids
// (an OpenTelemetry log bridge) would see.
type spanLog struct {
	mu    sync.Mutex
	lines []spanLine
}

type spanLine struct {
	msg   string
	sc    trace.SpanContext
	attrs string
}

func (h *spanLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *spanLog) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool { b.WriteString(a.String() + " "); return true })
	h.mu.Lock()
	h.lines = append(h.lines, spanLine{r.Message, trace.SpanContextFromContext(ctx), b.String()})
	h.mu.Unlock()
	return nil
}
func (h *spanLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *spanLog) WithGroup(string) slog.Handler      { return h }

func (h *spanLog) find(prefix string) []spanLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []spanLine
	for _, l := range h.lines {
		if strings.HasPrefix(l.msg, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// TestLogLinesCarrySpanContext: the relay and the inbox write their log
// lines with the context of the work, so a handler sees the active span
// and can attach trace ids. The relay's line about a batch's outcome (a
// destination the broker lacks) carries that batch's "send" span; the
// inbox's line about a handler failure carries the trace of the context
// Run was given. Before #13 item 6 the relay logged with Warn (no context:
// no span) and the inbox's outcome lines used the batch context only.
func TestLogLinesCarrySpanContext(t *testing.T) {
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
	w, err := outbox.New(drv, outbox.WithShardCount(1))
	if err != nil {
		t.Fatal(err)
	}
	// order.events has a stream; invoice.events has none: the relay holds
	// that event and logs the missing destination.
	for _, typ := range []string{"order", "invoice"} {
		if _, err := w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: typ, AggregateID: typ + "-1", EventType: typ + ".created",
			SchemaVersion: 1, Payload: []byte(`{"card":"4111-1111-1111-1111"}`)}); err != nil {
			t.Fatal(err)
		}
	}

	relayLog, inboxLog := &spanLog{}, &spanLog{}
	r, err := relay.New(drv, pub, relay.WithShardCount(1), relay.WithLeaseTTL(2*time.Second), relay.WithTracerProvider(tp),
		relay.WithLogger(slog.New(relayLog)))
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan struct{}, 1)
	var failOnce sync.Once
	ib, err := inbox.New[*sql.Tx](drv, "shipping", func(context.Context, *sql.Tx, ferry.Event) error {
		failed := false
		failOnce.Do(func() { failed = true })
		if failed {
			return errors.New("downstream busy")
		}
		select {
		case applied <- struct{}{}:
		default:
		}
		return nil
	}, inbox.WithTracerProvider(tp), inbox.WithLogger(slog.New(inboxLog)),
		inbox.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	consumer, err := natsjs.DialConsumer(ctx, srv.ClientURL(), "ORDERS", "shipping")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	relayCtx, relaySpan := tp.Tracer("app").Start(runCtx, "relay process")
	inboxCtx, inboxSpan := tp.Tracer("app").Start(runCtx, "consumer process")
	relayDone, inboxDone := make(chan error, 1), make(chan error, 1)
	go func() { relayDone <- r.Run(relayCtx) }()
	go func() { inboxDone <- ib.Run(inboxCtx, consumer) }()
	deadline := time.After(60 * time.Second)
	for gotApplied := false; !gotApplied || len(relayLog.find("destination missing")) == 0; {
		select {
		case <-applied:
			gotApplied = true
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("within 60s: applied %v, relay lines about the missing destination %d", gotApplied, len(relayLog.find("destination missing")))
		}
	}
	stop()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}
	if err := <-inboxDone; err != nil {
		t.Fatal(err)
	}
	_ = consumer.Close()
	relaySpan.End()
	inboxSpan.End()

	sends := map[trace.SpanID]bool{}
	for _, s := range rec.Ended() {
		if strings.HasPrefix(s.Name(), "send") && s.SpanKind() == trace.SpanKindProducer {
			sends[s.SpanContext().SpanID()] = true
			if s.Parent().SpanID() != relaySpan.SpanContext().SpanID() {
				t.Errorf("send span's parent %s, want the relay's run span %s", s.Parent().SpanID(), relaySpan.SpanContext().SpanID())
			}
		}
	}
	for _, l := range relayLog.find("destination missing") {
		if !l.sc.IsValid() || !sends[l.sc.SpanID()] {
			t.Errorf("relay line %q has span context %v, want one of the %d send spans", l.msg, l.sc, len(sends))
		}
	}
	failedLines := inboxLog.find("handler failed")
	if len(failedLines) == 0 {
		t.Fatal("no inbox line about the failed handler")
	}
	for _, l := range failedLines {
		if l.sc.TraceID() != inboxSpan.SpanContext().TraceID() {
			t.Errorf("inbox line %q has trace %s, want the trace of Run's context %s", l.msg, l.sc.TraceID(), inboxSpan.SpanContext().TraceID())
		}
		if !strings.Contains(l.attrs, "err=downstream busy") {
			t.Errorf("inbox line %q attrs %q: want the error under err", l.msg, l.attrs)
		}
	}
	// Never a payload, in any line of either component.
	for _, h := range []*spanLog{relayLog, inboxLog} {
		for _, l := range h.find("") {
			if strings.Contains(l.msg+l.attrs, "4111") {
				t.Errorf("log line %q %s carries the payload", l.msg, l.attrs)
			}
		}
	}
}
