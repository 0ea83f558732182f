// Package backoff is Ferry's one retry-delay rule: exponential growth from
// a base, capped, with jitter drawn from math/rand/v2's top-level source
// (safe for concurrent use, no state of its own). The relay, the CDC relay,
// the inbox and the effect worker all take their delays from here.
//
// Attempt numbers count from 1: attempt 1 waits up to base, attempt n up
// to base·2^(n-1), never more than the cap. Large attempt numbers do not
// overflow: the ceiling stops growing at the cap.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Ceil is the exponential ceiling of attempt: min(limit, base·2^(attempt-1)).
// An attempt below 1 counts as 1; a base or limit ≤ 0 gives 0; a limit
// below base gives limit.
func Ceil(base, limit time.Duration, attempt int) time.Duration {
	if base <= 0 || limit <= 0 {
		return 0
	}
	c := min(base, limit)
	for i := 1; i < attempt && c < limit; i++ {
		if c > limit/2 {
			return limit // doubling would pass the cap (or overflow)
		}
		c *= 2
	}
	return c
}

// Full is full jitter: uniform in [0, Ceil(base, limit, attempt)]. It
// spreads the retries of many clients over the whole window, so a
// recovered server is not hit by all of them at once.
func Full(base, limit time.Duration, attempt int) time.Duration {
	return Uniform(0, Ceil(base, limit, attempt))
}

// Uniform is a random duration in [lo, hi]; lo below 0 counts as 0, and
// hi ≤ lo gives lo.
func Uniform(lo, hi time.Duration) time.Duration {
	lo = max(lo, 0)
	if hi <= lo {
		return lo
	}
	span := uint64(hi - lo) // ≤ MaxInt64, so span+1 cannot wrap
	return lo + time.Duration(rand.Uint64N(span+1))
}

// Sleep waits d or until ctx is done; it reports whether d elapsed (false:
// ctx ended first).
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
