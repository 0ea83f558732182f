package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// TestFence: relay A publishes a batch and then stalls (a GC pause, a
// frozen VM) across its lease expiry. Relay B takes the shard over with a
// higher fence and publishes the same rows. When A wakes up it tries to
// dead-letter the row its broker rejected; the fence rejects that write,
// so B's outcome stands.
func TestFence(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testFence(t, newStore) })
}

func testFence(t *testing.T, newStore newStoreFunc) {
	a, b, s := fenceScenario(t, newStore, false, false, false)
	if dead := s.count(t, "dead"); dead != 0 {
		t.Fatalf("%d rows dead: the stale relay overwrote the new owner's work", dead)
	}
	if sent := s.count(t, "sent"); sent != 5 {
		t.Fatalf("%d rows sent, want 5 (all published by the new owner)", sent)
	}
	if a.Status().Fenced != 1 || a.Status().Dead != 0 {
		t.Fatalf("stale relay: %+v, want exactly its 1 write rejected by the fence and nothing dead", a.Status())
	}
	if b.Status().Fenced != 0 {
		t.Fatalf("new owner had %d writes rejected", b.Status().Fenced)
	}
}

// TestFenceNegativeControl runs the same scenario with the fence taken
// out of the stale relay's statements (unexported test hook): its late
// write lands, a row the new owner published ends up dead, and the new
// owner's mark is lost. The fence is what prevents that.
func TestFenceNegativeControl(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) { testFenceNegativeControl(t, newStore) })
}

func testFenceNegativeControl(t *testing.T, newStore newStoreFunc) {
	_, b, s := fenceScenario(t, newStore, true, false, false)
	if dead := s.count(t, "dead"); dead == 0 {
		t.Fatal("without the fence the stale relay's write should have landed, but no row is dead: the scenario does not exercise the fence")
	}
	// In the watermark design the new owner does not mark the row it
	// published (its watermark passes a row that is no longer pending), so
	// the violation is the dead row alone: dead, yet on the broker.
	if b.Status().Fenced == 0 && !s.watermark {
		t.Fatal("expected the new owner's mark of the overwritten row to fail")
	}
}

// TestFenceAcked is TestFence with A's broker acking its batch: A's late
// mark of the 5 rows (in the watermark design, its advance past them) is
// rejected by the fence as a whole and counted as 5 fenced writes; B's
// publication stands.
func TestFenceAcked(t *testing.T) {
	eachStore(t, invariantStores, func(t *testing.T, newStore newStoreFunc) {
		for _, leaseFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("lease-loop-first=%v", leaseFirst), func(t *testing.T) { testFenceAcked(t, newStore, leaseFirst) })
		}
	})
}

// testFenceAcked: with leaseFirst, A's lease loop wakes first and sees the
// lease lost before A's write: what A holds for the shard is dropped there
// (and counted), and the write that follows is still rejected and counted
// once.
func testFenceAcked(t *testing.T, newStore newStoreFunc, leaseFirst bool) {
	a, b, s := fenceScenario(t, newStore, false, true, leaseFirst)
	if sent := s.count(t, "sent"); sent != 5 {
		t.Fatalf("%d rows sent, want 5", sent)
	}
	if a.Status().Fenced != 5 {
		t.Fatalf("stale relay: %+v, want its 5 acked rows' write rejected by the fence", a.Status())
	}
	if b.Status().Fenced != 0 || b.Status().Published != 5 {
		t.Fatalf("new owner: %+v, want 5 published and nothing fenced", b.Status())
	}
}

