package cloudevents_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

// BenchmarkEncode: one event's headers, as every publish builds them
// (the relay's hottest path after the broker client's own).
func BenchmarkEncode(b *testing.B) {
	ev := ferry.Event{ID: uuid.Must(uuid.NewV7()), TenantID: "acme", AggregateType: "order", AggregateID: "o-123456",
		AggregateSeq: 42, EventType: "order.updated", SchemaVersion: 1, ContentType: ferry.DefaultContentType,
		Payload: []byte(`{"n":1}`), OccurredAt: time.Now(), Headers: ferry.Headers{CorrelationID: "corr-1"}}
	b.ReportAllocs()
	for b.Loop() {
		h, _ := cloudevents.Encode(cloudevents.NATS, ev, cloudevents.EncodeOptions{})
		if len(h) < 12 {
			b.Fatal(len(h))
		}
	}
}
