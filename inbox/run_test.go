package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// scriptedBroker is an in-process broker.Consumer that delivers a fixed
// script of events (with whatever duplication and reordering the test
// injected) and redelivers what is nacked, like a broker's redelivery.
// It stands in for the wire, not for the database: every inbox write
// goes to the real store.
type scriptedBroker struct {
	queue     chan *broker.Delivery
	acks      atomic.Int64
	nacks     atomic.Int64
	delivered atomic.Int64
	mu        sync.Mutex
	stopped   bool
	timers    []*time.Timer
}

func newScriptedBroker(script []ferry.Event) *scriptedBroker {
	b := &scriptedBroker{queue: make(chan *broker.Delivery, len(script)+1024)}
	for _, ev := range script {
		b.queue <- b.delivery(ev, 1)
	}
	return b
}

func (b *scriptedBroker) delivery(ev ferry.Event, attempt int) *broker.Delivery {
	d := &broker.Delivery{Event: ev, Attempt: attempt}
	d.Ack = func(context.Context) error { b.acks.Add(1); return nil }
	d.Nack = func(_ context.Context, delay time.Duration) error {
		b.nacks.Add(1)
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.stopped {
			return nil
		}
		b.timers = append(b.timers, time.AfterFunc(delay, func() { b.queue <- b.delivery(ev, attempt+1) }))
		return nil
	}
	return d
}

func (b *scriptedBroker) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case d := <-b.queue:
			b.delivered.Add(1)
			handle(ctx, d)
		}
	}
}

func (b *scriptedBroker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	for _, t := range b.timers {
		t.Stop()
	}
	return nil
}

var _ broker.Consumer = (*scriptedBroker)(nil)

// chaosScript returns aggregates × perAgg events, interleaved at random,
// with each event duplicated with probability dup (the copy lands up to 50
// positions later) and each window of 128 deliveries shuffled with
// probability swap.
func chaosScript(t testing.TB, rng *rand.Rand, aggregates, perAgg int, dup, swap float64) ([]ferry.Event, int) {
	t.Helper()
	next := make([]int64, aggregates)
	var script []ferry.Event
	for len(script) < aggregates*perAgg {
		a := rng.IntN(aggregates)
		if next[a] >= int64(perAgg) {
			continue
		}
		next[a]++
		tenant := "acme"
		if a%2 == 1 {
			tenant = "globex"
		}
		script = append(script, event(t, tenant, fmt.Sprintf("agg-%03d", a), next[a], fmt.Sprintf("%d-%d", a, next[a])))
	}
	dups := 0
	out := make([]ferry.Event, 0, len(script)*2)
	pendingDup := map[int][]ferry.Event{}
	for i, ev := range script {
		out = append(out, ev)
		out = append(out, pendingDup[i]...)
		delete(pendingDup, i)
		if rng.Float64() < dup {
			pendingDup[i+rng.IntN(50)] = append(pendingDup[i+rng.IntN(50)], ev)
			dups++
		}
	}
	for _, evs := range pendingDup {
		out = append(out, evs...)
	}
	// Shuffle windows of 128 deliveries: with 100 aggregates interleaved,
	// that reorders events of the same aggregate often.
	for lo := 0; lo < len(out); lo += 128 {
		if rng.Float64() < swap {
			w := out[lo:min(lo+128, len(out))]
			rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
		}
	}
	return out, dups
}

