package effect_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

// slowLane is a provider that does NOT deduplicate by key and that may
// apply a charge late: a request the caller gave up on (its call timed
// out) is still in transit and is applied at some point before the call's
// deadline — never after it, the one promise a provider without
// deduplication has to make for "not found" to mean anything. Time is the
// ledger's injected clock, so the interleaving is exact.
type slowLane struct {
	mu        sync.Mutex
	inTransit []time.Time // when each late request is applied
	charges   int
	statuses  []bool // what each status query answered (found)
}

// arrive applies every in-transit request due by now.
func (p *slowLane) arrive(now time.Time) {
	kept := p.inTransit[:0]
	for _, at := range p.inTransit {
		if !at.After(now) {
			p.charges++
		} else {
			kept = append(kept, at)
		}
	}
	p.inTransit = kept
}

// TestStatusNotQueriedWhileAttemptMayArrive is the interleaving behind a
// duplicate charge seen once in `ferry prove`'s effect-worker-sigkill: a
// live worker's call times out (unknown) while its request is still on its
// way to the provider; the status query, asked right after, answers "not
// found"; the intent is executed again; then the first request lands. The
// worker must not ask before the attempt's lease (which covers the call
// with slack) has run out, so any request of that attempt has arrived or
// can never be applied.
func TestStatusNotQueriedWhileAttemptMayArrive(t *testing.T) {
	const (
		lease       = 30 * time.Second
		callTimeout = 10 * time.Second
	)
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	l, err := effect.NewLedger(drv, effect.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	key, err := l.Record(ctx, effect.Intent{Consumer: "billing", EventID: uuid.Must(uuid.NewV7()), Step: "charge", Target: "payments", Operation: "charge"})
	if err != nil {
		t.Fatal(err)
	}
	p := &slowLane{}
	exec := effect.ExecutorFunc(func(context.Context, effect.Intent) (effect.Result, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		t0 := clock()
		p.arrive(t0)
		if len(p.statuses) == 0 && p.charges == 0 && len(p.inTransit) == 0 {
			// First attempt: the request is on its way; the caller times out.
			p.inTransit = append(p.inTransit, t0.Add(callTimeout-time.Millisecond))
			return effect.Result{}, context.DeadlineExceeded
		}
		p.charges++
		return effect.Result{OperationID: "ch_2"}, nil
	})
	rec := effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.arrive(clock())
		found := p.charges > 0
		p.statuses = append(p.statuses, found)
		if found {
			return effect.Status{Lookup: effect.LookupFound, OperationID: "ch_1"}, nil
		}
		return effect.Status{Lookup: effect.LookupNotFound}, nil
	})
	w, err := effect.NewWorker(l, exec, rec, effect.WithLogger(quiet), effect.WithLease(lease), effect.WithCallTimeout(callTimeout),
		effect.WithBackoff(time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.Work(ctx); err != nil || n != 1 {
		t.Fatalf("first work: %d %v", n, err)
	}
	r, _, err := l.ByKey(ctx, key)
	if err != nil || r.State != effect.StateUnknown {
		t.Fatalf("after the timed-out call: %+v %v, want unknown", r, err)
	}
	// Well past the backoff, still inside the attempt's lease: the first
	// request may still arrive, so no status query yet.
	for _, step := range []time.Duration{time.Second, callTimeout / 2, lease - callTimeout/2 - time.Second - time.Millisecond} {
		advance(step)
		if _, err := w.Work(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The lease has run out: ask.
	advance(2 * time.Millisecond)
	if _, err := w.Work(ctx); err != nil {
		t.Fatal(err)
	}
	advance(time.Hour)
	p.mu.Lock()
	p.arrive(clock())
	charges, statuses := p.charges, append([]bool(nil), p.statuses...)
	p.mu.Unlock()
	r, _, err = l.ByKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if charges != 1 {
		t.Errorf("provider charged %d times, want 1 (status answers %v: a status query sent while the timed-out request was in transit answered not found and the intent was executed again)", charges, statuses)
	}
	if r.State != effect.StateSucceeded || r.Reconciliations != 1 || r.Attempts != 1 || len(statuses) != 1 || !statuses[0] {
		t.Errorf("ledger %s attempts %d reconciliations %d, status answers %v; want succeeded by one status query that found the charge, 1 attempt", r.State, r.Attempts, r.Reconciliations, statuses)
	}
}
