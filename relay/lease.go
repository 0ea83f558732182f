package relay

import (
	"context"
	"fmt"
	"sort"

	"github.com/ferryhq/ferry/internal/logattr"
)

// leaseLoop renews, rebalances and refreshes the gauges every TTL/3 until
// ctx is done. Failures are logged and retried at the next tick; if no
// renewal succeeds for a whole TTL the worker stops using the shards
// (ownedSnapshot), and the fence rejects anything it might still write.
func (r *Relay) leaseLoop(ctx context.Context) {
	every := r.cfg.ttl / 3
	for sleep(ctx, every) {
		if r.cfg.beforeLeaseTick != nil {
			r.cfg.beforeLeaseTick()
		}
		if ctx.Err() != nil {
			return
		}
		// A tick runs to its end even when Run is stopping: a statement
		// cancelled mid-flight can still run on the server after Run's
		// final release (go-sql-driver/mysql cancels by closing the
		// connection; the server finishes what it received), so a stopped
		// relay's heartbeat re-created its instance row and ops showed it
		// live, owning nothing, for a TTL. A renewal later than the TTL is
		// worthless anyway, which bounds the wait.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ttl)
		err := r.leaseTick(tctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "lease tick failed", logattr.Err(err))
		}
	}
}

// leaseTick is one round of: heartbeat, renew owned leases, release the
// ones over the fair share, acquire free ones up to it, refresh gauges.
func (r *Relay) leaseTick(ctx context.Context) error {
	exec := r.db.Executor()
	ttl := r.cfg.ttl.Seconds()
	started := r.cfg.now() // WithClock
	r.mu.Lock()
	breaker := r.breaker.String()
	r.mu.Unlock()
	// The breaker state rides on the heartbeat so `ferry status` (another
	// process) can show it; it is at most one lease tick old.
	if _, err := exec.Exec(ctx, r.q.heartbeat, r.cfg.instance, r.cfg.shards, ttl, breaker); err != nil {
		return fmt.Errorf("relay: heartbeat: %w", err)
	}
	if _, err := exec.Exec(ctx, r.q.pruneInstance); err != nil {
		return fmt.Errorf("relay: prune instances: %w", err)
	}
	live, mismatched, err := r.liveInstances(ctx)
	if err != nil {
		return err
	}
	if mismatched > 0 {
		// Another relay runs with a different N: two deployments disagree,
		// and sharing leases would break per-aggregate ownership. Own nothing.
		r.log.ErrorContext(ctx, "a live relay uses another shard count; owning no shards until it stops", "shard_count", r.cfg.shards)
		r.releaseExtras(ctx, -1)
		return nil
	}
	owned, err := r.leaseRows(ctx, r.q.renew, r.cfg.instance, ttl, r.cfg.shards)
	if err != nil {
		return fmt.Errorf("relay: renew leases: %w", err)
	}
	r.mu.Lock()
	before := len(r.owned)
	forgot := 0
	for s := range r.owned {
		if _, ok := owned[s]; !ok {
			r.log.WarnContext(ctx, "lease lost", "shard", s)
			forgot += r.forgetWMLocked(s)
		}
	}
	for s := range owned {
		if r.releasing[s] {
			delete(owned, s) // renewed only until its batch is done
		}
	}
	r.owned = owned
	r.validUntil = started.Add(r.cfg.ttl)
	r.live = live
	r.mu.Unlock()
	r.forgotWM(forgot)

	fair := (r.cfg.shards + live - 1) / max(live, 1)
	r.releaseIdle(ctx)
	switch {
	case len(owned) > fair:
		r.releaseExtras(ctx, fair)
	case len(owned) < fair:
		got, err := r.leaseRows(ctx, r.q.acquire, r.cfg.instance, ttl, fair-len(owned), r.cfg.shards)
		if err != nil {
			return fmt.Errorf("relay: acquire leases: %w", err)
		}
		r.mu.Lock()
		for s, f := range got {
			r.owned[s] = f
			r.log.InfoContext(ctx, "lease acquired", "shard", s, "fence", f)
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	n := len(r.owned)
	r.mu.Unlock()
	if n > before {
		r.Notify()
	}
	r.refreshMissing() // expires destinations nothing failed on lately
	return nil
}

// releaseExtras gives up the highest-numbered owned shards above keep
// (keep < 0: all of them). They stop being claimed from at once; their
// lease rows are released by releaseIdle as soon as no batch of theirs is
// in flight, so a rebalance never strands a batch (its mark would be
// fenced and the rows published twice).
func (r *Relay) releaseExtras(ctx context.Context, keep int) {
	r.mu.Lock()
	shards := make([]int, 0, len(r.owned))
	for s := range r.owned {
		shards = append(shards, s)
	}
	sort.Ints(shards)
	keep = max(keep, 0)
	if len(shards) > keep {
		for _, s := range shards[keep:] {
			delete(r.owned, s)
			r.releasing[s] = true
		}
	}
	r.mu.Unlock()
	r.releaseIdle(ctx)
}

// releaseIdle releases the lease rows of shards being given up that have
// nothing in flight.
func (r *Relay) releaseIdle(ctx context.Context) {
	r.mu.Lock()
	var idle []int
	for s := range r.releasing {
		if r.inflight[s] == 0 {
			idle = append(idle, s)
		}
	}
	r.mu.Unlock()
	for _, s := range idle {
		if r.q.watermark {
			// Acked rows waiting for the advance: pass them now if their
			// claims' transactions have ended; the rest the next owner
			// republishes.
			if err := r.advance(ctx, []int{s}, nil, nil); err != nil {
				r.log.WarnContext(ctx, "advance before release failed", "shard", s, logattr.Err(err))
			}
			r.mu.Lock()
			forgot := r.forgetWMLocked(s)
			r.mu.Unlock()
			r.forgotWM(forgot)
		}
		if _, err := r.db.Executor().Exec(ctx, r.q.release, r.cfg.instance, s); err != nil {
			r.log.WarnContext(ctx, "release lease failed; retrying at the next tick", "shard", s, logattr.Err(err))
			continue
		}
		r.mu.Lock()
		delete(r.releasing, s)
		r.mu.Unlock()
		r.log.InfoContext(ctx, "lease released for rebalancing", "shard", s)
	}
}

func (r *Relay) liveInstances(ctx context.Context) (live, mismatched int, err error) {
	rows, err := r.db.Executor().Query(ctx, r.q.liveInstances, r.cfg.shards)
	if err != nil {
		return 0, 0, fmt.Errorf("relay: count instances: %w", err)
	}
	defer rows.Close()
	var l, m int64
	if rows.Next() {
		if err := rows.Scan(&l, &m); err != nil {
			return 0, 0, fmt.Errorf("relay: count instances: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("relay: count instances: %w", err)
	}
	return max(int(l), 1), int(m), nil
}

// leaseRows runs a lease statement returning (shard, fence) rows.
func (r *Relay) leaseRows(ctx context.Context, sql string, args ...any) (map[int]int64, error) {
	if r.q.mysqlLeases != nil {
		return r.mysqlLeaseRows(ctx, sql, args...)
	}
	rows, err := r.db.Executor().Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int]int64{}
	for rows.Next() {
		var s, f int64
		if err := rows.Scan(&s, &f); err != nil {
			return nil, err
		}
		out[int(s)] = f
	}
	return out, rows.Err()
}