// 8 workers, 100 aggregates, 20,000 events with random duplication and
// reordering: every event applied exactly once, per-aggregate order holds,
// counts match.
func TestChaosExactlyOnceInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	type variant struct {
		s     store
		batch int
	}
	var variants []variant
	for _, s := range stores(t) {
		if s.name == "postgres" {
			variants = append(variants, variant{s, 1})
			// Batch mode on a second schema: the bulk claim path.
			variants = append(variants, variant{postgresStore(t), 64})
		} else if s.name == "mysql" {
			// Row locks like Postgres: one at a time and batched, the
			// batch on a second database.
			variants = append(variants, variant{s, 1}, variant{mysqlStore(t), 64})
		} else {
			variants = append(variants, variant{s, 64}) // one writer: batch it
		}
	}
	for _, v := range variants {
		s := v.s
		t.Run(fmt.Sprintf("%s/batch-%d", s.name, v.batch), func(t *testing.T) {
			const aggregates, perAgg = 100, 200
			rng := rand.New(rand.NewPCG(42, uint64(len(s.name)+v.batch)))
			script, _ := chaosScript(t, rng, aggregates, perAgg, 0.1, 0.3)
			opts := []Option{WithWorkers(8), WithBatch(v.batch, 0)}
			ib := newInbox(t, s, nil, opts...)
			b := newScriptedBroker(script)
			defer b.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- ib.Run(ctx, b) }()
			// A liveness bound, not a speed target: fail when no effect
			// lands for a minute (stuck), not when a loaded machine (CI runs
			// prove and the relay tests beside it, under -race) is slow.
			landed, progress := -1, time.Now()
			for {
				n := s.count(t, `SELECT count(*) FROM effects`)
				if n >= aggregates*perAgg {
					break
				}
				if n != landed {
					landed, progress = n, time.Now()
				}
				if time.Since(progress) > time.Minute {
					cancel()
					<-done
					t.Fatalf("stuck: %d effects, none for a minute, stats %+v", n, ib.Stats())
				}
				time.Sleep(100 * time.Millisecond)
			}
			// Let the last acks land, then stop.
			for b.acks.Load()+b.nacks.Load() < b.delivered.Load() || len(b.queue) > 0 {
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			es := effects(t, s.db)
			if len(es) != aggregates*perAgg {
				t.Fatalf("effects = %d, want %d", len(es), aggregates*perAgg)
			}
			seen := map[string]bool{}
			last := map[string]int64{}
			for _, e := range es {
				if seen[e.eventID] {
					t.Fatalf("event %s applied twice", e.eventID)
				}
				seen[e.eventID] = true
				if e.seq != last[e.agg]+1 {
					t.Fatalf("aggregate %s: seq %d applied after %d", e.agg, e.seq, last[e.agg])
				}
				last[e.agg] = e.seq
			}
			if n := s.count(t, `SELECT count(*) FROM ferry_inbox`); n != aggregates*perAgg {
				t.Fatalf("inbox rows = %d", n)
			}
			if n := s.count(t, `SELECT count(*) FROM ferry_inbox_parked WHERE resolved_at IS NULL`); n != 0 {
				t.Fatalf("open parked rows = %d, want 0", n)
			}
			st := ib.Stats()
			if st.Applied != aggregates*perAgg || st.Stale != 0 || st.Collisions != 0 {
				t.Fatalf("stats %+v", st)
			}
			if st.Duplicates == 0 || st.Parked[ReasonGap] == 0 {
				t.Fatalf("the script injected duplicates and reordering, stats show none: %+v", st)
			}
			delivered := b.delivered.Load()
			if b.acks.Load() != delivered-b.nacks.Load() {
				t.Fatalf("acks %d + nacks %d != delivered %d", b.acks.Load(), b.nacks.Load(), delivered)
			}
			t.Logf("%d deliveries for %d events: applied %d, duplicates %d, gap parks %d, retries %d",
				delivered, aggregates*perAgg, st.Applied, st.Duplicates, st.Parked[ReasonGap], st.Retries)
		})
	}
}

// Shutdown drains: Run returns once in-flight transactions finished, with
// no goroutine left (goleak checks in TestMain), and a fault stops Run
// with a *FaultError and nothing acked for the faulted message.
func TestRunDrainAndFault(t *testing.T) {
	s := stores(t)[0]
	var slow atomic.Bool
	h := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
		if slow.Load() {
			time.Sleep(50 * time.Millisecond)
		}
		return s.writeEffect(ctx, tx, ev)
	}
	var script []ferry.Event
	for i := range 50 {
		script = append(script, event(t, "acme", fmt.Sprintf("d%d", i), 1, "x"))
	}
	slow.Store(true)
	ib := newInbox(t, s, h, WithWorkers(4))
	b := newScriptedBroker(script)
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(ctx, b) }()
	for b.acks.Load() < 4 {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	applied := s.count(t, `SELECT count(*) FROM effects`)
	if int64(applied) != b.acks.Load() {
		t.Fatalf("drain: %d effects but %d acks: every committed message must be acked and vice versa", applied, b.acks.Load())
	}
	if applied == 50 {
		t.Fatal("drain test did not stop early")
	}

	crash := errors.New("crash")
	faulty := newInbox(t, s, nil, WithFaults(Faults{AfterCommitBeforeAck: func(ferry.Event) error { return crash }}))
	b2 := newScriptedBroker([]ferry.Event{event(t, "acme", "f", 1, "x")})
	defer b2.Close()
	err := faulty.Run(context.Background(), b2)
	var fe *FaultError
	if !errors.As(err, &fe) || fe.Point != "after_commit_before_ack" || b2.acks.Load() != 0 {
		t.Fatalf("fault: err=%v acks=%d", err, b2.acks.Load())
	}
}

// Negative control for the order check: the same kind of reordered script
// through a consumer without the cursor produces order violations, so the
// per-aggregate order assertion of the chaos test can fail.
func TestChaosWithoutCursorViolatesOrder(t *testing.T) {
	s := stores(t)
	st := s[len(s)-1] // sqlite is enough for the control
	rng := rand.New(rand.NewPCG(7, 7))
	script, _ := chaosScript(t, rng, 20, 50, 0.1, 0.5)
	ib := newInbox(t, st, nil, WithoutOrdering(), WithBatch(64, 0))
	b := newScriptedBroker(script)
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(ctx, b) }()
	for deadline := time.Now().Add(time.Minute); st.count(t, `SELECT count(*) FROM effects`) < 1000; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatal("timeout")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	violations := 0
	last := map[string]int64{}
	for _, e := range effects(t, st.db) {
		if e.seq != last[e.agg]+1 {
			violations++
		}
		last[e.agg] = max(last[e.agg], e.seq)
	}
	if violations == 0 {
		t.Fatal("no order violation without the cursor: the chaos test's order check could not fail")
	}
	t.Logf("%d order violations without the cursor (expected > 0)", violations)
}
