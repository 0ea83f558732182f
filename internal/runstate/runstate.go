// Package runstate is the start/stop bookkeeping shared by broker consumers
// whose Consume runs at most once at a time and whose Close ends it: the
// running and closed flags, the cancel function and done channel that let
// Close wait for Consume, and the delayed-nack timers, so that no timer
// outlives the Consume call that scheduled it.
package runstate

import (
	"context"
	"sync"
	"time"
)

// State is safe for concurrent use. The zero value is ready.
//
// Its lock is its own and is never held while calling back into the
// consumer, so a consumer may call AfterFunc while holding its own lock.
type State struct {
	mu        sync.Mutex
	closed    bool
	consuming bool
	stop      context.CancelFunc
	done      chan struct{}
	timers    map[*time.Timer]struct{}
}

// Begin marks Consume running. It returns errClosed after Close and
// errConsuming while another Consume runs. Otherwise it returns the context
// Consume must use (cancelled by Close) and end, which Consume must call
// (deferred) when it returns: end cancels the context, stops pending timers
// and releases a waiting Close.
func (s *State) Begin(ctx context.Context, errClosed, errConsuming error) (_ context.Context, end func(), _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, nil, errClosed
	case s.consuming:
		return nil, nil, errConsuming
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	s.consuming, s.stop, s.done = true, stop, done
	return ctx, func() {
		stop()
		s.mu.Lock()
		for t := range s.timers {
			t.Stop()
		}
		clear(s.timers)
		s.consuming = false
		s.mu.Unlock()
		close(done)
	}, nil
}

// AfterFunc runs f after d unless the running Consume returns first. It
// reports false, scheduling nothing, when no Consume is running.
func (s *State) AfterFunc(d time.Duration, f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.consuming {
		return false
	}
	if s.timers == nil {
		s.timers = make(map[*time.Timer]struct{})
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		s.mu.Lock()
		_, pending := s.timers[t]
		delete(s.timers, t)
		s.mu.Unlock()
		if pending { // not stopped by end in the meantime
			f()
		}
	})
	s.timers[t] = struct{}{}
	return true
}

// Close marks the state closed, cancels a running Consume and waits until
// it has returned. It reports whether this call closed it (false on the
// second and later calls, which return at once).
func (s *State) Close() bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.closed = true
	stop, done, consuming := s.stop, s.done, s.consuming
	s.mu.Unlock()
	if consuming {
		stop()
		<-done
	}
	return true
}

// Pending returns the number of scheduled timers (for tests).
func (s *State) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.timers)
}
