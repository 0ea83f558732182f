package effect_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/ferryhq/ferry/effect"
)

// slowTarget is an outside system whose every call takes hold: it counts
// the calls each worker made per key. Only what these tests need: the
// provider fake (provider_test.go) models faults, this one models time.
type slowTarget struct {
	hold    time.Duration
	started chan struct{} // closed at the first call

	mu    sync.Mutex
	once  sync.Once
	calls map[string]map[string]int // worker → key → calls
}

func newSlowTarget(hold time.Duration) *slowTarget {
	return &slowTarget{hold: hold, started: make(chan struct{}), calls: map[string]map[string]int{}}
}

func (s *slowTarget) executor(worker string) effect.Executor {
	return effect.ExecutorFunc(func(ctx context.Context, in effect.Intent) (effect.Result, error) {
		s.mu.Lock()
		if s.calls[worker] == nil {
			s.calls[worker] = map[string]int{}
		}
		s.calls[worker][in.Key]++
		s.mu.Unlock()
		s.once.Do(func() { close(s.started) })
		select {
		case <-time.After(s.hold):
			return effect.Result{OperationID: "op-" + in.Key}, nil
		case <-ctx.Done():
			return effect.Result{}, ctx.Err()
		}
	})
}

// noStatus fails the test if a worker reconciles: in these tests no call
// ever has an unknown outcome.
func noStatus(t *testing.T) effect.Reconciler {
	return effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) {
		t.Errorf("status query: no intent should have become unknown")
		return effect.Status{}, errors.New("unexpected status query")
	})
}

// byWorker returns how many calls worker made, and every key's calls over
// all workers.
func (s *slowTarget) byWorker(worker string) (n int, perKey map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	perKey = map[string]int{}
	for w, keys := range s.calls {
		for k, c := range keys {
			perKey[k] += c
			if w == worker {
				n += c
			}
		}
	}
	return n, perKey
}

func slowOpts(id string, concurrency, batch int, lease, call time.Duration, reg prometheus.Registerer) []effect.WorkerOption {
	return []effect.WorkerOption{
		effect.WithWorkerID(id), effect.WithTargetConcurrency(concurrency), effect.WithBatchSize(batch),
		effect.WithLease(lease), effect.WithCallTimeout(call), effect.WithPollInterval(20 * time.Millisecond),
		effect.WithBackoff(5*time.Millisecond, 50*time.Millisecond), effect.WithTargetRate(rate.Inf, 1),
		effect.WithBreaker(1<<30, time.Second), effect.WithLogger(quiet), effect.WithRegisterer(reg),
	}
}

// TestClaimLeavesIntentsToIdleWorkers: a worker claims no more intents of
// a target than it has call slots for it. Worker A (one call slot, batch
// 8) starts on 6 intents whose calls take 400 ms each; once its first call
// is under way, worker B (4 slots) starts. B must make most of the calls.
// Before claims were sized to the target's slots, A's first claim took all
// 6 and called them one after the other, well inside their 6 s lease,
// while B found nothing to claim: B made 0 or 1 of the calls.
func TestClaimLeavesIntentsToIdleWorkers(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { claimShare(t, pgHarness(t)) })
	t.Run("mysql", func(t *testing.T) { claimShare(t, mysqlHarness(t)) })
	t.Run("sqlite", func(t *testing.T) { claimShare(t, sqliteHarness(t)) })
}

