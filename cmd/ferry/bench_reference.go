package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/broker/natsjs"
)

// benchBrokerReference measures the broker's own limit for the drain in the
// same run: a plain client publishing n messages of the same payload size,
// subjects and message-id dedup as the relay, asynchronously with the
// adapter's in-flight bound, into a scratch destination — no database, no
// CloudEvents encoding, no marks. The relay's drain rate divided by this is
// the ratio #17's goal is stated in.
func benchBrokerReference(ctx context.Context, brokerURL string, n, payloadBytes, aggs int) (time.Duration, error) {
	payload := []byte(`"` + strings.Repeat("x", max(payloadBytes-2, 0)) + `"`)
	prefix := "ferrybenchref" + benchRandHex()
	if brokerURL == "kfake" {
		return benchKafkaReference(ctx, prefix, n, payload, aggs)
	}
	nc, err := nats.Connect(brokerURL)
	if err != nil {
		return 0, fmt.Errorf("bench reference: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natsjs.DefaultMaxPending))
	if err != nil {
		return 0, fmt.Errorf("bench reference: jetstream: %w", err)
	}
	stream := strings.ToUpper(prefix)
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}}); err != nil {
		return 0, fmt.Errorf("bench reference: stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), stream) }()
	start := time.Now()
	for i := 0; i < n; i++ {
		subj := prefix + ".order.agg-" + strconv.Itoa(i%aggs)
		// Stalled at the in-flight bound: wait for acks to free slots, as
		// the relay's adapter does, not fail after the library's 200 ms
		// (a loaded machine stalled the reference once).
		if _, err := js.PublishAsync(subj, payload, jetstream.WithMsgID(uuid.NewString()), jetstream.WithStallWait(30*time.Second)); err != nil {
			return 0, fmt.Errorf("bench reference: publish %d: %w", i, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(5 * time.Minute):
		return 0, fmt.Errorf("bench reference: %d acks still pending after 5m", js.PublishAsyncPending())
	}
	elapsed := time.Since(start)
	info, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("bench reference: stream info: %w", err)
	}
	if got := info.CachedInfo().State.Msgs; got != uint64(n) {
		return 0, fmt.Errorf("bench reference: stream holds %d messages, want %d", got, n)
	}
	return elapsed, nil
}

func benchKafkaReference(ctx context.Context, prefix string, n int, payload []byte, aggs int) (time.Duration, error) {
	topic := prefix + ".order"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(16, topic))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	start := time.Now()
	errs := make(chan error, 1)
	for i := 0; i < n; i++ {
		cl.Produce(ctx, &kgo.Record{Key: []byte("agg-" + strconv.Itoa(i%aggs)), Value: payload}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	select {
	case err := <-errs:
		return 0, fmt.Errorf("bench reference: produce: %w", err)
	default:
	}
	return time.Since(start), nil
}
