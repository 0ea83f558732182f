package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

// BrokerName is Publisher.Name and Receipt.Broker.
const BrokerName = "kafka"

// ErrClosed is returned (classified NotSent) by Publish after Close.
var ErrClosed = errors.New("kafka: publisher closed")

// Publisher publishes Ferry events to Kafka with the idempotent producer and
// acks=all. See the package documentation for the guarantees and the
// broker settings they rely on.
type Publisher struct {
	cl        *kgo.Client
	source    string
	maxRecord int

	mu     sync.RWMutex
	closed bool
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher connects a producer to the seed brokers ("host:port").
// The connection is lazy: use Ping to check the cluster answers.
func NewPublisher(seeds []string, opts ...Option) (*Publisher, error) {
	if len(seeds) == 0 {
		return nil, &ferry.ConfigError{Field: "kafka.seeds", Reason: "at least one seed broker is required"}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	kopts := []kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.ClientID(cfg.clientID),
		// acks=all: a record is acknowledged only once every in-sync
		// replica has it (with min.insync.replicas >= 2 on the topic).
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Idempotency is franz-go's default with acks=all; it makes the
		// producer's own retries duplicate-free and keeps per-partition
		// order across retries. It is not disabled here on purpose.
		kgo.RecordDeliveryTimeout(cfg.deliveryTimeout),
		// The key decides the partition: murmur2 like the Java client, so
		// other producers hash an aggregate to the same partition.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// Never create topics implicitly: a typo must fail loudly
		// (UNKNOWN_TOPIC_OR_PARTITION, classified not sent and marked
		// broker.ErrDestinationMissing: the relay holds the rows and
		// reports the missing topic), and topics need deliberate
		// partition/replication settings (EnsureTopics).
		kgo.UnknownTopicRetries(3),
		kgo.WithLogger(kgoLogger{cfg.logger}),
	}
	kopts = append(kopts, cfg.kgoOpts...)
	cl, err := kgo.NewClient(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: new client: %w", err)
	}
	return &Publisher{cl: cl, source: cfg.source, maxRecord: cfg.maxRecordBytes}, nil
}

// Name returns "kafka".
func (p *Publisher) Name() string { return BrokerName }

// Client returns the underlying franz-go client, e.g. for kadm.NewClient.
func (p *Publisher) Client() *kgo.Client { return p.cl }

// Publish produces every event (pipelined: all records are handed to the
// producer before any acknowledgement is awaited) and waits for all
// promises or ctx. Each record's key is ferry.AggregateKey, so all events
// of an aggregate go to one partition, where the idempotent producer keeps
// them in slice order even across its internal retries; a failed record
// fails every later buffered record of its partition, so a later event can
// never be stored ahead of an earlier failed one.
//
// When ctx ends first, records without an answer are reported
// ClassIndeterminate: they may still be written.
func (p *Publisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	results := make([]broker.Result, len(events))
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		for i := range results {
			results[i].Err = broker.NewError(broker.ClassNotSent, ErrClosed)
		}
		return results
	}

	type answer struct {
		i   int
		r   *kgo.Record
		err error
	}
	// Buffered for every record: promises that fire after ctx ended must
	// never block the producer's goroutines.
	answers := make(chan answer, len(events))
	waiting := 0
	// An event refused before sending holds back the later events of its
	// aggregate in this call (NotSent), so the broker never stores a
	// later event of an aggregate without the earlier one.
	var hb broker.HoldBack
	for i := range events {
		ev := &events[i]
		if err := hb.Refuse("kafka", i, ev); err != nil {
			results[i].Err = err
			continue
		}
		key := ferry.AggregateKey(ev.TenantID, ev.AggregateType, ev.AggregateID)
		headers, body := cloudevents.Encode(cloudevents.Kafka, *ev, cloudevents.EncodeOptions{Source: p.source})
		rec := &kgo.Record{
			Topic:   ev.Topic,
			Key:     []byte(key),
			Value:   body,
			Headers: recordHeaders(headers),
		}
		if size := recordSize(rec); size > p.maxRecord {
			results[i].Err = broker.NewError(broker.ClassPermanent,
				fmt.Errorf("kafka: event %s: record is %d bytes, limit %d: %w", ev.ID, size, p.maxRecord, kerr.MessageTooLarge))
			hb.Fail(ev)
			continue
		}
		waiting++
		idx := i
		p.cl.Produce(ctx, rec, func(r *kgo.Record, err error) {
			answers <- answer{i: idx, r: r, err: err}
		})
	}

	for waiting > 0 {
		select {
		case a := <-answers:
			waiting--
			if a.err != nil {
				results[a.i].Err = Classify(fmt.Errorf("kafka: produce event %s to %s: %w", events[a.i].ID, events[a.i].Topic, a.err))
				continue
			}
			results[a.i].Receipt = broker.Receipt{
				Broker:      BrokerName,
				Destination: a.r.Topic,
				Key:         string(a.r.Key),
				Partition:   a.r.Partition,
				Offset:      a.r.Offset,
			}
		case <-ctx.Done():
			for i := range results {
				if results[i].Err == nil && results[i].Receipt.Broker == "" {
					results[i].Err = broker.NewError(broker.ClassIndeterminate,
						fmt.Errorf("kafka: waiting for ack of event %s: %w", events[i].ID, ctx.Err()))
				}
			}
			return results
		}
	}
	return results
}

// recordSize is the record's size as a broker counts it against
// max.message.bytes, give or take the few bytes of varint framing.
func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 32
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 4
	}
	return n
}

// recordHeaders turns the codec's map into Kafka headers, sorted by name
// so the wire form is deterministic.
func recordHeaders(h map[string]string) []kgo.RecordHeader {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]kgo.RecordHeader, 0, len(keys))
	for _, k := range keys {
		out = append(out, kgo.RecordHeader{Key: k, Value: []byte(h[k])})
	}
	return out
}

// Ping asks a broker for cluster metadata. It succeeds when any broker
// answers; it does not prove that produce requests succeed (a partition
// may lack in-sync replicas), which Publish's error classes report.
func (p *Publisher) Ping(ctx context.Context) error {
	if err := p.cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: ping: %w", err)
	}
	return nil
}

// Close flushes nothing: it fails records still buffered (their Publish
// calls, if any, report them) and closes the connections. Publish must not
// be called concurrently with or after Close; if it is, it reports NotSent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.cl.Close()
	return nil
}
