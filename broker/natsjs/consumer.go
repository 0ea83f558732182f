package natsjs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

// Defaults of the consumer options.
const (
	DefaultAckWait       = 30 * time.Second
	DefaultMaxAckPending = 1000
	DefaultPullBatch     = 256
)

var _ broker.Consumer = (*Consumer)(nil)

// Consumer is a durable JetStream pull consumer with explicit acks. The
// durable name is the consumer's identity on the server: every Consumer
// created with the same stream and durable shares one position, and
// messages not acked within AckWait are redelivered (to any of them).
type Consumer struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	cons     jetstream.Consumer
	stream   string
	durable  string
	batch    int
	ownsConn bool

	mu     sync.Mutex
	closed bool
	done   chan struct{}
}

// ConsumerOption configures NewConsumer.
type ConsumerOption func(*consumerConfig) error

type consumerConfig struct {
	ackWait       time.Duration
	maxDeliver    int
	maxAckPending int
	filter        string
	batch         int
}

// WithAckWait is how long the server waits for an ack before redelivering
// (default 30s). It must exceed the consumer transaction's worst case, or
// messages are redelivered while still being applied (the inbox dedups
// them, at the cost of wasted work).
func WithAckWait(d time.Duration) ConsumerOption {
	return func(c *consumerConfig) error {
		if d < time.Second {
			return fmt.Errorf("natsjs: WithAckWait: %v must be >= 1s", d)
		}
		c.ackWait = d
		return nil
	}
}

// WithMaxDeliver caps deliveries per message (default unlimited, -1).
// After the cap the server stops redelivering the message silently: the
// inbox parks poison messages itself, so prefer the default unless
// something else watches the server's max-deliveries advisories.
func WithMaxDeliver(n int) ConsumerOption {
	return func(c *consumerConfig) error {
		if n == 0 || n < -1 {
			return fmt.Errorf("natsjs: WithMaxDeliver: %d must be -1 (unlimited) or >= 1", n)
		}
		c.maxDeliver = n
		return nil
	}
}

// WithMaxAckPending bounds the delivered-but-unacked messages (default
// 1000): the server stops delivering at the bound, which is the
// consumer's back-pressure.
func WithMaxAckPending(n int) ConsumerOption {
	return func(c *consumerConfig) error {
		if n < 1 {
			return fmt.Errorf("natsjs: WithMaxAckPending: %d must be >= 1", n)
		}
		c.maxAckPending = n
		return nil
	}
}

// WithFilterSubject consumes only messages whose subject matches filter
// (wildcards allowed), e.g. "order.events".
func WithFilterSubject(filter string) ConsumerOption {
	return func(c *consumerConfig) error {
		if filter == "" {
			return errors.New("natsjs: WithFilterSubject: filter must not be empty")
		}
		c.filter = filter
		return nil
	}
}

// WithPullBatch is how many messages one pull request asks for (default
// 256, capped at MaxAckPending). Messages pulled but not yet handed to the
// handler when Consume stops are redelivered after AckWait.
func WithPullBatch(n int) ConsumerOption {
	return func(c *consumerConfig) error {
		if n < 1 {
			return fmt.Errorf("natsjs: WithPullBatch: %d must be >= 1", n)
		}
		c.batch = n
		return nil
	}
}

