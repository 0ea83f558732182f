package effect

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry/internal/sanitize"
)

// State is where an intent is in its life.
type State string

// The states of the ledger. pending → in_flight → succeeded | failed |
// unknown; unknown → (reconciliation) succeeded | pending | unknown.
const (
	// StatePending: not attempted yet, or known not to have happened
	// (never sent, or a status query answered "not found"): safe to execute.
	StatePending State = "pending"
	// StateInFlight: an attempt was committed as started before the call. A
	// row found in_flight with an expired lease (its worker died) is treated
	// as unknown.
	StateInFlight State = "in_flight"
	// StateSucceeded: the outside system applied the effect (terminal).
	StateSucceeded State = "succeeded"
	// StateFailed: the outside system definitely refused it, or attempts ran
	// out while it is known not to have happened (terminal).
	StateFailed State = "failed"
	// StateUnknown: the call may or may not have been applied. Only a status
	// query (Reconciler) moves it on; never a blind retry.
	StateUnknown State = "unknown"
)

// States lists every state, in life order.
var States = []State{StatePending, StateInFlight, StateSucceeded, StateFailed, StateUnknown}

// Limits on intent fields.
const (
	MaxNameBytes    = 200      // Consumer, Step, Target, Operation, TenantID
	MaxRequestBytes = 64 << 10 // Request
	MaxSummaryBytes = 512      // Result.Summary and Status.Summary (truncated)
	MaxOpIDBytes    = 255      // Result.OperationID (truncated)
)

// Intent is one call to an outside system, recorded by a consumer handler in
// its own transaction and executed later by a Worker.
type Intent struct {
	// Consumer, EventID and Step identify the intent: the idempotency key is
	// derived from them (see Key). Step names the call within the handler
	// ("charge", "email-receipt"), so a handler may record several effects
	// per event.
	Consumer string
	EventID  uuid.UUID
	Step     string
	// TenantID is carried for evidence and for the executor.
	TenantID string
	// Target names the outside system ("payments", "smtp"): concurrency,
	// rate limit and circuit breaker are per target.
	Target string
	// Operation names what is done ("charge"), for the executor and logs.
	Operation string
	// Request is the executor's input (e.g. a JSON body), at most
	// MaxRequestBytes. It is never logged.
	Request []byte

	// Key is the idempotency key, assigned by the ledger (Key(Consumer,
	// EventID, Step)). Executors send it to the outside system.
	Key string
	// Attempt is the 1-based number of this execution (set by the worker).
	Attempt int
}

// Key derives the idempotency key of the effect (consumer, eventID, step):
//
//	"fx1_" + lowercase hex( SHA-256( "ferry.effect.v1" 0x00 consumer 0x00 eventID 0x00 step ) )
//
// where eventID is the canonical 36-character UUID form. It is
// deterministic (a redelivered event yields the same key, so the outside
// system can deduplicate), 68 ASCII bytes (within the limits of common
// Idempotency-Key headers), and reveals nothing about its inputs. Consumer
// and step may not contain NUL, so the encoding is unambiguous.
func Key(consumer string, eventID uuid.UUID, step string) string {
	h := sha256.New()
	h.Write([]byte("ferry.effect.v1\x00"))
	h.Write([]byte(consumer))
	h.Write([]byte{0})
	h.Write([]byte(eventID.String()))
	h.Write([]byte{0})
	h.Write([]byte(step))
	return "fx1_" + hex.EncodeToString(h.Sum(nil))
}

func (in *Intent) check() error {
	for _, f := range []struct {
		name, v  string
		required bool
	}{
		{"consumer", in.Consumer, true},
		{"step", in.Step, true},
		{"target", in.Target, true},
		{"operation", in.Operation, true},
		{"tenant_id", in.TenantID, false},
	} {
		if f.required && f.v == "" {
			return &IntentError{Field: f.name, Reason: "is required"}
		}
		if len(f.v) > MaxNameBytes {
			return &IntentError{Field: f.name, Reason: fmt.Sprintf("must be at most %d bytes, got %d", MaxNameBytes, len(f.v))}
		}
		if strings.ContainsRune(f.v, 0) {
			return &IntentError{Field: f.name, Reason: "must not contain NUL"}
		}
	}
	if in.EventID == uuid.Nil {
		return &IntentError{Field: "event_id", Reason: "is required"}
	}
	if len(in.Request) > MaxRequestBytes {
		return &IntentError{Field: "request", Reason: fmt.Sprintf("must be at most %d bytes, got %d", MaxRequestBytes, len(in.Request))}
	}
	return nil
}

// Result is what an Executor reports for an applied effect.
type Result struct {
	// OperationID is the outside system's id for the effect (a charge id,
	// a message id): the evidence that it happened.
	OperationID string
	// Summary is a short, secret-free description (e.g. "http 201"). Never
	// put response bodies with personal data here.
	Summary string
}

