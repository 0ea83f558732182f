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
