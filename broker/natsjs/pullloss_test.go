package natsjs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// withPullHeartbeat overrides DefaultPullHeartbeat (this package's tests
// only: the control runs with nats.go's own default).
func withPullHeartbeat(d time.Duration) ConsumerOption {
	return func(c *consumerConfig) error { c.pullHeartbeat = d; return nil }
}

// TestConsumerResumesAfterPullRequestLost: the server drops Consume's pull
// request without telling the client, and Consume must pull again by
// itself. Here the consumer's waiting-request queue is full (512 requests
// of another client), so the server discards the request; a request with a
// heartbeat gets no answer at all ("don't bother responding ... the
// client waits for missing heartbeats and retries", nats-server). Then the
// other client goes away and 5 messages are published: they must arrive
// within 10 s. Negative control: with nats.go's default heartbeat (15 s,
// so 30 s before it re-pulls) none arrives in those 10 s.
//
// The same silence follows a consumer leader SIGKILLed before its
// followers learned of the request (CI: prove's nats-leader-sigkill once
// ended with 95 of 95 undelivered after 60 s while Consume woke Next
// every second, which restarted nats.go's heartbeat timer on each call so
// that it never fired), and nats.go's own skipped re-pull under load
// (see DefaultPullHeartbeat).
func TestConsumerResumesAfterPullRequestLost(t *testing.T) {
	for _, s := range servers(t) {
		for _, control := range []bool{false, true} {
			name := s.name + "/heartbeat"
			if control {
				name = s.name + "/nats-default-heartbeat-control"
			}
			t.Run(name, func(t *testing.T) {
				nc := connect(t, s.url)
				stream, prefix := newStream(t, nc)
				var opts []ConsumerOption
				if control {
					opts = append(opts, withPullHeartbeat(15*time.Second))
				}
				c, err := NewConsumer(context.Background(), nc, stream, "pl", opts...)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				info, err := c.cons.Info(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				next := fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.pl", stream)

				// Another client fills the waiting-request queue.
				other := connect(t, s.url)
				otherSub, err := other.SubscribeSync(randName("other.") + ".*")
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < info.Config.MaxWaiting; i++ {
					reply := otherSub.Subject[:len(otherSub.Subject)-1] + fmt.Sprint(i)
					if err := other.PublishRequest(next, reply, []byte(`{"batch":1,"expires":120000000000}`)); err != nil {
						t.Fatal(err)
					}
				}
				waitFor(t, 10*time.Second, fmt.Sprintf("%d waiting requests", info.Config.MaxWaiting), func() bool {
					ci, err := js.Consumer(context.Background(), stream, "pl")
					return err == nil && ci.CachedInfo().NumWaiting >= info.Config.MaxWaiting
				})

				// Consume's request meets the full queue.
				seen, err := nc.SubscribeSync(next)
				if err != nil {
					t.Fatal(err)
				}
				ch, stop := consumeInto(t, c)
				if _, err := seen.NextMsg(10 * time.Second); err != nil {
					t.Fatalf("Consume sent no pull request: %v", err)
				}
				_ = seen.Unsubscribe()
				// The server takes pull requests in order: once a no-wait
				// request sent after Consume's is answered, Consume's was
				// handled (dropped).
				if _, err := nc.Request(next, []byte(`{"batch":1,"no_wait":true}`), 10*time.Second); err != nil {
					t.Fatalf("no-wait request after Consume's: %v", err)
				}
				other.Close()

				p, err := NewPublisher(nc)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				start := time.Now()
				publishN(t, p, prefix+".x", 5)
				got := collect(t, ch, 5, 10*time.Second)
				_ = stop()
				if control {
					if len(got) == 5 {
						t.Fatalf("control with nats.go's default heartbeat: all 5 delivered in %v although Consume's pull request was dropped", time.Since(start).Round(time.Millisecond))
					}
					t.Logf("control: %d of 5 delivered within 10s", len(got))
					return
				}
				if len(got) != 5 {
					t.Fatalf("%d of 5 messages delivered within 10s after the server dropped Consume's pull request; Consume never pulled again", len(got))
				}
				t.Logf("pull request dropped; 5 of 5 delivered %v after publishing", time.Since(start).Round(time.Millisecond))
			})
		}
	}
}

// TestConsumerIdleHoldsOnePullRequest: an idle Consume keeps its pull
// request on the server. Its heartbeats arrive, so the iterator does not
// decide it lost the request; without them a new request would pile up
// every two heartbeats until they expire (30 s): 4 or more after 7 s. One
// extra request is tolerated: a heartbeat delayed past 2 s on a loaded
// machine re-pulls once, which costs a pull batch, not correctness.
func TestConsumerIdleHoldsOnePullRequest(t *testing.T) {
	for _, s := range servers(t) {
		t.Run(s.name, func(t *testing.T) {
			nc := connect(t, s.url)
			stream, _ := newStream(t, nc)
			c, err := NewConsumer(context.Background(), nc, stream, "idle")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, stop := consumeInto(t, c)
			defer stop()
			const idle = 7 * DefaultPullHeartbeat
			time.Sleep(idle)
			info, err := c.cons.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if info.NumWaiting < 1 || info.NumWaiting > 2 {
				t.Fatalf("idle consumer after %v: %d pull requests waiting, want 1 (2 at most)", idle, info.NumWaiting)
			}
		})
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
