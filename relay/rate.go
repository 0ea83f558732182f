package relay

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// newPublishLimiter returns the relay's publish limiter (WithPublishRate),
// or nil when publishing is unlimited. One limiter per relay: every worker
// and shard draws from it, because they all publish to the one broker.
func newPublishLimiter(c *config) *rate.Limiter {
	if c.publishRate <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(c.publishRate), c.publishBurst)
}

// claimSize is how many rows one cycle claims: the batch size, or the
// publish burst when that is smaller, so a claimed batch never waits for
// more than one burst of tokens while its rows sit claimed.
func (c *config) claimSize() int {
	if c.publishRate > 0 && c.publishBurst < c.batch {
		return c.publishBurst
	}
	return c.batch
}

// awaitPublish takes one token per event of batch from the publish limiter
// before the batch goes out. It waits in steps of at most a third of the
// lease TTL and, after each step and once all tokens are in, keeps only the
// rows whose shard lease this relay still holds under the fence it was
// claimed with (and whose leases have not lapsed unrenewed): a batch whose
// lease went away while it waited is never published — the new owner
// claims and publishes those rows. It returns nil when ctx ends first (the
// rows stay pending and unmarked; nothing was published) or when no row is
// left. Without a limiter it returns batch unchanged, as before.
func (r *Relay) awaitPublish(ctx context.Context, batch []claimed) []claimed {
	if r.limiter == nil || len(batch) == 0 {
		return batch
	}
	if b := r.cfg.publishBurst; len(batch) > b {
		// A claim over several shards may round up past the burst. The
		// batch is in id order, so its first b rows hold a consecutive
		// run of each aggregate; the rest stay pending for the next cycle.
		batch = batch[:b]
	}
	res := r.limiter.ReserveN(time.Now(), len(batch))
	if !res.OK() { // cannot happen: len(batch) <= burst
		return nil
	}
	step := max(r.cfg.ttl/3, 10*time.Millisecond)
	for {
		d := res.Delay()
		if d <= 0 {
			break
		}
		if !sleep(ctx, min(d, step)) {
			res.Cancel() // give back the tokens of a batch that never went out
			return nil
		}
		if batch = r.stillLeased(batch); len(batch) == 0 {
			return nil
		}
	}
	return r.stillLeased(batch)
}

// stillLeased keeps the rows of batch whose shard this relay still owns
// with the fence the row was claimed under, while its leases are live by
// the local estimate (renewals succeeded within the TTL). Rows of one
// shard are kept or dropped together, so an aggregate (one shard) keeps a
// consecutive run.
func (r *Relay) stillLeased(batch []claimed) []claimed {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.now().After(r.validUntil) {
		return nil
	}
	out := batch[:0]
	for _, c := range batch {
		if f, ok := r.owned[c.ev.Shard]; ok && f == c.fence {
			out = append(out, c)
		}
	}
	return out
}
