package natsjs_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
)

// Example runs the whole path on an embedded server: provision a durable
// stream, publish two events (the second twice, as a relay retry would),
// and consume them with a durable pull consumer.
func Example() {
	srv, err := natsembed.Start(natsembed.WithSyncAlways())
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	pub, err := natsjs.DialPublisher(srv.ClientURL(), natsjs.WithSource("ferry://orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	cfg := natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}, DuplicateWindow: 10 * time.Minute}
	if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), cfg); err != nil {
		log.Fatal(err)
	}
	if err := natsjs.CheckStream(ctx, pub.JetStream(), cfg); err != nil {
		log.Fatal(err)
	}

	ev := func(id string, seq int64) ferry.Event {
		return ferry.Event{
			ID: uuid.MustParse(id), TenantID: "acme", AggregateType: "order", AggregateID: "42",
			AggregateSeq: seq, EventType: "order.updated", SchemaVersion: 1,
			ContentType: "application/json", Payload: []byte(`{}`),
			OccurredAt: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), Topic: "order.events",
		}
	}
	e1 := ev("0190f5c2-7b4e-7cc1-9a1e-000000000001", 1)
	e2 := ev("0190f5c2-7b4e-7cc1-9a1e-000000000002", 2)
	for _, r := range pub.Publish(ctx, []ferry.Event{e1, e2, e2}) {
		fmt.Println(r.Receipt, r.Err)
	}

	cons, err := natsjs.DialConsumer(ctx, srv.ClientURL(), "ORDERS", "shipping")
	if err != nil {
		log.Fatal(err)
	}
	defer cons.Close()
	cctx, stop := context.WithCancel(ctx)
	n := 0
	err = cons.Consume(cctx, func(ctx context.Context, d *broker.Delivery) {
		fmt.Println(d.Event.AggregateID, d.Event.AggregateSeq, d.Event.ID, "attempt", d.Attempt)
		if err := d.Ack(ctx); err != nil {
			log.Fatal(err)
		}
		if n++; n == 2 {
			stop()
		}
	})
	fmt.Println("consume:", err)
	// Output:
	// {"broker":"nats","destination":"ORDERS","key":"order.events","offset":1} <nil>
	// {"broker":"nats","destination":"ORDERS","key":"order.events","offset":2} <nil>
	// {"broker":"nats","destination":"ORDERS","key":"order.events","offset":2,"duplicate":true} <nil>
	// 42 1 0190f5c2-7b4e-7cc1-9a1e-000000000001 attempt 1
	// 42 2 0190f5c2-7b4e-7cc1-9a1e-000000000002 attempt 1
	// consume: <nil>
}
