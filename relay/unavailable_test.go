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

// errNoResponse is what a JetStream publish to a stream without a quorum
// returns (nats: no response from stream): the broker answers its ping,
// the destination takes nothing.
var errNoResponse = broker.NewError(broker.ClassNotSent, errors.New("natsjs: not stored: nats: no response from stream (injected)"))

func (c *countingPublisher) setFail(f func(i int, e *ferry.Event) error) {
	c.mu.Lock()
	c.failWith = f
	c.mu.Unlock()
}

// TestDestinationUnavailable: a destination that takes nothing while the
// broker answers its ping (found by ferry prove's nats-partition: the
// stream leader cut off from its replicas keeps its clients and answers
// the ping, and every publish times out) must not send rows to dead,
// however many retries it takes: they are held, uncharged, with the
// destination's backoff, and reported; everything is sent once it
// recovers. A row that fails while others reach the same destination is
// still charged and goes dead at max attempts.
func TestDestinationUnavailable(t *testing.T) {
	eachStore(t, serverStores, func(t *testing.T, newStore newStoreFunc) {
		s, n, pub, r := unavailableSetup(t, newStore)
		runRelay(t, r)
		want := s.produce(t, 20, 4)
		waitFor(t, 15*time.Second, "publish retried well past max attempts", func() bool { p, _ := pub.calls(); return p >= 12 })
		if d := s.count(t, "dead"); d != 0 {
			t.Fatalf("%d rows dead while their destination was unavailable", d)
		}
		if st := r.Status(); st.Breaker != BreakerClosed || st.Retries == 0 {
			t.Fatalf("breaker %s, retries %d: want closed (the ping answers) and retries counted", st.Breaker, st.Retries)
		}
		if g := gauge(r.m.destUnavailable); g != 1 {
			t.Fatalf("ferry_relay_destination_unavailable = %v during the fault, want 1", g)
		}
		pub.setFail(nil)
		waitFor(t, 20*time.Second, "all sent after recovery", func() bool { return s.count(t, "sent") == len(want) })
		checkBroker(t, n.read(t), want)

		// Now one aggregate's rows fail while the others reach the
		// destination: that is the row's failure, charged, dead at 2.
		pub.setFail(func(_ int, e *ferry.Event) error {
			if e.AggregateID == "agg-000" {
				return errNoResponse
			}
			return nil
		})
		s.produce(t, 20, 4)
		// The others keep reaching the destination until the head is dead:
		// a failure counts as the row's own only if the destination
		// accepted something within the probe cap before its publish. A
		// retry that is its destination's only traffic is held instead, by
		// design; on a loaded machine (go test -race -p 4) the head's retry
		// came more than the cap after the last row of the others and the
		// head was held, never dead.
		ctx := context.Background()
		stop, done := make(chan struct{}), make(chan struct{})
		var extra atomic.Int64
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if _, err := s.insert(ctx, ev(fmt.Sprintf("agg-%03d", 1+i%3), "other")); err != nil {
					t.Error(err)
					return
				}
				extra.Add(1)
			}
		}()
		waitFor(t, 15*time.Second, "the failing aggregate's head dead-lettered", func() bool { return s.count(t, "dead") == 1 })
		close(stop)
		<-done
		waitFor(t, 15*time.Second, "the other aggregates sent", func() bool { return s.count(t, "sent") == len(want)+15+int(extra.Load()) })
		if d := s.count(t, "dead"); d != 1 {
			t.Fatalf("%d rows dead, want only the failing aggregate's head (its later rows held behind it)", d)
		}
	})
}

// TestDestinationUnavailableNegativeControl: the same unavailable
// destination without the outage check (noBreaker also turns off its
// destination level) charges every retry and sends rows to dead.
func TestDestinationUnavailableNegativeControl(t *testing.T) {
	eachStore(t, serverStores, func(t *testing.T, newStore newStoreFunc) {
		s, _, _, r := unavailableSetup(t, newStore)
		r.cfg.noBreaker = true
		runRelay(t, r)
		s.produce(t, 20, 4)
		waitFor(t, 15*time.Second, "rows dead from the unavailable destination", func() bool { return s.count(t, "dead") > 0 })
	})
}

// unavailableSetup is both tests' start: a relay (max attempts 2) whose
// every publish fails as an unanswered destination, on a fresh store and
// embedded server; the caller starts it.
func unavailableSetup(t *testing.T, newStore newStoreFunc) (*store, *natsEnv, *countingPublisher, *Relay) {
	t.Helper()
	s := newStore(t, 2)
	n := startEmbeddedNATS(t)
	pub := &countingPublisher{Publisher: n.publisher(t)}
	pub.setFail(func(int, *ferry.Event) error { return errNoResponse })
	r, err := s.newRelay(pub, fastOpts(2, WithMaxAttempts(2), WithBackoff(5*time.Millisecond, 20*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	return s, n, pub, r
}
