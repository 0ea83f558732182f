package prove

import (
	"fmt"
	"sync"
	"time"
)

// Clock skew (scenario relay-clock-skew): three package-relay instances
// share the shards, each reading its own clock through relay.WithClock —
// one a lease TTL behind, one a lease TTL ahead, one that steps back by a
// TTL and later forward by two (an NTP step each way).
const (
	skewJumpBack    = 200 * time.Millisecond // after the relay's first clock read
	skewJumpForward = 500 * time.Millisecond
)

// skewClock returns relay i's clock, and counts a fault on the first read
// after each step of the stepping clock.
func skewClock(e *env, i int) func() time.Time {
	switch i % 3 {
	case 0:
		return func() time.Time { return time.Now().Add(-relayTTL) }
	case 1:
		return func() time.Time { return time.Now().Add(relayTTL) }
	}
	// The steps follow the relay's reads, not the wall clock alone: the
	// back step at the first read 200 ms after the first, the forward step
	// at the first read 300 ms after the back step was read. With steps
	// at fixed times a relay whose reads were more than 300 ms apart (a
	// loaded CI machine under -race) skipped the back step: seen as "1
	// clock steps read, want 2".
	var mu sync.Mutex
	var start, backAt time.Time
	steps := 0
	return func() time.Time {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if start.IsZero() {
			start = now
		}
		switch {
		case steps == 0 && now.Sub(start) >= skewJumpBack:
			steps, backAt = 1, now
			e.faults.Add(1)
		case steps == 1 && now.Sub(backAt) >= skewJumpForward-skewJumpBack:
			steps = 2
			e.faults.Add(1)
		}
		switch steps {
		case 1:
			return now.Add(-relayTTL)
		case 2:
			return now.Add(relayTTL)
		}
		return now
	}
}

// checkSkew: both steps of the stepping clock were read, and every row
// published twice had the late publisher's mark refused by the fence. A
// relay whose lease lapsed before it could renew (a clock step, or a slow
// tick under load: seen under -race in CI) may publish a row the new owner
// publishes too — at least once allows that copy, which the broker's dedup
// or the inbox absorbs — but it must never mark it: a duplicate publish
// without a fenced mark means two relays both held the shard.
func checkSkew(e *env, f *Figures, _ *truth) []string {
	var v []string
	if f.FaultsInjected != 2 {
		v = append(v, fmt.Sprintf("%d clock steps read, want 2: the stepping relay stopped reading its clock", f.FaultsInjected))
	}
	if f.DuplicatePublishes > f.FencedWrites {
		v = append(v, fmt.Sprintf("%d duplicate publishes under clock skew but only %d marks fenced: a relay published rows it did not own and was not fenced", f.DuplicatePublishes, f.FencedWrites))
	}
	return v
}