// fenceScenario: A publishes shard 0's 5 rows — its broker rejecting them
// all as permanent, or, with aAcks, acking them — and stalls before its
// write while B takes the shard over; A's write then meets B's lease.
func fenceScenario(t *testing.T, newStore newStoreFunc, noFence, aAcks, leaseFirst bool) (a, b *Relay, s *store) {
	s = newStore(t, 1)
	n := startEmbeddedNATS(t)
	s.produce(t, 5, 1)

	// A's broker rejects everything as permanent (say, a misconfigured
	// route on A's side only); A pauses after publishing, before marking.
	var paused atomic.Bool
	// holdLease keeps A's lease loop asleep until A's late write is done:
	// woken first, it would notice the lost lease and (watermark design)
	// forget the acked rows before the write is attempted.
	var holdLease atomic.Bool
	aPublished := make(chan struct{})
	releaseA := make(chan struct{})
	aMarked := make(chan string, 4)
	pubA := &countingPublisher{Publisher: n.publisher(t), failWith: func(int, *ferry.Event) error {
		return broker.NewError(broker.ClassPermanent, errors.New("no route (relay A)"))
	}}
	wantA := "failed"
	if aAcks {
		pubA.failWith = nil
		wantA = "sent"
		if s.watermark {
			wantA = "advance"
		}
	}
	ra, err := s.newRelay(pubA, fastOpts(1, WithInstanceID("relay-a"),
		WithFaults(Faults{AfterPublishBeforeMark: func(context.Context, []ferry.Event, []broker.Result) error {
			paused.Store(true)
			close(aPublished)
			<-releaseA
			return nil
		}}))...)
	if err != nil {
		t.Fatal(err)
	}
	ra.cfg.noFence = noFence // start() renders the queries with it
	ra.cfg.beforeLeaseTick = func() {
		for paused.Load() || holdLease.Load() {
			time.Sleep(10 * time.Millisecond)
		}
	}
	ra.cfg.afterMark = func(kind string) { aMarked <- kind }
	stopA := runRelay(t, ra)
	t.Cleanup(func() {
		paused.Store(false)
		holdLease.Store(false)
		select {
		case <-releaseA:
		default:
			close(releaseA)
		}
	})
	<-aPublished
	fenceA := leaseFence(t, s)

	// A is frozen: its lease lapses.
	waitFor(t, 10*time.Second, "A's lease to expire", func() bool {
		return s.scalar(t, `SELECT count(*) FROM ferry_relay_leases WHERE shard = 0 AND expires_at <= now()`) == 1
	})

	// B takes over and publishes; it pauses before marking too, so that
	// A's late write meets rows B owns but has not yet marked.
	bPublished := make(chan struct{})
	releaseB := make(chan struct{})
	bMarked := make(chan string, 4)
	rb, err := s.newRelay(n.publisher(t), fastOpts(1, WithInstanceID("relay-b"),
		WithFaults(Faults{AfterPublishBeforeMark: func(context.Context, []ferry.Event, []broker.Result) error {
			select {
			case <-bPublished:
			default:
				close(bPublished)
			}
			<-releaseB
			return nil
		}}))...)
	if err != nil {
		t.Fatal(err)
	}
	rb.cfg.afterMark = func(kind string) {
		select {
		case bMarked <- kind:
		default: // later cycles' advances (watermark design)
		}
	}
	stopB := runRelay(t, rb)
	t.Cleanup(func() {
		select {
		case <-releaseB:
		default:
			close(releaseB)
		}
	})
	<-bPublished
	if f := leaseFence(t, s); f != fenceA+1 {
		t.Fatalf("B took the shard with fence %d, want %d (A's + 1)", f, fenceA+1)
	}

	// A wakes up and writes its stale outcome.
	if leaseFirst {
		paused.Store(false)
		waitFor(t, 10*time.Second, "A's lease loop to see the lease lost", func() bool { return len(ra.Status().OwnedShards) == 0 })
	} else {
		holdLease.Store(true)
		paused.Store(false)
	}
	close(releaseA)
	if kind := recvWithin(t, aMarked, "A's write"); kind != wantA {
		t.Fatalf("A's write was %q, want %s", kind, wantA)
	}
	holdLease.Store(false)
	close(releaseB)
	wantB := "sent"
	if s.watermark {
		wantB = "advance" // acked rows are passed by the watermark, not marked
	}
	if kind := recvWithin(t, bMarked, "B's write"); kind != wantB {
		t.Fatalf("B's write was %q, want %s", kind, wantB)
	}
	if s.watermark {
		// The first advance passes nothing while a transaction that was
		// open anywhere in the cluster at B's claim still runs (another
		// package's tests share the server); B's idle cycles advance again.
		waitFor(t, 30*time.Second, "B's watermark to pass its rows", func() bool {
			return s.scalar(t, `SELECT count(*) FROM ferry_relay_leases l WHERE l.shard = 0 AND l.sent_up_to >= (SELECT max(id) FROM ferry_outbox)`) == 1
		})
	}
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	return ra, rb, s
}

func leaseFence(t *testing.T, s *store) int64 {
	t.Helper()
	return s.scalar(t, `SELECT fence FROM ferry_relay_leases WHERE shard = 0`)
}

// recvWithin receives from ch, failing the test after 30 s: a relay whose
// write errs never signals, and the test must say so rather than hang.
func recvWithin(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: nothing within 30s", what)
		return ""
	}
}
