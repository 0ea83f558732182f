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
	// DefaultAckWait is how long the server keeps a delivered message of a
	// consumer that stopped answering before redelivering it: the recovery
	// time of a SIGKILLed consumer's messages. A live Consumer keeps its
	// unsettled messages alive (InProgress every AckWait/3), so a slow
	// transaction or a long queue is not redelivered meanwhile.
	DefaultAckWait = 5 * time.Second
	// DefaultMaxAckPending leaves room for a few crashed consumers: each
	// holds up to the inbox's in-flight bound (8 × (64 + 1) + 256 = 776 with
	// the defaults) until its ack wait expires, and a restarted consumer
	// receives only what is left below this cap.
	DefaultMaxAckPending = 4096
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
	ackWait  time.Duration
	maxAck   int
	ownsConn bool
	cfg      consumerConfig

	mu     sync.Mutex
	closed bool
	done   chan struct{}

	// unsettled holds every delivered message not yet acked or nacked:
	// kept alive while the Consumer lives, nacked by Close.
	umu       sync.Mutex
	unsettled map[uint64]jetstream.Msg
	nextID    uint64
	keepalive sync.WaitGroup
	running   sync.WaitGroup // Consume calls, which Close waits for
}

// ConsumerOption configures NewConsumer.
type ConsumerOption func(*consumerConfig) error

type consumerConfig struct {
	ackWait       time.Duration
	maxDeliver    int
	maxAckPending int
	filter        string
	batch         int
	pullHeartbeat time.Duration

	// Negative controls (this package's tests only).
	noKeepAlive bool // never send InProgress
	noNakOnStop bool // leave unfinished messages to AckWait, as before
}

// WithAckWait is how long the server waits for an ack before redelivering
// (default 5s). While the Consumer lives it sends InProgress for every
// unsettled message each AckWait/3, so the wait is a liveness timeout, not
// a bound on the transaction: it is how long the messages of a consumer
// that died without Close (SIGKILL, lost host) stay with it before another
// consumer receives them. Shorter recovers faster; each held message costs
// one InProgress per AckWait/3, and a process paused longer than AckWait
// (GC, SIGSTOP) sees its messages redelivered meanwhile (the inbox dedups
// them).
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

// WithMaxAckPending bounds the delivered-but-unacked messages of the
// durable, over all its clients (default 4096): the server stops
// delivering at the bound. A consumer that dies without Close keeps its
// unacked messages counted until AckWait expires, so keep the bound at two
// or more times the inbox's in-flight bound (workers × (queue + batch) +
// pull batch; inbox.Run warns otherwise), or a restarted consumer receives
// nothing until then.
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
// handler when Consume stops are nacked at once, for immediate
// redelivery.
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
		pullHeartbeat: DefaultPullHeartbeat,
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
	c := &Consumer{
		nc: nc, js: js, cons: cons,
		stream: stream, durable: durable, batch: cfg.batch,
		ackWait: cfg.ackWait, maxAck: cfg.maxAckPending, cfg: cfg,
		done:      make(chan struct{}),
		unsettled: map[uint64]jetstream.Msg{},
	}
	c.keepalive.Add(1)
	go c.keepAlive()
	return c, nil
}

// InFlightLimits reports the server's cap on delivered-but-unacked
// messages (MaxAckPending), how many messages the client buffers ahead of
// the handler (the pull batch) and how long the server keeps the messages
// of a dead consumer before redelivering them (AckWait). inbox.Run checks
// its in-flight bound against them.
func (c *Consumer) InFlightLimits() (maxUnacked, buffered int, redeliverAfter time.Duration) {
	return c.maxAck, c.batch, c.ackWait
}

// keepAlive sends InProgress for every unsettled message each AckWait/3
// until Close, so the server does not redeliver a message a live consumer
// still holds.
func (c *Consumer) keepAlive() {
	defer c.keepalive.Done()
	t := time.NewTicker(c.ackWait / 3)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if c.cfg.noKeepAlive {
				continue
			}
			for _, m := range c.unsettledMsgs() {
				_ = m.InProgress() // best effort: a lost one only means an early redelivery
			}
		}
	}
}

func (c *Consumer) track(msg jetstream.Msg) (untrack func()) {
	c.umu.Lock()
	defer c.umu.Unlock()
	c.nextID++
	id := c.nextID
	c.unsettled[id] = msg
	return func() {
		c.umu.Lock()
		delete(c.unsettled, id)
		c.umu.Unlock()
	}
}

