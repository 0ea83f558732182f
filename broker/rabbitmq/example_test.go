package rabbitmq_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/rabbitmq"
)

// Provisioning the destination, then publishing with confirms. Needs a
// RabbitMQ server, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	url := "amqp://guest:guest@127.0.0.1:5672/"
	top := rabbitmq.Topology{Exchange: "ferry", Queue: "shipping", BindingKeys: []string{"order.*"}}
	if err := rabbitmq.EnsureTopology(ctx, url, top); err != nil {
		log.Fatal(err)
	}
	if err := rabbitmq.CheckTopology(ctx, url, top); err != nil {
		log.Fatal(err) // the relay's start-up check
	}
	pub, err := rabbitmq.NewPublisher(url, rabbitmq.WithExchange("ferry"))
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	var events []ferry.Event // from the outbox, with Topic = routing key
	for i, r := range pub.Publish(ctx, events) {
		if r.Err != nil {
			fmt.Println(events[i].ID, "not published:", r.Err)
			continue
		}
		fmt.Println(events[i].ID, "confirmed:", r.Receipt)
	}
}