func claimShare[TTx any](t *testing.T, h *harness[TTx]) {
	orders := h.placeOrders(t, 6)
	target := newSlowTarget(400 * time.Millisecond)
	a, err := effect.NewWorker(h.ledger, target.executor("A"), noStatus(t),
		slowOpts("A", 1, 8, 6*time.Second, 2*time.Second, prometheus.NewRegistry())...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := effect.NewWorker(h.ledger, target.executor("B"), noStatus(t),
		slowOpts("B", 4, 8, 6*time.Second, 2*time.Second, prometheus.NewRegistry())...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	run := func(w *effect.Worker) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil {
				t.Errorf("worker: %v", err)
			}
		}()
	}
	run(a)
	select {
	case <-target.started:
	case <-time.After(20 * time.Second):
		t.Fatal("worker A made no call in 20 s")
	}
	run(b)
	st := waitSettled(t, h, 30*time.Second)
	if st.ByState[effect.StateSucceeded] != int64(len(orders)) {
		t.Fatalf("ledger %v, want all %d succeeded", st.ByState, len(orders))
	}
	nA, perKey := target.byWorker("A")
	nB, _ := target.byWorker("B")
	for _, o := range orders {
		if perKey[o.Key] != 1 {
			t.Errorf("intent %s called %d times, want 1", o.Key, perKey[o.Key])
		}
	}
	t.Logf("calls: worker A (1 slot) %d, worker B (4 slots) %d", nA, nB)
	if nB < 3 {
		t.Fatalf("worker B made %d of the %d calls, want at least 3: worker A held intents it had no call slot for", nB, len(orders))
	}
}

// TestSlotWaitReleasesTheIntent: an intent claimed for a target whose call
// slots stay busy is released, due at once, when the claim's lease would no
// longer cover a call — never left to find its lease expired. Work claims
// a whole batch (8 intents) for one slot, with calls of 400 ms, lease 2 s
// and call timeout 1 s: the intents still waiting 0.5 s after the claim
// are released (ferry_effect_released_total{reason="no_call_slot"}), and
// every claimed intent is either called or released. Without the bound the
// sixth start comes at the lease's end and the seventh and eighth after
// it: their start finds the lease gone and they are neither called nor
// released ("lost the intent before the call"), left until a later claim.
func TestSlotWaitReleasesTheIntent(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { slotWait(t, pgHarness(t)) })
	t.Run("mysql", func(t *testing.T) { slotWait(t, mysqlHarness(t)) })
	t.Run("sqlite", func(t *testing.T) { slotWait(t, sqliteHarness(t)) })
}

func slotWait[TTx any](t *testing.T, h *harness[TTx]) {
	orders := h.placeOrders(t, 8)
	target := newSlowTarget(400 * time.Millisecond)
	reg := prometheus.NewRegistry()
	w, err := effect.NewWorker(h.ledger, target.executor("A"), noStatus(t),
		slowOpts("A", 1, 8, 2*time.Second, time.Second, reg)...)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := w.Work(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	called, _ := target.byWorker("A")
	released := sumMetric(t, reg, "ferry_effect_released_total", "reason", "no_call_slot")
	t.Logf("one Work: claimed %d, called %d, released for want of a call slot %v", claimed, called, released)
	if claimed != len(orders) {
		t.Fatalf("Work claimed %d intents, want %d", claimed, len(orders))
	}
	if lost := claimed - called - int(released); lost != 0 || released < 2 {
		t.Fatalf("claimed %d = called %d + released %v + %d neither: want every intent called or released, at least 2 released", claimed, called, released, lost)
	}
	// The released intents are due at once, and called once each.
	w2, err := effect.NewWorker(h.ledger, target.executor("B"), noStatus(t),
		slowOpts("B", 8, 8, 2*time.Second, time.Second, prometheus.NewRegistry())...)
	if err != nil {
		t.Fatal(err)
	}
	st := runUntilSettled(t, h, w2, 20*time.Second)
	if st.ByState[effect.StateSucceeded] != int64(len(orders)) {
		t.Fatalf("ledger %v, want all %d succeeded", st.ByState, len(orders))
	}
	_, perKey := target.byWorker("")
	for _, o := range orders {
		if perKey[o.Key] != 1 {
			t.Errorf("intent %s called %d times, want 1", o.Key, perKey[o.Key])
		}
	}
}

// waitSettled polls the ledger until no intent is pending, in flight or
// unknown.
func waitSettled[TTx any](t *testing.T, h *harness[TTx], limit time.Duration) effect.Stats {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		st, err := h.ledger.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.ByState[effect.StatePending]+st.ByState[effect.StateInFlight]+st.ByState[effect.StateUnknown] == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled after %s: %v", limit, st.ByState)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
