package rabbitmq_test

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/internal/testenv"
)

// BenchmarkPublish: batches of 256 events with 300-byte payloads to the
// local RabbitMQ (durable topic exchange → quorum queue), persistent,
// mandatory, every confirm awaited before the next batch.
func BenchmarkPublish(b *testing.B) {
	url := testenv.RabbitMQURL(b)
	top := rabbitmq.Topology{Exchange: unique("ferry-bench-ex"), Queue: unique("ferry-bench-q")}
	ctx := context.Background()
	if err := rabbitmq.EnsureTopology(ctx, url, top); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = rabbitmq.DeleteTopology(ctx, url, top) }()
	p, err := rabbitmq.NewPublisher(url, rabbitmq.WithExchange(top.Exchange))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	const batch = 256
	evs := make([]ferry.Event, batch)
	for i := range evs {
		evs[i] = event(b, "bench.events", "a", int64(i+1))
		evs[i].Payload = make([]byte, 300)
	}
	b.ResetTimer()
	sent := 0
	for sent < b.N {
		n := min(batch, b.N-sent)
		for _, r := range p.Publish(ctx, evs[:n]) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		sent += n
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