func (c *Consumer) unsettledMsgs() []jetstream.Msg {
	c.umu.Lock()
	defer c.umu.Unlock()
	out := make([]jetstream.Msg, 0, len(c.unsettled))
	for _, m := range c.unsettled {
		out = append(out, m)
	}
	return out
}

// nakUnsettled nacks (no delay) every message delivered and not settled,
// and flushes, so the server redelivers them at once.
func (c *Consumer) nakUnsettled() {
	if c.cfg.noNakOnStop {
		return
	}
	c.umu.Lock()
	msgs := make([]jetstream.Msg, 0, len(c.unsettled))
	for id, m := range c.unsettled {
		msgs = append(msgs, m)
		delete(c.unsettled, id)
	}
	c.umu.Unlock()
	for _, m := range msgs {
		_ = m.Nak()
	}
	if len(msgs) > 0 {
		_ = c.nc.FlushTimeout(2 * time.Second)
	}
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
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("natsjs: Consume after Close")
	}
	c.running.Add(1)
	c.mu.Unlock()
	defer c.running.Done()
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

	it, err := c.cons.Messages(jetstream.PullMaxMessages(c.batch),
		jetstream.PullHeartbeat(c.cfg.pullHeartbeat),
		// Missed heartbeats re-pull (see DefaultPullHeartbeat) instead of
		// ending Consume.
		jetstream.WithMessagesErrOnMissingHeartbeat(false))
	if err != nil {
		return fmt.Errorf("natsjs: consume %q: %w", c.durable, err)
	}
	defer c.nakBuffered(it)
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

// DefaultPullHeartbeat is how often the server signals an idle pull
// request it holds for Consume. Two missed heartbeats make the iterator
// drop its count of requested messages and pull again. That is how
// Consume gets going again when its pull request is gone without a word:
//   - the server holding it died (a stream or consumer leader SIGKILLed
//     in a cluster, while the client stays connected to another node);
//   - the server dropped it: a request with a heartbeat that finds the
//     consumer's waiting queue full gets no answer at all;
//   - nats.go skipped the re-pull (its Next asks for more only while no
//     pull request of its own is being sent; when that sender goroutine is
//     descheduled until the batch it asked for has been handed out, Next
//     waits with nothing requested: seen under load, a consumer stalled
//     after its first batch of 10 with 50 pending on the server).
//
// nats.go's default (half the 30 s pull expiry) made either a 30 s stall
// ending in an error. One heartbeat a second per waiting pull request is
// cheap; a missed heartbeat costs at most one extra pull batch buffered.
const DefaultPullHeartbeat = time.Second

// nakBuffered stops the iterator and nacks the messages it had pulled but
// not handed out, so they are redelivered at once instead of after
// AckWait.
func (c *Consumer) nakBuffered(it jetstream.MessagesContext) {
	if c.cfg.noNakOnStop {
		it.Stop()
		return
	}
	it.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n := 0
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			break
		}
		_ = msg.Nak()
		n++
	}
	it.Stop()
	if n > 0 {
		_ = c.nc.FlushTimeout(2 * time.Second)
	}
}

func (c *Consumer) delivery(msg jetstream.Msg) *broker.Delivery {
	// A repeated ce- header is ambiguous: DecodeMulti refuses it, naming
	// the attribute; headers joins repeated values for the raw record.
	ev, headers, decodeErr := cloudevents.DecodeMulti(cloudevents.NATS, msg.Headers(), msg.Data())
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
	d.Event, d.DecodeErr = ev, decodeErr
	if d.DecodeErr == nil {
		d.Event.Topic = msg.Subject()
	}
	untrack := c.track(msg)
	d.Ack = func(ctx context.Context) error {
		untrack()
		if err := msg.DoubleAck(ctx); err != nil {
			return fmt.Errorf("natsjs: ack: %w", err)
		}
		return nil
	}
	d.Nack = func(ctx context.Context, delay time.Duration) error {
		untrack()
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

// Close stops every running Consume (they return nil), nacks every
// message delivered and not yet acked or nacked — so another consumer of
// the durable receives them at once instead of after AckWait — and closes
// the connection if the consumer owns it. Call it after inbox.Run has
// returned: a message still in a transaction when Close nacks it is
// redelivered while it commits (the inbox dedups it). The durable consumer
// stays on the server, keeping its position.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	c.mu.Unlock()
	c.keepalive.Wait()
	c.running.Wait()
	c.nakUnsettled()
	if c.ownsConn {
		c.nc.Close()
	}
	return nil
}
