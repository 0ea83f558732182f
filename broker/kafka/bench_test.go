package kafka_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/kafka"
)

// BenchmarkPublish: batches of 256 events with 300-byte payloads to an
// in-process kfake cluster, every ack awaited before the next batch.
// Reported as events/s; kfake shares the CPU with the producer.
func BenchmarkPublish(b *testing.B) {
	const topic, batch = "bench.events", 256
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, topic))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	p, err := kafka.NewPublisher(c.ListenAddrs())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	evs := make([]ferry.Event, batch)
	for i := range evs {
		evs[i] = event(b, topic, string(rune('a'+i%26)), int64(i+1))
		evs[i].Payload = make([]byte, 300)
	}
	ctx := context.Background()
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
