package natsjs

import (
	"context"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/testenv"
)

// BenchmarkPublish measures the adapter alone: batches of 256 events with
// 300-byte payloads over 64 aggregates, every ack awaited.
//
//	go test ./broker/natsjs -run '^$' -bench Publish -benchtime 20000x
func BenchmarkPublish(b *testing.B) {
	emb, err := natsembed.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer emb.Close()
	targets := []struct{ name, url string }{{"embedded", emb.ClientURL()}}
	if u := systemURLB(); u != "" {
		targets = append(targets, struct{ name, url string }{"system", u})
	}
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			nc, err := Connect(tg.url)
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			prefix := benchStream(b, nc)
			p, err := NewPublisher(nc)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			const batch = 256
			payload := make([]byte, 300)
			evs := make([]ferry.Event, batch)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i += batch {
				n := min(batch, b.N-i)
				for j := range n {
					id, _ := ferry.NewEventID()
					evs[j] = ferry.Event{
						ID: id, TenantID: "t", AggregateType: "order", AggregateID: string(rune('a' + j%64)),
						AggregateSeq: int64(i + j + 1), EventType: "order.updated", SchemaVersion: 1,
						ContentType: "application/json", Payload: payload, OccurredAt: time.Now(), Topic: prefix + ".x",
					}
				}
				for _, r := range p.Publish(context.Background(), evs[:n]) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		})
	}
}

func systemURLB() string {
	u := testenv.URL("FERRY_TEST_NATS_URL", testenv.DefaultNATSURL)
	if testenv.Reachable(u) != nil {
		return ""
	}
	return u
}

// benchStream creates a throw-away stream and returns its subject prefix.
func benchStream(b *testing.B, nc *nats.Conn) string {
	b.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	name, prefix := randName("FERRYBENCH_"), randName("fb")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := EnsureStream(ctx, js, StreamConfig{Name: name, Subjects: []string{prefix + ".>"}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return prefix
}
