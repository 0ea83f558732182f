package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

// BrokerName is Publisher.Name and Receipt.Broker.
const BrokerName = "rabbitmq"

// Errors wrapped by classified publish errors; branch on them with errors.Is.
var (
	// ErrUnroutable: the broker returned the message (basic.return, because
	// it is published mandatory) — no queue is bound for its routing key.
	// The broker acks such a message after returning it; Ferry reports it
	// ClassNotSent marked broker.ErrDestinationMissing (no queue stored
	// it; binding a queue makes the same message routable), never as
	// success.
	ErrUnroutable = errors.New("rabbitmq: message unroutable (no queue bound)")
	// ErrNacked: the broker refused the message (basic.nack), e.g. a
	// quorum queue without quorum or over its length limit. ClassNotSent.
	ErrNacked = errors.New("rabbitmq: message nacked by broker")
	// ErrConnectionLost: the connection or channel closed after the message
	// was written and before its confirm arrived. ClassIndeterminate.
	ErrConnectionLost = errors.New("rabbitmq: connection lost before confirm")
	// ErrExchangeNotFound: the exchange does not exist (the broker closed
	// the channel with 404). ClassNotSent marked
	// broker.ErrDestinationMissing: nothing was routed.
	ErrExchangeNotFound = errors.New("rabbitmq: exchange not found")
	// ErrTooLarge: the message exceeds WithMaxMessageBytes. ClassPermanent.
	ErrTooLarge = errors.New("rabbitmq: message too large")
	// ErrClosed: Publish after Close. ClassNotSent.
	ErrClosed = errors.New("rabbitmq: publisher closed")
)

// Stats counts what the publisher did since it was created. Every message
// counted in Published is eventually counted in exactly one of Confirmed,
// Nacked or Unconfirmed (Returned messages are also Confirmed: the broker
// acks after returning).
type Stats struct {
	Published   int64 // basic.publish written to the channel
	Confirmed   int64 // basic.ack received and awaited
	Nacked      int64 // basic.nack received
	Returned    int64 // basic.return received (unroutable)
	Unconfirmed int64 // no confirm before ctx ended or the channel closed
	Reconnects  int64 // connections opened after the first
}

// Publisher publishes Ferry events to a RabbitMQ exchange with publisher
// confirms, persistent delivery and the mandatory flag. One Publisher keeps
// one connection and one confirm-mode channel, reconnecting on the next
// call after either is lost; calls are serialised.
type Publisher struct {
	url string
	cfg config

	mu       sync.Mutex
	conn     *amqp.Connection
	ch       *amqp.Channel
	returns  chan amqp.Return
	chClose  chan *amqp.Error
	closeErr *amqp.Error // why the channel closed, once known
	dials    int
	closed   bool

	published, confirmed, nacked, returned, unconfirmed, reconnects atomic.Int64
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher returns a publisher for the AMQP URL. It connects lazily;
// call Ping to check the broker answers and CheckTopology that the
// destination exists.
func NewPublisher(url string, opts ...Option) (*Publisher, error) {
	if url == "" {
		return nil, &ferry.ConfigError{Field: "rabbitmq.url", Reason: "must not be empty"}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if _, err := amqp.ParseURI(url); err != nil {
		// The parse error may quote the URI, password included: not echoed.
		return nil, &ferry.ConfigError{Field: "rabbitmq.url", Reason: "not a valid amqp:// or amqps:// URI"}
	}
	return &Publisher{url: url, cfg: cfg}, nil
}

// Name returns "rabbitmq".
func (p *Publisher) Name() string { return BrokerName }

// Stats returns the publisher's counters.
func (p *Publisher) Stats() Stats {
	return Stats{
		Published: p.published.Load(), Confirmed: p.confirmed.Load(), Nacked: p.nacked.Load(),
		Returned: p.returned.Load(), Unconfirmed: p.unconfirmed.Load(), Reconnects: p.reconnects.Load(),
	}
}

func dial(ctx context.Context, url string, timeout time.Duration) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the AMQP handshake; amqp091 clears it once open.
			if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		},
		Heartbeat: 10 * time.Second,
		Properties: amqp.Table{
			"connection_name": "ferry-publisher",
		},
	})
}

