package ferry

import (
	"time"

	"github.com/google/uuid"
)

// Event is one fact announced by a business transaction. Every field has a
// job: ID is the dedup identity everywhere, the aggregate triple and
// AggregateSeq carry per-aggregate order, EventType and SchemaVersion are the
// contract a consumer checks, and Headers carry trace and provenance.
//
// Fields marked "assigned" are filled in by the outbox writer when zero.
type Event struct {
	// ID is the event's immutable identity (UUIDv7). Assigned when zero;
	// kept when given, so a retried command reuses its id.
	ID uuid.UUID

	// TenantID scopes the event; the inbox keys dedup by tenant too.
	TenantID string
	// AggregateType and AggregateID name the entity the event is about.
	// Order is promised per (TenantID, AggregateType, AggregateID).
	AggregateType string
	AggregateID   string
	// AggregateSeq is 1, 2, 3… per aggregate. Zero means "allocate the next
	// one" (the usual case). A non-zero value is the caller's expected
	// version: the write fails with ErrSequenceConflict unless it is exactly
	// the next number, and nothing is written.
	AggregateSeq int64

	// EventType routes and names the contract, e.g. "order.created".
	EventType string
	// SchemaVersion of the payload, >= 1. Consumers declare what they support.
	SchemaVersion int

	// ContentType of Payload, one of Limits.ContentTypes. Default application/json.
	ContentType string
	// Payload is the event body. Keep it small; large data goes by reference.
	Payload []byte

	// OccurredAt is business time (assigned: now). It is never an ordering
	// key; publication time is recorded separately by the relay.
	OccurredAt time.Time

	// Topic is where the relay publishes the event. Assigned from the
	// writer's topic template (default "{aggregate_type}.events") when empty.
	Topic string
	// Shard is hash(tenant, aggregate_type, aggregate_id) mod the shard
	// count, fixed at write (assigned, never taken from the caller).
	Shard int

	Headers Headers
}

// Headers carry trace context and provenance. Possession of a message is not
// authorization: consumers re-check current policy using Principal, Action
// and Target.
type Headers struct {
	// Traceparent is the W3C trace context of the command that wrote the event.
	Traceparent string
	// CorrelationID ties together everything done for one request.
	CorrelationID string
	// CausationID is the id of the message or command that caused this event.
	CausationID string
	// Principal is who asked for the change (user, service, agent).
	Principal string
	// Action is what the principal did, e.g. "order.create".
	Action string
	// Target is the resource acted on, e.g. "order/42".
	Target string
}

// NewEventID returns a new UUIDv7: time-ordered, so ids inserted together
// stay close in indexes.
func NewEventID() (uuid.UUID, error) {
	return uuid.NewV7()
}
