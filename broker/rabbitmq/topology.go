package rabbitmq

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry"
)

// Topology errors.
var (
	// ErrTopologyMissing: the exchange or queue does not exist.
	ErrTopologyMissing = errors.New("rabbitmq: exchange or queue missing")
	// ErrNotDurable: the exchange or queue exists with other properties
	// than Ferry requires (not durable, not a quorum queue, other type):
	// the broker refused the equivalent declaration (406).
	ErrNotDurable = errors.New("rabbitmq: exchange or queue not durable as required")
)

// Topology is one destination: a durable topic exchange, a quorum queue
// and the bindings between them.
type Topology struct {
	// Exchange is the durable topic exchange the publisher uses
	// (WithExchange). Required; the default exchange cannot be declared.
	Exchange string
	// Queue is the consumer's queue, declared durable with
	// x-queue-type=quorum (replicated, fsynced before confirming).
	// Empty: publisher-side only, no queue and no binding.
	Queue string
	// BindingKeys are topic-exchange patterns binding Queue to Exchange;
	// the publisher's routing key is the event's Topic (e.g.
	// "order.events"). Default ["#"] (every topic).
	BindingKeys []string
}

func (t Topology) check() error {
	if t.Exchange == "" {
		return &ferry.ConfigError{Field: "rabbitmq.topology.exchange", Reason: "must not be empty"}
	}
	if len(t.Exchange) > 255 || len(t.Queue) > 255 {
		return &ferry.ConfigError{Field: "rabbitmq.topology", Reason: "exchange and queue names are at most 255 bytes"}
	}
	return nil
}

func (t Topology) bindingKeys() []string {
	if len(t.BindingKeys) == 0 {
		return []string{"#"}
	}
	return t.BindingKeys
}

// quorumArgs declare a quorum queue: replicated with Raft, messages
// confirmed only once a majority of replicas wrote them to disk.
var quorumArgs = amqp.Table{"x-queue-type": "quorum"}

// EnsureTopology declares the exchange (durable, topic), the quorum queue
// and its bindings. It is idempotent; when something already exists with
// other properties it fails with ErrNotDurable and changes nothing.
func EnsureTopology(ctx context.Context, url string, t Topology) error {
	if err := t.check(); err != nil {
		return err
	}
	return withChannel(ctx, url, func(conn *amqp.Connection) error {
		if err := step(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
		}); err != nil {
			return fmt.Errorf("rabbitmq: declare exchange %q: %w", t.Exchange, err)
		}
		if t.Queue == "" {
			return nil
		}
		if err := step(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(t.Queue, true, false, false, false, quorumArgs)
			return err
		}); err != nil {
			return fmt.Errorf("rabbitmq: declare queue %q: %w", t.Queue, err)
		}
		for _, k := range t.bindingKeys() {
			if err := step(conn, func(ch *amqp.Channel) error {
				return ch.QueueBind(t.Queue, k, t.Exchange, false, nil)
			}); err != nil {
				return fmt.Errorf("rabbitmq: bind queue %q to %q with %q: %w", t.Queue, t.Exchange, k, err)
			}
		}
		return nil
	})
}

// CheckTopology is the relay's start-up check: the exchange and the queue
// exist (passive declarations), and re-declaring them with Ferry's
// properties is accepted — RabbitMQ refuses an inequivalent declaration,
// so a non-durable exchange or a classic queue fails with ErrNotDurable.
// Bindings cannot be checked over AMQP 0-9-1; a missing one shows up as
// ErrUnroutable (ClassNotSent, broker.ErrDestinationMissing: the relay
// holds the rows until a queue is bound) on the first publish, thanks to
// mandatory.
func CheckTopology(ctx context.Context, url string, t Topology) error {
	if err := t.check(); err != nil {
		return err
	}
	return withChannel(ctx, url, func(conn *amqp.Connection) error {
		if err := step(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
		}); err != nil {
			return fmt.Errorf("rabbitmq: exchange %q: %w", t.Exchange, classifyDeclare(err))
		}
		if err := step(conn, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclare(t.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
		}); err != nil {
			return fmt.Errorf("rabbitmq: exchange %q: %w", t.Exchange, classifyDeclare(err))
		}
		if t.Queue == "" {
			return nil
		}
		if err := step(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(t.Queue, true, false, false, false, nil)
			return err
		}); err != nil {
			return fmt.Errorf("rabbitmq: queue %q: %w", t.Queue, classifyDeclare(err))
		}
		if err := step(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(t.Queue, true, false, false, false, quorumArgs)
			return err
		}); err != nil {
			return fmt.Errorf("rabbitmq: queue %q: %w", t.Queue, classifyDeclare(err))
		}
		return nil
	})
}

// DeleteTopology deletes the queue and the exchange (tests, teardown).
func DeleteTopology(ctx context.Context, url string, t Topology) error {
	return withChannel(ctx, url, func(conn *amqp.Connection) error {
		var errs []error
		if t.Queue != "" {
			errs = append(errs, step(conn, func(ch *amqp.Channel) error {
				_, err := ch.QueueDelete(t.Queue, false, false, false)
				return err
			}))
		}
		if t.Exchange != "" {
			errs = append(errs, step(conn, func(ch *amqp.Channel) error {
				return ch.ExchangeDelete(t.Exchange, false, false)
			}))
		}
		return errors.Join(errs...)
	})
}

func classifyDeclare(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case amqp.NotFound:
			return fmt.Errorf("%w: %w", ErrTopologyMissing, err)
		case amqp.PreconditionFailed:
			return fmt.Errorf("%w: %w", ErrNotDurable, err)
		}
	}
	return err
}

// withChannel dials, runs fn and closes the connection; ctx bounds the
// whole exchange (the connection is closed when it ends).
func withChannel(ctx context.Context, url string, fn func(*amqp.Connection) error) error {
	conn, err := dial(ctx, url, DefaultDialTimeout)
	if err != nil {
		return fmt.Errorf("rabbitmq: connect: %w", err)
	}
	defer conn.Close()
	done := make(chan error, 1)
	go func() { done <- fn(conn) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		conn.Close() // unblocks fn
		<-done
		return ctx.Err()
	}
}

// step runs one declaration on a fresh channel: a failed declaration closes
// its channel, so each gets its own.
func step(conn *amqp.Connection, fn func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := fn(ch); err != nil {
		return err
	}
	return ch.Close()
}
