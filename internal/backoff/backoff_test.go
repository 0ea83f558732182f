package backoff

import (
	"context"
	"math"
	"testing"
	"time"
)

func TestCeil(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		base, limit time.Duration
		attempt     int
		want        time.Duration
	}{
		{100 * ms, 2 * time.Second, 1, 100 * ms},
		{100 * ms, 2 * time.Second, 0, 100 * ms},  // below 1 counts as 1
		{100 * ms, 2 * time.Second, -5, 100 * ms}, // likewise
		{100 * ms, 2 * time.Second, 2, 200 * ms},
		{100 * ms, 2 * time.Second, 5, 1600 * ms},
		{100 * ms, 2 * time.Second, 6, 2 * time.Second},
		{100 * ms, 2 * time.Second, math.MaxInt, 2 * time.Second},
		{time.Second, 500 * ms, 3, 500 * ms}, // limit below base
		{0, time.Second, 3, 0},
		{time.Second, 0, 3, 0},
		// Near the top of the range doubling would overflow int64.
		{time.Duration(math.MaxInt64/2 + 1), time.Duration(math.MaxInt64), 2, time.Duration(math.MaxInt64)},
		{1, time.Duration(math.MaxInt64), 64, time.Duration(math.MaxInt64)},
		{1, time.Duration(math.MaxInt64), math.MaxInt, time.Duration(math.MaxInt64)},
		{1, time.Duration(math.MaxInt64), 63, 1 << 62},
	} {
		if got := Ceil(c.base, c.limit, c.attempt); got != c.want {
			t.Errorf("Ceil(%d, %d, %d) = %d, want %d", c.base, c.limit, c.attempt, got, c.want)
		}
	}
}

// TestFullJitter draws many delays per attempt: every one lies in
// [0, ceil], and they cover the whole range (quartiles near where a
// uniform distribution puts them), not a band near the ceiling.
func TestFullJitter(t *testing.T) {
	base, limit := 100*time.Millisecond, 2*time.Second
	for _, attempt := range []int{1, 2, 4, 6, 1000, math.MaxInt} {
		ceil := Ceil(base, limit, attempt)
		const n = 20000
		var quart [4]int
		var sum float64
		for range n {
			d := Full(base, limit, attempt)
			if d < 0 || d > ceil {
				t.Fatalf("attempt %d: delay %s outside [0, %s]", attempt, d, ceil)
			}
			quart[min(int(4*d/(ceil+1)), 3)]++
			sum += float64(d)
		}
		// Each quarter holds n/4 ± a wide margin (σ ≈ 61 at n = 20000).
		for q, c := range quart {
			if c < n/4-1000 || c > n/4+1000 {
				t.Fatalf("attempt %d: quarter %d of [0, %s] holds %d of %d draws: not uniform", attempt, q, ceil, c, n)
			}
		}
		if mean := sum / n; mean < 0.45*float64(ceil) || mean > 0.55*float64(ceil) {
			t.Fatalf("attempt %d: mean %s, want about %s", attempt, time.Duration(mean), ceil/2)
		}
	}
}

func TestUniformBounds(t *testing.T) {
	for _, c := range []struct{ lo, hi time.Duration }{
		{0, 0}, {5, 5}, {10, 3}, {-7, 2}, {0, time.Duration(math.MaxInt64)}, {time.Duration(math.MaxInt64) - 1, time.Duration(math.MaxInt64)},
	} {
		lo := max(c.lo, 0)
		for range 1000 {
			d := Uniform(c.lo, c.hi)
			if c.hi <= lo {
				if d != lo {
					t.Fatalf("Uniform(%d, %d) = %d, want %d", c.lo, c.hi, d, lo)
				}
				continue
			}
			if d < lo || d > c.hi {
				t.Fatalf("Uniform(%d, %d) = %d, outside the range", c.lo, c.hi, d)
			}
		}
	}
	// Both ends of a small range are reached.
	seen := map[time.Duration]bool{}
	for range 1000 {
		seen[Uniform(3, 5)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("Uniform(3, 5) gave %v, want each of 3, 4, 5", seen)
	}
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep with a live context reported cancellation")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep with a cancelled context reported that the hour elapsed")
	}
}
