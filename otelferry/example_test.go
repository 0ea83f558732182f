package otelferry_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/ferryhq/ferry/otelferry"
)

func Example() {
	// A producer's context with an active span (here a fixed one).
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))

	// Written into the event's headers with the outbox row.
	tp := otelferry.TraceparentFromContext(ctx)
	fmt.Println(tp)

	// Read back by the relay or the consumer.
	sc := trace.SpanContextFromContext(otelferry.ContextFromTraceparent(context.Background(), tp))
	fmt.Println(sc.TraceID(), sc.IsRemote())
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// 4bf92f3577b34da6a3ce929d0e0e4736 true
}
