package outbox

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry"
)

// BenchmarkValidateNormalize is the writer's Go-side work per event (no I/O):
// validate, assign id/shard/topic, check the rendered topic.
func BenchmarkValidateNormalize(b *testing.B) {
	lim := ferry.Limits{}
	payload := []byte(`{"amount_cents":4200,"currency":"EUR","items":[{"sku":"A-1","qty":2}]}`)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		e := ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "01a22cb1-3f13-7813-92ae-a1bec219f7bf",
			EventType: "order.created", SchemaVersion: 1, Payload: payload, Headers: ferry.Headers{CorrelationID: "c-1"}}
		if err := lim.Validate(0, &e); err != nil {
			b.Fatal(err)
		}
		if err := normalize(0, &e, "", 16, now); err != nil { // assign id/shard/topic, check the rendered topic
			b.Fatal(err)
		}
	}
}
