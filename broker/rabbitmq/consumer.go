package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/runstate"
)

// Consumer errors.
var (
	// ErrConsuming: Consume was called while another Consume runs.
	ErrConsuming = errors.New("rabbitmq: consumer already consuming")
	// ErrConsumerClosed: Consume after Close.
	ErrConsumerClosed = errors.New("rabbitmq: consumer closed")
	// ErrSettled: Ack or Nack called twice for one delivery.
	ErrSettled = errors.New("rabbitmq: delivery already acked or nacked")
	// ErrChannelGone: the channel the message came on has closed, so its
	// delivery tag means nothing any more. The broker requeues every
	// message unacked on a closed channel: it will be delivered again.
	ErrChannelGone = errors.New("rabbitmq: delivery's channel is closed; the message will be redelivered")
)

// Consumer consumes one queue with manual acks and a prefetch window,
// reconnecting when the connection is lost.
type Consumer struct {
	url   string
	queue string
	cfg   config

	run runstate.State // Consume once at a time, Close waits for it, delayed requeues
}

var _ broker.Consumer = (*Consumer)(nil)

// NewConsumer returns a consumer of queue (declare it with EnsureTopology).
func NewConsumer(url, queue string, opts ...Option) (*Consumer, error) {
	if url == "" {
		return nil, &ferry.ConfigError{Field: "rabbitmq.url", Reason: "must not be empty"}
	}
	if queue == "" || len(queue) > 255 {
		return nil, &ferry.ConfigError{Field: "rabbitmq.queue", Reason: "must be 1..255 bytes"}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, &ferry.ConfigError{Field: "rabbitmq.url", Reason: "not a valid amqp:// or amqps:// URI"}
	}
	return &Consumer{url: url, queue: queue, cfg: cfg}, nil
}

// InFlightLimits reports the prefetch window (the most unacked deliveries
// the broker hands this consumer) and 0 for the client buffer and the
// redelivery delay: RabbitMQ requeues a dead consumer's unacked messages
// as soon as its connection closes. inbox.Run checks its workers against
// the prefetch.
func (c *Consumer) InFlightLimits() (maxUnacked, buffered int, redeliverAfter time.Duration) {
	return c.cfg.prefetch, 0, 0
}

// Consume delivers the queue's messages to handle until ctx ends or Close.
// When the connection is lost it reconnects with exponential backoff; the
// broker requeues what was unacked on the lost channel (Ack of such a
// delivery returns ErrChannelGone). It returns nil on cancellation, or an
// error wrapping ErrTopologyMissing when the queue does not exist. handle
// may block for back-pressure but must return once its ctx is done.
func (c *Consumer) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	ctx, end, err := c.run.Begin(ctx, ErrConsumerClosed, ErrConsuming)
	if err != nil {
		return err
	}
	defer end()

	delay := c.cfg.reconnectDelay
	logger := c.cfg.logger.With("broker", BrokerName, "queue", c.queue)
	for {
		established, err := c.session(ctx, handle)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrTopologyMissing) {
			return err
		}
		if established {
			// The session was consuming: this is a fresh outage.
			delay = c.cfg.reconnectDelay
		}
		logger.WarnContext(ctx, "rabbitmq: consumer connection lost; reconnecting", logattr.Err(err), "backoff", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Minute)
	}
}

// session runs one connection until it is lost or ctx ends; established
// reports whether it got as far as consuming.
func (c *Consumer) session(ctx context.Context, handle func(context.Context, *broker.Delivery)) (established bool, err error) {
	conn, err := dial(ctx, c.url, c.cfg.dialTimeout)
	if err != nil {
		return false, fmt.Errorf("rabbitmq: connect: %w", err)
	}
	defer closeConn(conn, c.cfg.dialTimeout) // requeues everything unacked on this connection
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	if err := ch.Qos(c.cfg.prefetch, 0, false); err != nil {
		return false, fmt.Errorf("rabbitmq: qos: %w", err)
	}
	deliveries, err := ch.Consume(c.queue, c.cfg.consumerTag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("rabbitmq: consume %q: %w", c.queue, classifyDeclare(err))
	}
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case d, ok := <-deliveries:
			if !ok {
				return true, fmt.Errorf("rabbitmq: delivery channel closed")
			}
			handle(ctx, c.delivery(ch, d))
		}
	}
}

// delivery turns an AMQP delivery into a broker.Delivery. The AMQP
// content-type property goes back into the header map under
// "content-type", where the codec expects it.
func (c *Consumer) delivery(ch *amqp.Channel, d amqp.Delivery) *broker.Delivery {
	headers := make(map[string]string, len(d.Headers)+1)
	for k, v := range d.Headers {
		switch x := v.(type) {
		case string:
			headers[k] = x
		case []byte:
			headers[k] = string(x)
		default:
			headers[k] = fmt.Sprint(x)
		}
	}
	if d.ContentType != "" {
		headers[cloudevents.ContentTypeHeader] = d.ContentType
	}
	out := &broker.Delivery{
		Raw: broker.RawMessage{
			Destination: c.queue,
			Key:         d.RoutingKey,
			Headers:     headers,
			Body:        d.Body,
		},
		Attempt: attempt(d),
	}
	ev, err := cloudevents.Decode(cloudevents.AMQP, headers, d.Body)
	if err != nil {
		out.DecodeErr = fmt.Errorf("rabbitmq: decode message %q from %q: %w", d.MessageId, c.queue, err)
	} else {
		ev.Topic = d.RoutingKey
		out.Event = ev
	}

	var mu sync.Mutex
	settled := false
	settle := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if settled {
			return false
		}
		settled = true
		return true
	}
	tag := d.DeliveryTag
	// amqp091's Channel serialises frame writes with a mutex, so Ack and
	// Nack are safe from any goroutine and in any order; each acks one tag
	// (multiple=false), never its predecessors.
	out.Ack = func(context.Context) error {
		if !settle() {
			return ErrSettled
		}
		if err := ch.Ack(tag, false); err != nil {
			return settleErr(ch, err)
		}
		return nil
	}
	out.Nack = func(_ context.Context, delay time.Duration) error {
		if !settle() {
			return ErrSettled
		}
		if delay <= 0 {
			if err := ch.Nack(tag, false, true); err != nil {
				return settleErr(ch, err)
			}
			return nil
		}
		// RabbitMQ has no delayed requeue: the message stays unacked
		// (holding a prefetch slot) for delay, then is requeued.
		if !c.run.AfterFunc(delay, func() { _ = ch.Nack(tag, false, true) }) {
			return ErrChannelGone
		}
		return nil
	}
	return out
}

func settleErr(ch *amqp.Channel, err error) error {
	if ch.IsClosed() || errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrChannelGone, err)
	}
	return fmt.Errorf("rabbitmq: settle: %w", err)
}

// attempt is the delivery count: quorum queues count failed deliveries in
// the x-delivery-count header (absent on the first delivery); other queues
// only flag redeliveries, so a redelivered message there counts as 2 at
// least.
func attempt(d amqp.Delivery) int {
	n := 1
	switch v := d.Headers["x-delivery-count"].(type) {
	case int64:
		n = int(v) + 1
	case int32:
		n = int(v) + 1
	case int:
		n = v + 1
	case int16:
		n = int(v) + 1
	case string:
		if x, err := strconv.Atoi(v); err == nil {
			n = x + 1
		}
	}
	if d.Redelivered && n < 2 {
		n = 2
	}
	return n
}

// Close stops a running Consume and waits for it; unacked messages are
// requeued by the broker. Safe to call twice.
func (c *Consumer) Close() error {
	c.run.Close()
	return nil
}
