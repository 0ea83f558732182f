package effect

import (
	"sync"
	"time"
)

// BreakerState is a per-target circuit breaker's state.
type BreakerState int

// Breaker states; String gives the state label of ferry_effect_breaker_state.
const (
	BreakerClosed   BreakerState = 0 // calls flow
	BreakerOpen     BreakerState = 1 // calls are held back until the cooldown ends
	BreakerHalfOpen BreakerState = 2 // one probe per cooldown decides
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	default:
		return "closed"
	}
}

// breaker opens after threshold consecutive failures (not sent, unknown,
// status query unknown), holds calls for cooldown, then lets one probe
// through per cooldown: a success closes it, a failure reopens it. A
// rejection (4xx) counts as success: the outside system is up and answering.
type breaker struct {
	threshold int
	cooldown  time.Duration
	onChange  func(from, to BreakerState)

	mu        sync.Mutex
	state     BreakerState
	failures  int
	openUntil time.Time // open: when the next probe may go
}

// allow reports whether a call may go now, and if not, when to try again.
func (b *breaker) allow(now time.Time) (bool, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, time.Time{}
	default: // open or half-open: one probe per cooldown
		if now.Before(b.openUntil) {
			return false, b.openUntil
		}
		b.openUntil = now.Add(b.cooldown)
		b.set(BreakerHalfOpen)
		return true, time.Time{}
	}
}

// record reports a call's outcome.
func (b *breaker) record(now time.Time, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case ok && b.state == BreakerHalfOpen:
		b.failures = 0
		b.set(BreakerClosed)
	case ok && b.state == BreakerClosed:
		b.failures = 0
	case !ok && b.state == BreakerHalfOpen:
		b.openUntil = now.Add(b.cooldown)
		b.set(BreakerOpen)
	case !ok && b.state == BreakerClosed:
		b.failures++
		if b.failures >= b.threshold {
			b.openUntil = now.Add(b.cooldown)
			b.set(BreakerOpen)
		}
	}
	// Results arriving while open (calls started before it opened) change nothing.
}

func (b *breaker) current() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

func (b *breaker) set(to BreakerState) {
	if b.state == to {
		return
	}
	from := b.state
	b.state = to
	if b.onChange != nil {
		b.onChange(from, to)
	}
}
