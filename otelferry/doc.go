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
