package relay

import (
	"context"
	"errors"
	"github.com/ferryhq/ferry/outbox"
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
	for _, st := range serverStores {
		t.Run(st.name, func(t *testing.T) { testFence(t, st.new) })
	}
}

func testFence(t *testing.T, newStore func(testing.TB, int, ...outbox.Option) *store) {
	a, b, s := fenceScenario(t, newStore, false)
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
	for _, st := range serverStores {
		t.Run(st.name, func(t *testing.T) { testFenceNegativeControl(t, st.new) })
	}
}

func testFenceNegativeControl(t *testing.T, newStore func(testing.TB, int, ...outbox.Option) *store) {
	_, b, s := fenceScenario(t, newStore, true)
	if dead := s.count(t, "dead"); dead == 0 {
		t.Fatal("without the fence the stale relay's write should have landed, but no row is dead: the scenario does not exercise the fence")
	}
	if b.Status().Fenced == 0 {
		t.Fatal("expected the new owner's mark of the overwritten row to fail")
	}
}

func fenceScenario(t *testing.T, newStore func(testing.TB, int, ...outbox.Option) *store, noFence bool) (a, b *Relay, s *store) {
	s = newStore(t, 1)
	n := startEmbeddedNATS(t)
	s.produce(t, 5, 1)

	// A's broker rejects everything as permanent (say, a misconfigured
	// route on A's side only); A pauses after publishing, before marking.
	var paused atomic.Bool
	aPublished := make(chan struct{})
	releaseA := make(chan struct{})
	aMarked := make(chan string, 4)
	pubA := &countingPublisher{Publisher: n.publisher(t), failWith: func(int, *ferry.Event) error {
		return broker.NewError(broker.ClassPermanent, errors.New("no route (relay A)"))
	}}
	ra, err := New(s.db, pubA, fastOpts(1, WithInstanceID("relay-a"),
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
		for paused.Load() {
			time.Sleep(10 * time.Millisecond)
		}
	}
	ra.cfg.afterMark = func(kind string) { aMarked <- kind }
	stopA := runRelay(t, ra)
	t.Cleanup(func() {
		paused.Store(false)
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
		rows, err := s.db.Executor().Query(context.Background(), `SELECT count(*) FROM ferry_relay_leases WHERE shard = 0 AND expires_at <= now()`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var c int64
		for rows.Next() {
			_ = rows.Scan(&c)
		}
		return c == 1
	})

	// B takes over and publishes; it pauses before marking too, so that
	// A's late write meets rows B owns but has not yet marked.
	bPublished := make(chan struct{})
	releaseB := make(chan struct{})
	bMarked := make(chan string, 4)
	rb, err := New(s.db, n.publisher(t), fastOpts(1, WithInstanceID("relay-b"),
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
	rb.cfg.afterMark = func(kind string) { bMarked <- kind }
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
	paused.Store(false)
	close(releaseA)
	if kind := <-aMarked; kind != "failed" {
		t.Fatalf("A's write was %q, want failed", kind)
	}
	close(releaseB)
	if kind := <-bMarked; kind != "sent" {
		t.Fatalf("B's write was %q, want sent", kind)
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
	rows, err := s.db.Executor().Query(context.Background(), `SELECT fence FROM ferry_relay_leases WHERE shard = 0`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var f int64
	for rows.Next() {
		if err := rows.Scan(&f); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
