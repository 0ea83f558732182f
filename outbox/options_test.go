package outbox_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/ferrytest"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

func sqliteDriver(t *testing.T) *databasesql.Driver {
	t.Helper()
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(context.Background(), drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	return drv
}

func ev() ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1}
}

func TestAdmissionRefusalWritesNothing(t *testing.T) {
	drv := sqliteDriver(t)
	full := errors.New("outbox full")
	w, err := outbox.New(drv, outbox.WithAdmission(func(context.Context) error { return full }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Insert(context.Background(), ev()); !errors.Is(err, full) {
		t.Fatalf("err = %v, want the admission error", err)
	}
	ferrytest.RequireInserted(t, drv.Executor(), ferry.Tables{})
}

func TestTraceparentCapturedFromContext(t *testing.T) {
	drv := sqliteDriver(t)
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	given := ev()
	given.AggregateID = "o-2"
	given.Headers.Traceparent = "00-11111111111111111111111111111111-2222222222222222-01"
	if _, err := w.Insert(ctx, ev(), given); err != nil {
		t.Fatal(err)
	}
	got := ferrytest.Outbox(t, drv.Executor(), ferry.Tables{})
	if got[0].Headers.Traceparent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("captured traceparent = %q", got[0].Headers.Traceparent)
	}
	if got[1].Headers.Traceparent != given.Headers.Traceparent {
		t.Fatalf("given traceparent overwritten: %q", got[1].Headers.Traceparent)
	}
	off, _ := outbox.New(drv, outbox.WithoutTraceCapture())
	third := ev()
	third.AggregateID = "o-3"
	out, err := off.Insert(ctx, third)
	if err != nil || out[0].Headers.Traceparent != "" {
		t.Fatalf("WithoutTraceCapture: %v %q", err, out[0].Headers.Traceparent)
	}
}
