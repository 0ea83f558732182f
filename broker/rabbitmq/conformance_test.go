package rabbitmq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/brokertest"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestConformance runs the shared broker suite against the local RabbitMQ:
// one exchange and quorum queue per subtest, every client of the subtest
// connected through a proxy the outage hook cuts (the shared server is
// never stopped).
func TestConformance(t *testing.T) {
	url := testenv.RabbitMQURL(t)
	brokertest.Run(t, brokertest.Harness{
		Capabilities: brokertest.Capabilities{
			DedupByEventID:    false, // message-id is carried, RabbitMQ does not dedup on it
			OrderedByKey:      true,  // one queue, FIFO, channel keeps publish order
			Redelivers:        true,
			AttemptCounted:    true,     // quorum queue x-delivery-count, redelivered flag
			OversizedPayload:  17 << 20, // above the 16 MiB default limit
			RedeliveryTimeout: 15 * time.Second,
		},
		Setup: func(t *testing.T) *brokertest.Env {
			top := newTopology(t, url, true)
			px := newProxy(t, hostOf(t, url))
			purl := viaProxy(t, url, px)
			return &brokertest.Env{
				Topic: "conformance.events",
				NewPublisher: func(t *testing.T) broker.Publisher {
					p, err := rabbitmq.NewPublisher(purl, rabbitmq.WithExchange(top.Exchange), rabbitmq.WithDialTimeout(time.Second))
					if err != nil {
						t.Fatal(err)
					}
					return p
				},
				NewConsumer: func(t *testing.T) broker.Consumer {
					c, err := rabbitmq.NewConsumer(purl, top.Queue)
					if err != nil {
						t.Fatal(err)
					}
					return c
				},
				PublishRaw: func(t *testing.T, headers map[string]string, body []byte) {
					conn, err := amqp.Dial(url)
					if err != nil {
						t.Fatal(err)
					}
					defer conn.Close()
					ch, err := conn.Channel()
					if err != nil {
						t.Fatal(err)
					}
					if err := ch.Confirm(false); err != nil {
						t.Fatal(err)
					}
					tbl := amqp.Table{}
					for k, v := range headers {
						tbl[k] = v
					}
					dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), top.Exchange, "raw", true, false,
						amqp.Publishing{Headers: tbl, Body: body, DeliveryMode: amqp.Persistent})
					if err != nil {
						t.Fatal(err)
					}
					if !dc.Wait() {
						t.Fatal(errors.New("raw publish nacked"))
					}
				},
				Outage: func(t *testing.T) func() {
					px.set(2)
					return func() { px.set(0) }
				},
			}
		},
	})
}
