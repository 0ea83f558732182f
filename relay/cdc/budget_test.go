package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/relay/cdc"
)

// gatedPublisher records the payload bytes of every Publish call and can
// hold the calls until released, so the WAL reader runs ahead of a broker
// that does not answer.
type gatedPublisher struct {
	broker.Publisher
	mu    sync.Mutex
	calls []int // payload bytes per call
	gate  chan struct{}
}

func (g *gatedPublisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	n := 0
	for _, e := range events {
		n += len(e.Payload)
	}
	g.mu.Lock()
	g.calls = append(g.calls, n)
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	return g.Publisher.Publish(ctx, events)
}

// largest returns how many calls there were and the largest payload of
// those from the from-th on.
func (g *gatedPublisher) largest(from int) (calls, most int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.calls[min(from, len(g.calls)):] {
		most = max(most, n)
	}
	return len(g.calls), most
}

// hold makes the next Publish calls wait until release is called.
func (g *gatedPublisher) hold() (release func()) {
	gate := make(chan struct{})
	g.mu.Lock()
	g.gate = gate
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.gate = nil
		g.mu.Unlock()
		close(gate)
	}
}

// The budget tests' events and budget: 40 events of 10 KiB under 40 KiB,
// and their cases: the budget, and the default budget as the negative
// control.
const budgetEventSize, budgetBytes, budgetEvents = 10 << 10, 40 << 10, 40

var budgetCases = []struct {
	name    string
	opts    []cdc.Option
	bounded bool
}{
	{"budget-40KiB", []cdc.Option{cdc.WithMaxPendingBytes(budgetBytes)}, true},
	{"control-default-budget", nil, false},
}

// bigEvent is an event of aggregate agg with a payload of size bytes.
func bigEvent(agg string, size int) ferry.Event {
	e := event(agg)
	e.Payload = []byte(`{"pad":"` + strings.Repeat("x", size-10) + `"}`)
	return e
}

// TestMaxPendingBytes: with a 40 KiB budget and 10 KiB events no Publish
// call carries more than 40 KiB — in the catch-up (rows written before the
// slot existed, read from the table) and in the stream while the broker
// holds the first call (the reader stops decoding instead of queueing
// every transaction) — and every event arrives once, per aggregate in
// order. The negative control, the default budget, hands the held-up
// events to the broker in one call far above 40 KiB.
func TestMaxPendingBytes(t *testing.T) {
	const size, budget, n = budgetEventSize, budgetBytes, budgetEvents
	for _, tc := range budgetCases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			k := startKafka(t)
			var in []ferry.Event
			insert := func() {
				for i := range n {
					e := bigEvent(fmt.Sprintf("o-%d", i%4), size)
					got, err := h.w.Insert(ctx, e)
					if err != nil {
						t.Fatal(err)
					}
					in = append(in, got...)
				}
			}
			insert() // before the slot: the catch-up reads them from the table
			pub := &gatedPublisher{Publisher: k.publisher()}
			h.start(pub, tc.opts...)
			catchUpCalls, catchUpMost := pub.largest(0)

			// The broker holds the next call; meanwhile n transactions commit.
			release := pub.hold()
			insert()
			waitFor(t, 20*time.Second, "first held call", func() bool { c, _ := pub.largest(0); return c > catchUpCalls })
			time.Sleep(time.Second) // the reader decodes what it may
			release()

			got := k.read(30*time.Second, allDelivered(in))
			if v := judge(in, got); v.lost != 0 || v.duplicates != 0 || v.orderViolations != 0 {
				t.Fatalf("%+v", v)
			}
			waitFor(t, 60*time.Second, "rows sent", func() bool { return h.statusCounts(ctx)["sent"] == 2*n })
			calls, most := pub.largest(catchUpCalls)
			t.Logf("catch-up: %d calls, largest %d bytes; stream: %d calls, largest %d bytes", catchUpCalls, catchUpMost, calls-catchUpCalls, most)
			if tc.bounded && (most > budget || catchUpMost > budget) {
				t.Fatalf("a publish call carried %d bytes (catch-up %d), budget %d", most, catchUpMost, budget)
			}
			if !tc.bounded && (most <= budget || catchUpMost <= budget) {
				t.Fatalf("control: largest call %d bytes in the stream, %d in the catch-up, want both > %d (else the bounded case proves nothing)", most, catchUpMost, budget)
			}
		})
	}
}

// TestLargeTransactionShipsInParts: one transaction of 40 events of
// 10 KiB (400 KiB) with a 40 KiB budget is handed to the broker in parts
// while the reader decodes it, not held whole and shipped in one call: no
// publish call carries more than the budget, every event arrives once and
// in order per aggregate, every row is marked sent, and the slot confirms
// the transaction once its last part is acked and recorded. The broker
// holds the first call for a second, so the reader must stop mid-
// transaction. Negative control, the default budget: the transaction goes
// out in one call of 400 KiB.
func TestLargeTransactionShipsInParts(t *testing.T) {
	const size, budget, n = budgetEventSize, budgetBytes, budgetEvents
	for _, tc := range budgetCases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newHarness(t)
			k := startKafka(t)
			pub := &gatedPublisher{Publisher: k.publisher()}
			h.start(pub, tc.opts...)
			before, _ := pub.largest(0)

			release := pub.hold()
			events := make([]ferry.Event, n)
			for i := range events {
				events[i] = bigEvent(fmt.Sprintf("o-%d", i%4), size)
			}
			in, err := h.w.Insert(ctx, events...) // one transaction
			if err != nil {
				t.Fatal(err)
			}
			committed := h.currentWAL(ctx)
			waitFor(t, 20*time.Second, "first held call", func() bool { c, _ := pub.largest(0); return c > before })
			time.Sleep(time.Second) // the reader decodes what it may
			if c := h.confirmed(ctx); c >= committed {
				t.Fatalf("slot confirmed %s while the transaction's first call is held (committed by %s)", c, committed)
			}
			release()

			got := k.read(30*time.Second, allDelivered(in))
			if v := judge(in, got); v.lost != 0 || v.duplicates != 0 || v.orderViolations != 0 {
				t.Fatalf("%+v", v)
			}
			waitFor(t, 60*time.Second, "rows sent", func() bool { return h.statusCounts(ctx)["sent"] == n })
			waitFor(t, 30*time.Second, "slot past the transaction", func() bool { return h.confirmed(ctx) >= committed })
			calls, most := pub.largest(before)
			t.Logf("%d calls, largest %d bytes", calls-before, most)
			if tc.bounded && most > budget {
				t.Fatalf("a publish call carried %d bytes, budget %d: the transaction was not shipped in parts", most, budget)
			}
			if !tc.bounded && most < n*size {
				t.Fatalf("control: largest call %d bytes, want the whole transaction (%d) in one (else the bounded case proves nothing)", most, n*size)
			}
		})
	}
}
