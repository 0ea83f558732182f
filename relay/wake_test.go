package relay

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/outbox"
)

const notifyChannel = "ferry_relay_test"

// TestListenNotify: with polling effectively off (1 minute), a producer
// using outbox.WithNotify wakes the relay at commit. The LISTEN connection
// is then killed server-side; the relay reconnects and keeps waking.
// Without the listener (control) the same event waits for the poll.
func TestListenNotify(t *testing.T) {
	for _, listen := range []bool{true, false} {
		name := "listener"
		if !listen {
			name = "control_without_listener"
		}
		t.Run(name, func(t *testing.T) {
			s := newPGStore(t, 2, outbox.WithNotify(notifyChannel))
			n := startEmbeddedNATS(t)
			opts := fastOpts(2, WithPollInterval(time.Minute))
			if listen {
				opts = append(opts, WithListener(s.pool, notifyChannel))
			}
			r, err := s.newRelay(n.publisher(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			runRelay(t, r)
			waitFor(t, 10*time.Second, "relay owns its shards", func() bool { return len(r.Status().OwnedShards) == 2 })
			time.Sleep(200 * time.Millisecond) // the start-up cycle is over
			s.produce(t, 1, 1)
			if !listen {
				time.Sleep(time.Second)
				if got := s.count(t, "sent"); got != 0 {
					t.Fatalf("without a listener the event was sent within 1s (%d): the test does not isolate the wake-up", got)
				}
				return
			}
			waitFor(t, 3*time.Second, "event sent on NOTIFY", func() bool { return s.count(t, "sent") == 1 })

			// Kill the LISTEN backend; the relay must reconnect.
			ctx := context.Background()
			tag, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()
				AND query LIKE '%`+notifyChannel+`%'`)
			if err != nil {
				t.Fatal(err)
			}
			if tag.RowsAffected() == 0 {
				t.Fatal("found no LISTEN backend to kill")
			}
			time.Sleep(500 * time.Millisecond) // reconnect backoff starts at 100ms
			s.produce(t, 1, 1)
			waitFor(t, 5*time.Second, "event sent on NOTIFY after reconnect", func() bool { return s.count(t, "sent") == 2 })
		})
	}
}

// TestNotifySQLite: the in-process signal wakes the relay (SQLite has no
// LISTEN/NOTIFY).
func TestNotifySQLite(t *testing.T) {
	testNotifyInProcess(t, newSQLiteStore(t, 2))
}

// TestNotifyMySQL: MySQL has no NOTIFY; the relay polls, and Notify() in
// the producer's process wakes it at once (the same check as SQLite's).
func TestNotifyMySQL(t *testing.T) {
	testNotifyInProcess(t, newMySQLStore(t, 2))
}

func testNotifyInProcess(t *testing.T, s *store) {
	n := startEmbeddedNATS(t)
	r, err := s.newRelay(n.publisher(t), fastOpts(2, WithPollInterval(time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	waitFor(t, 10*time.Second, "relay owns its shards", func() bool { return len(r.Status().OwnedShards) == 2 })
	time.Sleep(200 * time.Millisecond)
	s.produce(t, 1, 1)
	time.Sleep(700 * time.Millisecond)
	if got := s.count(t, "sent"); got != 0 {
		t.Fatalf("sent before Notify (%d): the test does not isolate the wake-up", got)
	}
	r.Notify()
	waitFor(t, 3*time.Second, "event sent after Notify", func() bool { return s.count(t, "sent") == 1 })
}

func TestBackoffFullJitter(t *testing.T) {
	r := &Relay{cfg: defaultConfig()}
	r.cfg.backoffBase, r.cfg.backoffMax = 100*time.Millisecond, 2*time.Second
	for attempt, ceil := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: 1600 * time.Millisecond, 6: 2 * time.Second, 60: 2 * time.Second} {
		var maxSeen time.Duration
		distinct := map[time.Duration]bool{}
		for i := 0; i < 2000; i++ {
			d := r.backoff(attempt)
			if d < 0 || d > ceil {
				t.Fatalf("attempt %d: delay %s outside [0, %s]", attempt, d, ceil)
			}
			maxSeen = max(maxSeen, d)
			distinct[d] = true
		}
		// Full jitter spreads over the whole range, not around the ceiling.
		if maxSeen < ceil*8/10 || len(distinct) < 1000 {
			t.Fatalf("attempt %d: max %s of ceiling %s, %d distinct values: not full jitter", attempt, maxSeen, ceil, len(distinct))
		}
	}
}

func TestOrderBatch(t *testing.T) {
	mk := func(id int64, agg string, seq int64, attempts int) claimed {
		return claimed{id: id, attempts: attempts, ev: ferry.Event{ID: uuid.New(), TenantID: "t", AggregateType: "a", AggregateID: agg, AggregateSeq: seq}}
	}
	in := []claimed{
		mk(5, "x", 3, 0), mk(1, "x", 1, 0), mk(2, "y", 7, 1), mk(3, "x", 2, 0), mk(4, "y", 8, 0),
		mk(6, "z", 1, 0), mk(7, "z", 3, 0), // gap: z's seq 2 missing
	}
	var got []string
	for _, c := range orderBatch(in) {
		got = append(got, c.ev.AggregateID+":"+string(rune('0'+c.ev.AggregateSeq)))
	}
	want := "x:1 y:7 x:2 x:3 z:1"
	if strings.Join(got, " ") != want {
		t.Fatalf("orderBatch = %v, want %s (id order; y stops after a retried row; z stops at a gap)", got, want)
	}
}
