package cloudevents_test

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

func Example() {
	ev := ferry.Event{
		ID:            uuid.MustParse("0190f5c2-7b4e-7cc1-9a1e-1b2c3d4e5f60"),
		TenantID:      "acme",
		AggregateType: "order",
		AggregateID:   "42",
		AggregateSeq:  1,
		EventType:     "order.created",
		SchemaVersion: 1,
		ContentType:   "application/json",
		Payload:       []byte(`{"total":12}`),
		OccurredAt:    time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
	}
	headers, body := cloudevents.Encode(cloudevents.NATS, ev, cloudevents.EncodeOptions{Source: "ferry://orders"})
	for _, k := range []string{"ce-id", "ce-type", "ce-subject", "ce-sequence", "ce-partitionkey", "content-type"} {
		fmt.Printf("%s: %s\n", k, headers[k])
	}

	back, err := cloudevents.Decode(cloudevents.NATS, headers, body)
	fmt.Println(back.ID == ev.ID, back.AggregateSeq, string(back.Payload), err)

	delete(headers, "ce-sequence")
	_, err = cloudevents.Decode(cloudevents.NATS, headers, body)
	fmt.Println(err)
	// Output:
	// ce-id: 0190f5c2-7b4e-7cc1-9a1e-1b2c3d4e5f60
	// ce-type: order.created
	// ce-subject: 42
	// ce-sequence: 1
	// ce-partitionkey: acme/order/42
	// content-type: application/json
	// true 1 {"total":12} <nil>
	// cloudevents: nats message: attribute sequence (header "ce-sequence"): missing or empty
}
