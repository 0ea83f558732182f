package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
)

// Publishing one event and consuming it back, against an in-process kfake
// cluster (use your brokers' addresses instead).
func Example() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "order.events"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	ctx := context.Background()

	pub, err := kafka.NewPublisher(cluster.ListenAddrs(), kafka.WithSource("ferry://orders"))
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	ev := ferry.Event{
		ID:       uuid.MustParse("0190f5c2-7b4e-7cc1-9a1e-1b2c3d4e5f60"),
		TenantID: "acme", AggregateType: "order", AggregateID: "42", AggregateSeq: 1,
		EventType: "order.created", SchemaVersion: 1,
		ContentType: "application/json", Payload: []byte(`{"total":12}`),
		OccurredAt: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		Topic:      "order.events",
	}
	res := pub.Publish(ctx, []ferry.Event{ev})
	if res[0].Err != nil {
		panic(res[0].Err)
	}
	fmt.Println("receipt:", res[0].Receipt.Destination, res[0].Receipt.Key, "offset", res[0].Receipt.Offset)

	cons, err := kafka.NewConsumer(cluster.ListenAddrs(), "shipping", []string{"order.events"})
	if err != nil {
		panic(err)
	}
	defer cons.Close()
	cctx, cancel := context.WithCancel(ctx)
	_ = cons.Consume(cctx, func(ctx context.Context, d *broker.Delivery) {
		fmt.Println("consumed:", d.Event.EventType, d.Event.AggregateID, "seq", d.Event.AggregateSeq, "attempt", d.Attempt)
		// Ack only after the consumer's transaction committed.
		_ = d.Ack(ctx)
		cancel()
	})
	// Output:
	// receipt: order.events acme/order/42 offset 0
	// consumed: order.created 42 seq 1 attempt 1
}
