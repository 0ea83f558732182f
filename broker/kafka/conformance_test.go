package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/brokertest"
	"github.com/ferryhq/ferry/broker/kafka"
)

var groupSeq atomic.Int64

// TestConformance runs the shared broker suite against kfake over the wire
// protocol. Each Env gets its own in-process cluster; the outage hook
// closes every client connection the cluster receives until restored.
func TestConformance(t *testing.T) {
	brokertest.Run(t, brokertest.Harness{
		Capabilities: brokertest.Capabilities{
			// The idempotent producer removes duplicates of its own
			// retries only; a re-published event id is a new record.
			DedupByEventID: false,
			OrderedByKey:   true,
			Redelivers:     true,
			// Attempt counts deliveries within one consumer instance;
			// Kafka keeps no delivery count, so after a restart the
			// count starts at 1 again.
			AttemptCounted:    false,
			OversizedPayload:  2 << 20,
			RedeliveryTimeout: 15 * time.Second,
		},
		Setup: func(t *testing.T) *brokertest.Env {
			topic := fmt.Sprintf("conformance.%d", groupSeq.Add(1))
			c := newCluster(t, 3, topic)
			group := fmt.Sprintf("group-%d", groupSeq.Add(1))
			var mu sync.Mutex
			down := false
			c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				mu.Lock()
				defer mu.Unlock()
				if down {
					return nil, errors.New("outage"), true
				}
				return nil, nil, false
			})
			return &brokertest.Env{
				Topic: topic,
				NewPublisher: func(t *testing.T) broker.Publisher {
					p, err := kafka.NewPublisher(c.ListenAddrs())
					if err != nil {
						t.Fatal(err)
					}
					return p
				},
				NewConsumer: func(t *testing.T) broker.Consumer {
					cons, err := kafka.NewConsumer(c.ListenAddrs(), group, []string{topic},
						kafka.WithCommitInterval(100*time.Millisecond))
					if err != nil {
						t.Fatal(err)
					}
					return cons
				},
				PublishRaw: func(t *testing.T, headers map[string]string, body []byte) {
					cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
					if err != nil {
						t.Fatal(err)
					}
					defer cl.Close()
					rec := &kgo.Record{Topic: topic, Value: body}
					for k, v := range headers {
						rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
					}
					if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
						t.Fatal(err)
					}
				},
				Outage: func(t *testing.T) func() {
					mu.Lock()
					down = true
					mu.Unlock()
					return func() {
						mu.Lock()
						down = false
						mu.Unlock()
					}
				},
			}
		},
	})
}

// TestInteropCloudEventsSDK decodes every published record with the
// official CloudEvents Go SDK Kafka binding (kafka_sarama), validates the
// event and checks the attributes and every extension Ferry writes.
func TestInteropCloudEventsSDK(t *testing.T) {
	const topic = "interop.events"
	c := newCluster(t, 2, topic)
	p := newPublisher(t, c, kafka.WithSource("ferry://orders"))
	var evs []ferry.Event
	for i := int64(1); i <= 5; i++ {
		evs = append(evs, event(t, topic, fmt.Sprintf("o-%d", i%2), i))
	}
	minimal := event(t, topic, "o-min", 1)
	minimal.Headers = ferry.Headers{}
	evs = append(evs, minimal)
	mustOK(t, p.Publish(context.Background(), evs))
	byID := map[string]ferry.Event{}
	for _, ev := range evs {
		byID[ev.ID.String()] = ev
	}

	recs := readAll(t, c, topic, len(evs))
	for _, r := range recs {
		cm := &sarama.ConsumerMessage{
			Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
			Key: r.Key, Value: r.Value, Timestamp: r.Timestamp,
		}
		for _, h := range r.Headers {
			cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		msg := kafka_sarama.NewMessageFromConsumerMessage(cm)
		if enc := msg.ReadEncoding(); enc != binding.EncodingBinary {
			t.Fatalf("SDK sees encoding %v, want binary", enc)
		}
		ce, err := binding.ToEvent(context.Background(), msg)
		if err != nil {
			t.Fatalf("SDK decode: %v", err)
		}
		if err := ce.Validate(); err != nil {
			t.Fatalf("SDK validate: %v", err)
		}
		want, ok := byID[ce.ID()]
		if !ok {
			t.Fatalf("SDK decoded unknown id %q", ce.ID())
		}
		if ce.SpecVersion() != "1.0" || ce.Source() != "ferry://orders" || ce.Type() != want.EventType ||
			ce.Subject() != want.AggregateID || ce.DataContentType() != want.ContentType ||
			!ce.Time().Equal(want.OccurredAt) || string(ce.Data()) != string(want.Payload) {
			t.Fatalf("SDK event %s differs from %+v", ce, want)
		}
		ext := ce.Extensions()
		wantExt := map[string]string{
			"sequence":      fmt.Sprint(want.AggregateSeq),
			"partitionkey":  ferry.AggregateKey(want.TenantID, want.AggregateType, want.AggregateID),
			"tenantid":      want.TenantID,
			"schemaversion": fmt.Sprint(want.SchemaVersion),
		}
		if want.Headers.Traceparent != "" {
			wantExt["traceparent"] = want.Headers.Traceparent
			wantExt["correlationid"] = want.Headers.CorrelationID
			wantExt["causationid"] = want.Headers.CausationID
		}
		var names []string
		for k := range ext {
			names = append(names, k)
		}
		sort.Strings(names)
		for k, v := range wantExt {
			if got := fmt.Sprint(ext[k]); got != v {
				t.Fatalf("extension %s = %q, want %q (SDK saw %v)", k, got, v, names)
			}
		}
		// The record key the SDK's binding would use as partition key.
		if string(r.Key) != wantExt["partitionkey"] {
			t.Fatalf("record key %q, want %q", r.Key, wantExt["partitionkey"])
		}
		delete(byID, ce.ID())
	}
	if len(byID) != 0 {
		t.Fatalf("%d events not decoded", len(byID))
	}
}
