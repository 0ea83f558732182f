package otelferry_test

import (
	"context"
	"regexp"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/otelferry"
)

var tpRE = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$`)

func TestRoundTripAndLink(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tracer := tp.Tracer("ferry-test")

	// Producer: the command's span is captured into the header.
	ctx, cmd := tracer.Start(context.Background(), "command")
	header := otelferry.TraceparentFromContext(ctx)
	cmd.End()
	if !tpRE.MatchString(header) {
		t.Fatalf("traceparent %q is not W3C form", header)
	}

	// Consumer, later, elsewhere: restore and link.
	pctx := otelferry.ContextFromTraceparent(context.Background(), header)
	got := trace.SpanContextFromContext(pctx)
	if !got.IsRemote() || got.TraceID() != cmd.SpanContext().TraceID() || got.SpanID() != cmd.SpanContext().SpanID() {
		t.Fatalf("restored %v, want the command's span %v", got, cmd.SpanContext())
	}
	_, apply := tracer.Start(context.Background(), "apply", otelferry.LinkFrom(pctx))
	apply.End()
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	links := spans[1].Links()
	if len(links) != 1 || links[0].SpanContext.SpanID() != cmd.SpanContext().SpanID() {
		t.Fatalf("apply span links %+v, want the command span", links)
	}
	// As a parent instead of a link: same trace.
	_, child := tracer.Start(pctx, "apply-child")
	child.End()
	if child.SpanContext().TraceID() != cmd.SpanContext().TraceID() {
		t.Fatal("child of the restored context is in another trace")
	}
}

func TestMissingOrMalformed(t *testing.T) {
	ctx := context.Background()
	if tp := otelferry.TraceparentFromContext(ctx); tp != "" {
		t.Fatalf("no span: %q", tp)
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-0000000000000000-01", "00-abc", string(make([]byte, 600))} {
		out := otelferry.ContextFromTraceparent(ctx, bad)
		if trace.SpanContextFromContext(out).IsValid() {
			t.Errorf("%q produced a valid span context", bad)
		}
		if out != ctx {
			t.Errorf("%q: context replaced", bad)
		}
	}
	// A link from nothing is no link.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	_, s := tp.Tracer("t").Start(ctx, "x", otelferry.LinkFrom(ctx))
	s.End()
	if n := len(rec.Ended()[0].Links()); n != 0 {
		t.Fatalf("%d links from an empty context", n)
	}
}
