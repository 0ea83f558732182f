package cdc_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/relay/cdc"
)

// ackClock records when each event's broker ack reached the relay.
type ackClock struct {
	broker.Publisher
	mu   sync.Mutex
	acks map[uuid.UUID]time.Time
	n    int
	done chan struct{}
	want int
}

func newAckClock(p broker.Publisher, want int) *ackClock {
	return &ackClock{Publisher: p, acks: map[uuid.UUID]time.Time{}, done: make(chan struct{}), want: want}
}

func (a *ackClock) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	res := a.Publisher.Publish(ctx, events)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, r := range res {
		if r.Err != nil {
			continue
		}
		if _, ok := a.acks[events[i].ID]; !ok {
			a.acks[events[i].ID] = now
			a.n++
			if a.n == a.want {
				close(a.done)
			}
		}
	}
	return res
}

// relayKind starts one kind of relay over h publishing through pub.
type relayKind struct {
	name  string
	start func(b *testing.B, h *harness, pub broker.Publisher) (stop func())
}

const notifyChannel = "ferry_bench"

func relayKinds() []relayKind {
	return []relayKind{
		{"cdc", func(b *testing.B, h *harness, pub broker.Publisher) func() {
			_, stop := h.start(pub)
			return stop
		}},
		{"polling", func(b *testing.B, h *harness, pub broker.Publisher) func() {
			r, err := relay.New(pgxv5.New(h.s.Pool), pub, relay.WithTables(h.tables),
				relay.WithListener(h.s.Pool, notifyChannel), relay.WithPollInterval(200*time.Millisecond))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			return func() {
				cancel()
				if err := <-done; err != nil {
					b.Errorf("polling relay: %v", err)
				}
			}
		}},
	}
}

// BenchmarkDrain measures how fast a relay empties a backlog of 5,000
// events (500 transactions of 10, 50 aggregates) committed while it was
// down, into embedded NATS JetStream. CDC drains from its slot; polling
// from the table.
func BenchmarkDrain(b *testing.B) {
	const events, perTx = 5000, 10
	for _, k := range relayKinds() {
		b.Run(k.name, func(b *testing.B) {
			var total time.Duration
			for range b.N {
				b.StopTimer()
				ctx := context.Background()
				h := newHarness(b)
				n := startNATS(b, 0)
				pub := n.publisher()
				if k.name == "cdc" {
					_, stop := h.start(pub) // create the slot, then go down
					stop()
				}
				for i := 0; i < events; i += perTx {
					evs := make([]ferry.Event, perTx)
					for j := range evs {
						evs[j] = event(fmt.Sprintf("o-%d", (i+j)%50))
					}
					if _, err := h.w.Insert(ctx, evs...); err != nil {
						b.Fatal(err)
					}
				}
				clock := newAckClock(pub, events)
				b.StartTimer()
				t0 := time.Now()
				stop := k.start(b, h, clock)
				select {
				case <-clock.done:
				case <-time.After(2 * time.Minute):
					b.Fatalf("drain incomplete: %d/%d", clock.n, events)
				}
				total += time.Since(t0)
				b.StopTimer()
				stop()
			}
			b.ReportMetric(float64(events*b.N)/total.Seconds(), "events/s")
		})
	}
}

// BenchmarkLatency commits one event per transaction at 1,000 events/s for
// 5 s (4 producers at 250/s each, 40 aggregates) and measures commit→ack:
// from the producer's Commit returning to the broker ack reaching the
// relay. The polling relay is woken by LISTEN/NOTIFY.
func BenchmarkLatency(b *testing.B) {
	const rate, dur, producers = 1000, 5 * time.Second, 4
	total := int(rate * dur / time.Second)
	for _, k := range relayKinds() {
		b.Run(k.name, func(b *testing.B) {
			var all []time.Duration
			for range b.N {
				b.StopTimer()
				ctx := context.Background()
				h := newHarness(b)
				w, err := outbox.New(pgxv5.New(h.s.Pool), outbox.WithTables(h.tables), outbox.WithNotify(notifyChannel))
				if err != nil {
					b.Fatal(err)
				}
				n := startNATS(b, 0)
				clock := newAckClock(n.publisher(), total)
				stop := k.start(b, h, clock)
				time.Sleep(300 * time.Millisecond)
				b.StartTimer()
				var mu sync.Mutex
				commits := map[uuid.UUID]time.Time{}
				var wg sync.WaitGroup
				per := total / producers
				interval := time.Duration(producers) * time.Second / rate
				for p := range producers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						tick := time.NewTicker(interval)
						defer tick.Stop()
						for i := range per {
							<-tick.C
							evs, err := w.Insert(ctx, event(fmt.Sprintf("o-%d", (p*per+i)%40)))
							t := time.Now()
							if err != nil {
								b.Error(err)
								return
							}
							mu.Lock()
							commits[evs[0].ID] = t
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				select {
				case <-clock.done:
				case <-time.After(time.Minute):
					b.Fatalf("incomplete: %d/%d acked", clock.n, total)
				}
				b.StopTimer()
				stop()
				clock.mu.Lock()
				for id, c := range commits {
					all = append(all, max(clock.acks[id].Sub(c), 0))
				}
				clock.mu.Unlock()
			}
			slices.Sort(all)
			q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond) }
			b.ReportMetric(q(0.50), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(q(1.0), "max-ms")
		})
	}
}

// BenchmarkStalledBrokerMemory measures what the relay holds while the
// broker does not answer: the first publish call is held while 400
// transactions of one 100 KB event commit (40 MB of payload), then for 2 s
// more; then the live heap (after a GC) above its level before the
// inserts is reported (live-MB), with the default budget (64 MiB:
// everything is decoded and queued) and with WithMaxPendingBytes(4 MiB)
// (the WAL reader stops).
func BenchmarkStalledBrokerMemory(b *testing.B) {
	const size, txs = 100_000, 400
	for _, c := range []struct {
		name string
		opts []cdc.Option
	}{
		{"default-64MiB", nil},
		{"budget-4MiB", []cdc.Option{cdc.WithMaxPendingBytes(4 << 20)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			held := 0.0
			for range b.N {
				ctx := context.Background()
				h := newHarness(b)
				k := startKafka(b)
				pub := &gatedPublisher{Publisher: k.publisher()}
				_, stop := h.start(pub, c.opts...)
				gate := make(chan struct{})
				pub.mu.Lock()
				pub.gate = gate
				pub.mu.Unlock()
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				base := ms.HeapAlloc
				var in []ferry.Event
				for i := range txs {
					got, err := h.w.Insert(ctx, bigEvent(fmt.Sprintf("o-%d", i%8), size))
					if err != nil {
						b.Fatal(err)
					}
					for j := range got {
						got[j].Payload = nil // the benchmark's copy is not the relay's
					}
					in = append(in, got...)
				}
				time.Sleep(2 * time.Second)
				runtime.GC()
				runtime.ReadMemStats(&ms)
				held = max(held, float64(ms.HeapAlloc-min(base, ms.HeapAlloc))/1e6)
				pub.mu.Lock()
				pub.gate = nil
				pub.mu.Unlock()
				close(gate)
				if v := judge(in, k.read(60*time.Second, allDelivered(in))); v.lost != 0 || v.duplicates != 0 || v.orderViolations != 0 {
					b.Fatalf("%+v", v)
				}
				stop()
			}
			b.ReportMetric(held, "live-MB")
		})
	}
}
