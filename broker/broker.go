// Package broker is the seam between Ferry and message brokers: the relay
// publishes through a [Publisher], the inbox consumes through a [Consumer].
// Adapters live in sub-packages (broker/natsjs, broker/kafka,
// broker/rabbitmq); each states its durability preconditions and what it
// guarantees (dedup window, ordering by key), and runs the broker
// conformance suite that checks exactly that.
//
// Errors are classified, never string-matched: a publish error is
// [ErrNotSent] (definitely not delivered: safe to retry), [ErrIndeterminate]
// (sent, outcome unknown: retry, relying on the event id for dedup) or
// [ErrPermanent] (will never succeed as is: dead-letter it). A missing
// destination is [ErrNotSent] marked [ErrDestinationMissing]: a
// configuration fault to hold and alert on, never a poison event.
package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferryhq/ferry"
)

// Publisher publishes outbox events to one broker.
type Publisher interface {
	// Name identifies the broker kind ("nats", "kafka", "rabbitmq").
	Name() string
	// Publish sends every event (pipelined, not one round trip each) and
	// waits for every acknowledgement, bounded by ctx. It returns exactly
	// one Result per event, in order. Events of one aggregate must reach the
	// broker in slice order (partition key = aggregate).
	Publish(ctx context.Context, events []ferry.Event) []Result
	// Ping checks the broker answers; the relay's circuit breaker probes
	// with it instead of burning row attempts during an outage.
	Ping(ctx context.Context) error
	// Close releases connections. Publish must not be called after.
	Close() error
}

// Result is the outcome of publishing one event.
type Result struct {
	Receipt Receipt // valid when Err is nil
	Err     error   // nil, or an error matching one of the class sentinels
}

// Receipt is the broker's proof of acceptance, stored in the outbox row.
type Receipt struct {
	Broker      string `json:"broker"`
	Destination string `json:"destination"`         // stream, topic or exchange
	Key         string `json:"key,omitempty"`       // subject, partition key or routing key
	Partition   int32  `json:"partition,omitempty"` // Kafka
	Offset      int64  `json:"offset,omitempty"`    // stream sequence, Kafka offset, AMQP delivery tag
	Duplicate   bool   `json:"duplicate,omitempty"` // the broker recognised the event id as already stored
}

// String is the JSON stored in outbox.broker_receipt.
func (r Receipt) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// Class says what a publish error means for retries.
type Class int

// The error classes.
const (
	ClassNotSent       Class = iota + 1 // definitely not delivered
	ClassIndeterminate                  // may have been delivered (timeout after send)
	ClassPermanent                      // never deliverable as is (too large, no route)
)

func (c Class) String() string {
	switch c {
	case ClassNotSent:
		return "not_sent"
	case ClassIndeterminate:
		return "indeterminate"
	case ClassPermanent:
		return "permanent"
	}
	return "unknown"
}

// Sentinels matched by *PublishError according to its class.
var (
	ErrNotSent       = errors.New("broker: not sent")
	ErrIndeterminate = errors.New("broker: outcome indeterminate")
	ErrPermanent     = errors.New("broker: permanent failure")

	// ErrDestinationMissing marks a ClassNotSent error whose cause is a
	// destination the broker does not have (yet): a Kafka topic that does
	// not exist, a NATS subject no stream captures, a RabbitMQ routing key
	// no queue is bound to. It is a configuration fault, not a poison
	// event: nothing was stored, and the same event succeeds once the
	// destination is created. The relay holds such rows (no attempt
	// charged, never dead), retries them with a capped backoff and reports
	// the fault (ferry_relay_destination_missing). Match it with errors.Is.
	ErrDestinationMissing = errors.New("broker: destination missing")
)

// DestinationMissing classifies err as ClassNotSent and marks it with
// ErrDestinationMissing; what names the destination ("topic orders").
func DestinationMissing(what string, err error) *PublishError {
	return NewError(ClassNotSent, fmt.Errorf("%w: %s: %w", ErrDestinationMissing, what, err))
}

// PublishError wraps a broker error with its class.
type PublishError struct {
	Class Class
	Err   error
}

// NewError classifies err.
func NewError(c Class, err error) *PublishError { return &PublishError{Class: c, Err: err} }

func (e *PublishError) Error() string { return fmt.Sprintf("broker: %s: %v", e.Class, e.Err) }

// Unwrap returns the broker's error.
func (e *PublishError) Unwrap() error { return e.Err }

// Is matches the sentinel of the error's class.
func (e *PublishError) Is(target error) bool {
	switch target {
	case ErrNotSent:
		return e.Class == ClassNotSent
	case ErrIndeterminate:
		return e.Class == ClassIndeterminate
	case ErrPermanent:
		return e.Class == ClassPermanent
	}
	return false
}

// ClassOf returns err's class; unclassified errors count as indeterminate,
// the safe assumption (retry, and rely on event-id dedup).
func ClassOf(err error) Class {
	var pe *PublishError
	if errors.As(err, &pe) {
		return pe.Class
	}
	return ClassIndeterminate
}

// Consumer delivers messages from one subscription. Adapters implement the
// broker's own acknowledgement rules behind Delivery.Ack (e.g. Kafka commits
// an offset only when every earlier record of the partition is acked).
type Consumer interface {
	// Consume calls handle for each message, from one goroutine, in broker
	// order, until ctx is cancelled (then it returns nil after releasing
	// the subscription) or a fatal error occurs. handle may block to apply
	// back-pressure. Delivery.Ack and Delivery.Nack may be called later,
	// from any goroutine and in any order; the adapter must be safe for
	// that (the inbox applies messages of different aggregates in parallel).
	Consume(ctx context.Context, handle func(context.Context, *Delivery)) error
	Close() error
}

// Delivery is one received message.
type Delivery struct {
	// Event is the decoded event; valid when DecodeErr is nil.
	Event ferry.Event
	// DecodeErr is set when the message is not a valid Ferry/CloudEvents
	// message; the inbox parks it (never drops it) using Raw.
	DecodeErr error
	// Raw is the message as received, for parking and evidence.
	Raw RawMessage
	// Attempt is the broker's delivery count (1 = first), 0 when unknown.
	Attempt int
	// Ack confirms the message; call it only after the consumer transaction committed.
	Ack func(ctx context.Context) error
	// Nack asks for redelivery after delay (best effort per broker).
	Nack func(ctx context.Context, delay time.Duration) error
}

// RawMessage is a message's wire form.
type RawMessage struct {
	Destination string            // subject, topic or queue
	Key         string            // partition / routing key
	Headers     map[string]string // as received (lower-cased names where the binding says so)
	Body        []byte
}
