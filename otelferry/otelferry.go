// Package otelferry carries W3C trace context through Ferry's outbox, so one
// trace shows command → publish → apply even though the three run in
// different processes at different times.
//
// The producer captures the active span's context into the event's
// traceparent header when it writes the outbox row:
//
//	ev.Headers.Traceparent = otelferry.TraceparentFromContext(ctx)
//	writer.InsertTx(ctx, tx, ev)
//
// The relay and the consumer restore it and start their spans linked to
// (not parented by) the producer's span: publishing and applying happen
// later, possibly many times, and a link keeps the command's trace from
// growing without bound while still joining the three in one view:
//
//	pctx := otelferry.ContextFromTraceparent(ctx, ev.Headers.Traceparent)
//	ctx, span := tracer.Start(ctx, "ferry.apply", otelferry.LinkFrom(pctx))
//
// Use [ContextFromTraceparent]'s result as the parent instead when a single
// parent-child trace is wanted (e.g. in tests or low-volume systems).
//
// The functions use the W3C TraceContext propagator directly, not the
// global propagator, so they work whether or not the application set one,
// and they never fail: a missing or malformed traceparent yields an empty
// string or the context unchanged.
package otelferry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// MaxTraceparentLen bounds what ContextFromTraceparent parses (the W3C form
// is 55 bytes); anything longer is ignored as malformed.
const MaxTraceparentLen = 512

// TraceparentFromContext returns the W3C traceparent of the span context in
// ctx ("00-<trace id>-<span id>-<flags>"), or "" when ctx carries no valid
// span context.
func TraceparentFromContext(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// ContextFromTraceparent returns ctx carrying the remote span context
// described by tp, or ctx unchanged when tp is empty or malformed.
func ContextFromTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" || len(tp) > MaxTraceparentLen {
		return ctx
	}
	out := propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
	if !trace.SpanContextFromContext(out).IsValid() {
		return ctx
	}
	return out
}

// LinkFrom returns a span start option linking the new span to the span
// context in ctx (typically from ContextFromTraceparent); no option effect
// when ctx carries none.
func LinkFrom(ctx context.Context) trace.SpanStartOption {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return trace.WithLinks()
	}
	return trace.WithLinks(trace.Link{SpanContext: sc})
}