// NewConsumer creates (or updates to these settings) the durable pull
// consumer durable on stream and returns a Consumer reading from it
// through nc, which the caller keeps owning.
func NewConsumer(ctx context.Context, nc *nats.Conn, stream, durable string, opts ...ConsumerOption) (*Consumer, error) {
	if nc == nil {
		return nil, errors.New("natsjs: NewConsumer: nil connection")
	}
	if stream == "" {
		return nil, errors.New("natsjs: NewConsumer: stream must not be empty")
	}
	if durable == "" {
		return nil, errors.New("natsjs: NewConsumer: durable must not be empty")
	}
	cfg := consumerConfig{
		ackWait:       DefaultAckWait,
		maxDeliver:    -1,
		maxAckPending: DefaultMaxAckPending,
		batch:         DefaultPullBatch,
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.batch > cfg.maxAckPending {
		cfg.batch = cfg.maxAckPending
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natsjs: jetstream: %w", err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:       durable,
		Description:   "Ferry inbox consumer",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.ackWait,
		MaxDeliver:    cfg.maxDeliver,
		MaxAckPending: cfg.maxAckPending,
		FilterSubject: cfg.filter,
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: create consumer %q on stream %q: %w", durable, stream, err)
	}
	return &Consumer{
		nc: nc, js: js, cons: cons,
		stream: stream, durable: durable, batch: cfg.batch,
		done: make(chan struct{}),
	}, nil
}

// DialConsumer connects to url with Connect and returns a Consumer that
// owns the connection (Close closes it).
func DialConsumer(ctx context.Context, url, stream, durable string, opts ...ConsumerOption) (*Consumer, error) {
	nc, err := Connect(url)
	if err != nil {
		return nil, err
	}
	c, err := NewConsumer(ctx, nc, stream, durable, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.ownsConn = true
	return c, nil
}

// Consume pulls messages and calls handle for each, from this goroutine,
// in stream order, until ctx is cancelled or Close is called (then it
// returns nil) or the consumer fails for good (deleted, connection closed:
// then it returns the error). Each Delivery's Ack is a double ack: it
// waits for the server to confirm, so a nil error means the message will
// not be redelivered. Nack asks for redelivery after the delay
// (NakWithDelay). Both may be called later from any goroutine.
//
// Delivery.Event.Topic is the message subject (the topic, under the
// default subject mapping); Raw.Destination is the subject too and Raw.Key
// the ce-partitionkey header. A message that is not a valid Ferry
// CloudEvent is delivered with DecodeErr set and Raw filled; it is never
// dropped or acked here.
func (c *Consumer) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	if handle == nil {
		return errors.New("natsjs: Consume: nil handler")
	}
	if c.isClosed() {
		return errors.New("natsjs: Consume after Close")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-stopped:
		}
	}()

	it, err := c.cons.Messages(jetstream.PullMaxMessages(c.batch))
	if err != nil {
		return fmt.Errorf("natsjs: consume %q: %w", c.durable, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil || c.isClosed() {
				return nil
			}
			return fmt.Errorf("natsjs: consume %q: %w", c.durable, err)
		}
		handle(ctx, c.delivery(msg))
	}
}

func (c *Consumer) delivery(msg jetstream.Msg) *broker.Delivery {
	hdr := msg.Headers()
	headers := make(map[string]string, len(hdr))
	for k, v := range hdr {
		if len(v) > 0 {
			headers[k] = v[0]
		}
	}
	d := &broker.Delivery{
		Raw: broker.RawMessage{
			Destination: msg.Subject(),
			Key:         headers[cloudevents.NATS.Header(cloudevents.ExtPartitionKey)],
			Headers:     headers,
			Body:        msg.Data(),
		},
	}
	if meta, err := msg.Metadata(); err == nil {
		d.Attempt = int(meta.NumDelivered)
	}
	d.Event, d.DecodeErr = cloudevents.Decode(cloudevents.NATS, headers, msg.Data())
	if d.DecodeErr == nil {
		d.Event.Topic = msg.Subject()
	}
	d.Ack = func(ctx context.Context) error {
		if err := msg.DoubleAck(ctx); err != nil {
			return fmt.Errorf("natsjs: ack: %w", err)
		}
		return nil
	}
	d.Nack = func(ctx context.Context, delay time.Duration) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("natsjs: nack: %w", err)
		}
		var err error
		if delay > 0 {
			err = msg.NakWithDelay(delay)
		} else {
			err = msg.Nak()
		}
		if err != nil {
			return fmt.Errorf("natsjs: nack: %w", err)
		}
		return nil
	}
	return d
}

// Pending is the consumer's lag: messages in the stream not yet delivered
// to it (consumer info num_pending). Delivered-but-unacked messages are
// not included.
func (c *Consumer) Pending(ctx context.Context) (uint64, error) {
	info, err := c.cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("natsjs: consumer info %q: %w", c.durable, err)
	}
	return info.NumPending, nil
}

func (c *Consumer) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close stops every running Consume (they return nil) and closes the
// connection if the consumer owns it. The durable consumer stays on the
// server, keeping its position; unacked messages are redelivered after
// AckWait.
func (c *Consumer) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	close(c.done)
	if c.ownsConn {
		c.nc.Close()
	}
	return nil
}
