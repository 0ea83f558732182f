package shadow

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// RabbitReader is a [Reader] over one RabbitMQ queue the user names (bound
// to the production or the shadow routing keys). It does not consume: it
// takes up to the queue's message count at the start with basic.get and no
// ack, then closes the channel, which returns every message to the queue
// (requeued, marked redelivered). Read a classic queue no application
// consumes, bound only for the comparison: a classic queue puts a requeued
// message back at its position, a quorum queue does not keep their order
// (a second read would report reorders that are not there) and may count
// the return toward its delivery-limit; while the read lasts its messages
// are held by the reader, and a message another consumer holds unacked is
// not seen. The read is bounded by the ready count at the start. since
// filters by the AMQP timestamp property when the publisher set it (Ferry
// does); messages without one are kept. Seq is the position in the read.
type RabbitReader struct {
	URL   string
	Queue string
}

// Read implements [Reader].
func (r RabbitReader) Read(ctx context.Context, since time.Time) ([]Message, error) {
	if r.Queue == "" {
		return nil, errors.New("shadow: rabbitmq: queue must not be empty")
	}
	// fail names the queue; after a cancel (which closes the connection)
	// the context's error is the cause, not the closed channel.
	fail := func(what string, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("shadow: queue %s: %w", r.Queue, cerr)
		}
		return fmt.Errorf("shadow: queue %s: %s%w", r.Queue, what, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fail("", err)
	}
	dial := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < dial {
		dial = max(time.Until(dl), time.Millisecond)
	}
	conn, err := amqp.DialConfig(r.URL, amqp.Config{Dial: amqp.DefaultDial(dial)})
	if err != nil {
		return nil, fail("connect: ", err)
	}
	defer conn.Close()
	// basic.get takes no context: closing the connection on cancel ends a
	// get that waits on the server (and requeues what was taken).
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fail("channel: ", err)
	}
	defer ch.Close() // returns every unacked message to the queue
	q, err := ch.QueueDeclarePassive(r.Queue, true, false, false, false, nil)
	if err != nil {
		return nil, fail("", err)
	}
	var out []Message
	for i := 0; i < q.Messages; i++ {
		if err := ctx.Err(); err != nil {
			return nil, fail("", err)
		}
		d, ok, err := ch.Get(r.Queue, false)
		if err != nil {
			return nil, fail("get: ", err)
		}
		if !ok {
			break
		}
		if !since.IsZero() && !d.Timestamp.IsZero() && d.Timestamp.Before(since.Truncate(time.Second)) {
			continue
		}
		h := map[string]string{}
		for k, v := range d.Headers {
			switch x := v.(type) {
			case string:
				h[k] = x
			case []byte:
				h[k] = string(x)
			default:
				h[k] = fmt.Sprint(x)
			}
		}
		out = append(out, Message{Seq: uint64(len(out) + 1), Headers: h, Body: d.Body})
	}
	return out, nil
}
