package inbox

import (
	"errors"
	"fmt"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrPermanent marks a handler error that retrying cannot fix (bad
	// data, a violated business rule). The message is parked as poison at
	// once instead of being redelivered. Wrap with [Permanent].
	ErrPermanent = errors.New("inbox: permanent failure")
	// ErrNotFound: no parked message with that id for this consumer.
	ErrNotFound = errors.New("inbox: parked message not found")
	// ErrNotParked: the parked message was already resolved (applied,
	// released or superseded); there is nothing to replay.
	ErrNotParked = errors.New("inbox: message is no longer parked")
	// ErrNotGap: ReleaseGap was given a parked message whose reason is not gap.
	ErrNotGap = errors.New("inbox: parked message is not a gap")
	// ErrFault is wrapped by the error Run returns when a [Faults] hook
	// simulated a crash.
	ErrFault = errors.New("inbox: injected fault")
)

// Permanent wraps err so the inbox parks the message as poison instead of
// retrying it. errors.Is(Permanent(err), ErrPermanent) is true and the
// original error stays reachable through errors.Unwrap / errors.As.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }
func (e *permanentError) Is(target error) bool {
	return target == ErrPermanent
}

// FaultError is returned by Run when a fault hook fired: the runtime
// stopped at Point without acking, as if the process had crashed there.
type FaultError struct {
	Point string // "before_commit" or "after_commit_before_ack"
	Err   error
}

func (e *FaultError) Error() string { return fmt.Sprintf("inbox: fault at %s: %v", e.Point, e.Err) }
func (e *FaultError) Unwrap() error { return e.Err }

// Is reports ErrFault.
func (e *FaultError) Is(target error) bool { return target == ErrFault }