// Executor performs one intent against the outside system, sending
// Intent.Key as its idempotency key. Its error classifies the outcome:
//
//   - nil: applied (succeeded);
//   - an error matching ErrRejected (wrap with Rejected): definitely refused,
//     nothing applied (failed, terminal);
//   - an error matching ErrNotSent (wrap with NotSent): definitely never
//     reached the outside system (safe to retry after backoff);
//   - any other error: the outcome is unknown (timeout, reset after send,
//     5xx) and the worker reconciles before any new attempt.
//
// The default for an unclassified error is unknown on purpose: the worker
// never retries blind.
type Executor interface {
	Execute(ctx context.Context, in Intent) (Result, error)
}

// Lookup is a status query's answer.
type Lookup uint8

const (
	// LookupUnknown: the outside system could not say (error, 5xx); the
	// worker backs off and asks again later.
	LookupUnknown Lookup = iota
	// LookupFound: the effect was applied; the intent becomes succeeded.
	LookupFound
	// LookupNotFound: the outside system has no effect under this key; the
	// worker may execute again, with the same key.
	LookupNotFound
)

func (l Lookup) String() string {
	switch l {
	case LookupFound:
		return "found"
	case LookupNotFound:
		return "not_found"
	default:
		return "unknown"
	}
}

// Status is a Reconciler's answer.
type Status struct {
	Lookup      Lookup
	OperationID string // when found
	Summary     string
}

// Reconciler asks the outside system whether the effect with Intent.Key was
// applied (e.g. GET /payments?idempotency_key=…). An error counts as
// LookupUnknown.
type Reconciler interface {
	Status(ctx context.Context, in Intent) (Status, error)
}

// ExecutorFunc adapts a function to Executor.
type ExecutorFunc func(ctx context.Context, in Intent) (Result, error)

// Execute calls f.
func (f ExecutorFunc) Execute(ctx context.Context, in Intent) (Result, error) { return f(ctx, in) }

// ReconcilerFunc adapts a function to Reconciler.
type ReconcilerFunc func(ctx context.Context, in Intent) (Status, error)

// Status calls f.
func (f ReconcilerFunc) Status(ctx context.Context, in Intent) (Status, error) { return f(ctx, in) }

// Sentinel errors.
var (
	// ErrNotSent classifies an executor error: the call never reached the
	// outside system (dial failed, connection refused before sending).
	ErrNotSent = errors.New("effect: not sent")
	// ErrRejected classifies an executor error: the outside system
	// definitely refused the call (4xx-class); nothing was applied.
	ErrRejected = errors.New("effect: rejected")
	// ErrInvalidIntent: an Intent field broke a limit; see *IntentError.
	ErrInvalidIntent = errors.New("effect: invalid intent")
	// ErrIntentConflict: an intent with the same key was recorded earlier
	// with a different request; see *IntentConflictError.
	ErrIntentConflict = errors.New("effect: intent recorded with a different request")
)

type classified struct {
	class error
	err   error
}

func (c *classified) Error() string   { return c.class.Error() + ": " + c.err.Error() }
func (c *classified) Unwrap() []error { return []error{c.class, c.err} }

// NotSent marks err as "definitely not sent": safe to retry.
func NotSent(err error) error {
	if err == nil {
		err = errors.New("not sent")
	}
	return &classified{class: ErrNotSent, err: err}
}

// Rejected marks err as a definite refusal: the intent fails.
func Rejected(err error) error {
	if err == nil {
		err = errors.New("rejected")
	}
	return &classified{class: ErrRejected, err: err}
}

// IntentError names the intent field that was rejected and why.
type IntentError struct {
	Field  string
	Reason string
}

func (e *IntentError) Error() string {
	return fmt.Sprintf("effect: invalid intent.%s: %s", e.Field, e.Reason)
}

// Is reports ErrInvalidIntent.
func (e *IntentError) Is(target error) bool { return target == ErrInvalidIntent }

// IntentConflictError names the key that was recorded with another request.
type IntentConflictError struct {
	Key      string
	Consumer string
	EventID  uuid.UUID
	Step     string
}

func (e *IntentConflictError) Error() string {
	return fmt.Sprintf("effect: intent %s (consumer %q, event %s, step %q) was recorded earlier with a different request",
		e.Key, e.Consumer, e.EventID, e.Step)
}

// Is reports ErrIntentConflict.
func (e *IntentConflictError) Is(target error) bool { return target == ErrIntentConflict }

// truncate bounds stored text by the one rule (internal/sanitize).
func truncate(s string, n int) string { return sanitize.Text(s, n) }