// closeConn closes conn, waiting at most d for the server's close-ok.
// amqp091's Close waits for it without a bound: a server that keeps the
// connection alive (its heartbeats arrive) but does not answer — seen
// with a RabbitMQ 3.10 node whose quorum queue had no leader after a
// restart (ferry prove's rabbitmq-node-kill) — held the publisher's lock
// for ever, and the relay with it.
func closeConn(conn *amqp.Connection, d time.Duration) {
	_ = conn.CloseDeadline(time.Now().Add(d))
}

// connectLocked makes sure a confirm-mode channel is open.
func (p *Publisher) connectLocked(ctx context.Context) error {
	if p.ch != nil && !p.ch.IsClosed() && p.conn != nil && !p.conn.IsClosed() {
		return nil
	}
	p.dropLocked()
	conn, err := dial(ctx, p.url, p.cfg.dialTimeout)
	if err != nil {
		return fmt.Errorf("rabbitmq: connect: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		closeConn(conn, p.cfg.dialTimeout)
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		closeConn(conn, p.cfg.dialTimeout)
		return fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	// Buffered: amqp091 delivers basic.return synchronously on its
	// reader goroutine before it processes the following basic.ack, so
	// once a confirm is seen, its return (if any) is already in here.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 1024))
	p.chClose = ch.NotifyClose(make(chan *amqp.Error, 1))
	p.conn, p.ch, p.closeErr = conn, ch, nil
	if p.dials > 0 {
		p.reconnects.Add(1)
		p.cfg.logger.InfoContext(ctx, "rabbitmq: publisher reconnected")
	}
	p.dials++
	return nil
}

func (p *Publisher) dropLocked() {
	if p.conn != nil {
		closeConn(p.conn, p.cfg.dialTimeout)
	}
	p.conn, p.ch, p.returns, p.chClose = nil, nil, nil, nil
}

// Publish publishes every event to the exchange with routing key = the
// event's Topic, persistent, mandatory, message-id = event id, then waits
// for every confirm (pipelined: all are written before the first wait).
// The AMQP channel keeps publish order, so the events of an aggregate
// reach its queue in slice order.
//
// Outcomes per event: confirmed → receipt (exchange, routing key, delivery
// tag); returned → ClassNotSent ErrUnroutable; nacked → ClassNotSent
// ErrNacked; channel closed with 404 → ClassNotSent ErrExchangeNotFound;
// ErrUnroutable and ErrExchangeNotFound are marked
// broker.ErrDestinationMissing (a configuration fault, held by the relay);
// connection lost or ctx ended while waiting → ClassIndeterminate; not
// written (no connection, channel closed before the publish) → ClassNotSent.
func (p *Publisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	results := make([]broker.Result, len(events))
	p.mu.Lock()
	defer p.mu.Unlock()
	notSent := func(from int, err error) {
		for i := from; i < len(events); i++ {
			if results[i].Err == nil {
				results[i].Err = broker.NewError(broker.ClassNotSent, err)
			}
		}
	}
	if p.closed {
		notSent(0, ErrClosed)
		return results
	}
	if err := p.connectLocked(ctx); err != nil {
		notSent(0, err)
		return results
	}
	ch, returns := p.ch, p.returns

	type pending struct {
		i  int
		dc *amqp.DeferredConfirmation
	}
	pend := make([]pending, 0, len(events))
	// An event refused before sending holds back the later events of its
	// aggregate in this call (NotSent): the queue never gets a later event
	// of an aggregate without the earlier one.
	var hb broker.HoldBack
	for i := range events {
		ev := &events[i]
		if err := hb.Refuse("rabbitmq", i, ev); err != nil {
			results[i].Err = err
			continue
		}
		msg := publishing(*ev, p.cfg.source)
		if len(msg.Body) > p.cfg.maxMessage {
			results[i].Err = broker.NewError(broker.ClassPermanent,
				fmt.Errorf("%w: event %s body is %d bytes, limit %d", ErrTooLarge, ev.ID, len(msg.Body), p.cfg.maxMessage))
			hb.Fail(ev)
			continue
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.exchange, ev.Topic, true, false, msg)
		if err != nil {
			// Not written: the channel is closed or ctx ended first.
			notSent(i, fmt.Errorf("rabbitmq: publish event %s: %w", ev.ID, err))
			break
		}
		p.published.Add(1)
		pend = append(pend, pending{i: i, dc: dc})
	}

	returned := map[string]amqp.Return{}
	take := func(r amqp.Return) {
		returned[r.MessageId] = r
		p.returned.Add(1)
	}
	waited := 0
wait:
	for _, pe := range pend {
		for {
			select {
			case r, ok := <-returns:
				if !ok { // closed with the channel
					returns = nil
				} else {
					take(r)
				}
				continue
			case <-pe.dc.Done():
			case <-ctx.Done():
				break wait
			}
			break
		}
		waited++
	}
	for drained := false; !drained; {
		select {
		case r, ok := <-returns:
			if !ok {
				returns, drained = nil, true
			} else {
				take(r)
			}
		default:
			drained = true
		}
	}
	if p.closeErr == nil {
		select {
		case e, ok := <-p.chClose:
			if ok && e != nil {
				p.closeErr = e
			}
		default:
		}
	}

	for n, pe := range pend {
		ev := &events[pe.i]
		if n >= waited {
			p.unconfirmed.Add(1)
			results[pe.i].Err = broker.NewError(broker.ClassIndeterminate,
				fmt.Errorf("rabbitmq: waiting for confirm of event %s: %w", ev.ID, ctx.Err()))
			continue
		}
		if r, ok := returned[ev.ID.String()]; ok {
			p.confirmed.Add(1) // the broker acks a returned message too
			results[pe.i].Err = broker.DestinationMissing(fmt.Sprintf("rabbitmq routing key %q", r.RoutingKey),
				fmt.Errorf("%w: event %s, exchange %q, routing key %q: %d %s", ErrUnroutable, ev.ID, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText))
			continue
		}
		if pe.dc.Acked() {
			p.confirmed.Add(1)
			results[pe.i].Receipt = broker.Receipt{
				Broker:      BrokerName,
				Destination: p.cfg.exchange,
				Key:         ev.Topic,
				Offset:      int64(pe.dc.DeliveryTag),
			}
			continue
		}
		// A false confirm is a broker nack, or amqp091 failing every
		// outstanding confirm because the channel closed.
		switch {
		case p.closeErr != nil && p.closeErr.Code == amqp.NotFound:
			p.unconfirmed.Add(1)
			results[pe.i].Err = broker.DestinationMissing(fmt.Sprintf("rabbitmq exchange %q", p.cfg.exchange),
				fmt.Errorf("%w: %q (event %s): %s", ErrExchangeNotFound, p.cfg.exchange, ev.ID, p.closeErr.Reason))
		case p.closeErr != nil || ch.IsClosed():
			p.unconfirmed.Add(1)
			results[pe.i].Err = broker.NewError(broker.ClassIndeterminate,
				fmt.Errorf("%w: event %s: %v", ErrConnectionLost, ev.ID, p.closeErr))
		default:
			p.nacked.Add(1)
			results[pe.i].Err = broker.NewError(broker.ClassNotSent, fmt.Errorf("%w: event %s", ErrNacked, ev.ID))
		}
	}
	return results
}

// publishing builds the AMQP message of an event: CloudEvents attributes in
// "cloudEvents:*" headers, datacontenttype in the content-type property,
// message-id = event id (the broker-native dedup id), persistent.
func publishing(ev ferry.Event, source string) amqp.Publishing {
	headers, body := cloudevents.Encode(cloudevents.AMQP, ev, cloudevents.EncodeOptions{Source: source})
	ct := headers[cloudevents.ContentTypeHeader]
	delete(headers, cloudevents.ContentTypeHeader)
	table := make(amqp.Table, len(headers))
	for k, v := range headers {
		table[k] = v
	}
	return amqp.Publishing{
		Headers:      table,
		ContentType:  ct,
		DeliveryMode: amqp.Persistent,
		MessageId:    ev.ID.String(),
		Timestamp:    ev.OccurredAt,
		Body:         body,
	}
}

// Ping opens (reconnecting if needed) and closes a channel: a round trip
// to the broker.
func (p *Publisher) Ping(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.connectLocked(ctx); err != nil {
		return fmt.Errorf("rabbitmq: ping: %w", err)
	}
	done := make(chan error, 1)
	conn := p.conn
	go func() {
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			p.dropLocked()
			return fmt.Errorf("rabbitmq: ping: %w", err)
		}
		return nil
	case <-ctx.Done():
		// The goroutine ends when the connection closes.
		p.dropLocked()
		return fmt.Errorf("rabbitmq: ping: %w", ctx.Err())
	}
}

// Close closes the connection; it waits for a running Publish. Safe to
// call twice.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.dropLocked()
	return nil
}
