package ferry

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Sentinel errors callers branch on with errors.Is. Concrete errors carry
// the details and match these.
var (
	// ErrInvalidEvent: an event failed validation; see *ValidationError.
	ErrInvalidEvent = errors.New("ferry: invalid event")
	// ErrInvalidConfig: a configuration value (table name, limit, template)
	// was rejected; see *ConfigError.
	ErrInvalidConfig = errors.New("ferry: invalid configuration")
	// ErrSequenceConflict: a caller-supplied AggregateSeq was not the next
	// number for its aggregate; see *SequenceConflictError. Nothing was written.
	ErrSequenceConflict = errors.New("ferry: aggregate sequence conflict")
	// ErrDuplicateEventID: an event with this ID is already in the outbox;
	// see *DuplicateEventIDError. Nothing from the call was written. (Two
	// events with one ID in the same call are rejected by validation
	// instead, as ErrInvalidEvent.)
	ErrDuplicateEventID = errors.New("ferry: duplicate event id")
)

// DuplicateEventIDError names the event of the call whose ID is already in
// the outbox. Err is the database's own error.
type DuplicateEventIDError struct {
	Index int // position of the event in the call; -1 when the database did not say which
	ID    uuid.UUID
	Err   error
}

func (e *DuplicateEventIDError) Error() string {
	if e.Index < 0 {
		return "ferry: duplicate event id: an event of the call has an id already in the outbox"
	}
	return fmt.Sprintf("ferry: duplicate event id: event[%d].event_id %s is already in the outbox", e.Index, e.ID)
}

// Unwrap returns the database's error.
func (e *DuplicateEventIDError) Unwrap() error { return e.Err }

// Is reports ErrDuplicateEventID.
func (e *DuplicateEventIDError) Is(target error) bool { return target == ErrDuplicateEventID }

// ValidationError names the event (by position in the call), the field and
// the limit that was broken. Its message never contains payload bytes.
type ValidationError struct {
	Index  int    // position of the event in the call
	Field  string // e.g. "payload", "headers.traceparent"
	Reason string // what is wrong, including the limit
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("ferry: invalid event[%d].%s: %s", e.Index, e.Field, e.Reason)
}

// Is reports ErrInvalidEvent so callers need not know the concrete type.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidEvent }

// ConfigError names the configuration field that was rejected and why.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("ferry: invalid configuration %s: %s", e.Field, e.Reason)
}

// Is reports ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// SequenceConflictError says which aggregate conflicted, what the caller
// expected and what the store holds.
type SequenceConflictError struct {
	TenantID, AggregateType, AggregateID string
	// Expected is the sequence the caller asked for; Next is the one the
	// store would have allocated.
	Expected, Next int64
}

func (e *SequenceConflictError) Error() string {
	return fmt.Sprintf("ferry: aggregate sequence conflict for %s/%s/%s: expected seq %d, next is %d",
		e.TenantID, e.AggregateType, e.AggregateID, e.Expected, e.Next)
}

// Is reports ErrSequenceConflict.
func (e *SequenceConflictError) Is(target error) bool { return target == ErrSequenceConflict }
