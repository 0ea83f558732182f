package inbox

import (
	"context"
	"sync"
)

// idGate keeps the copies of one (tenant, event id) in delivery order
// across workers. Run routes by aggregate, so two messages with the same
// event id on different aggregates — a producer that reused an id with
// other content — land on different workers, and without the gate the
// worker that happens to claim first wins: the copy later in the stream
// could be applied and the original parked as a collision.
//
// The dispatcher enters every valid message before queueing it: while a
// copy of its key is queued or being processed on another worker, it
// waits for that worker to finish (commit or roll back, then ack or nack)
// before the message is handed to its own worker. Copies routed to the
// same worker pass at once: the worker's queue is FIFO. So the copy
// delivered first is decided first. The wait happens only for a reused
// event id on two aggregates (a collision, or a producer bug): ordinary
// duplicates are redeliveries of the same aggregate and share a worker.
//
// One gate per Run; it holds at most the in-flight messages
// (workers × (queue + batch)) and costs a map operation under a mutex per
// message on enter and on leave.
type idGate struct {
	mu sync.Mutex
	m  map[string]*gateEntry
}

type gateEntry struct {
	worker int           // the worker holding the key's copies
	n      int           // copies entered and not yet left
	free   chan struct{} // closed when n drops to 0; made by the first waiter
}

func newIDGate() *idGate { return &idGate{m: map[string]*gateEntry{}} }

// enter registers m for worker w, waiting while another worker holds a
// copy of m's key. It returns false if ctx ended first (m is then not
// registered). Invalid messages have no trustworthy key and pass.
func (g *idGate) enter(ctx context.Context, m *message, w int) bool {
	if m.invalid != nil {
		return true
	}
	key := m.key()
	for {
		g.mu.Lock()
		e := g.m[key]
		if e == nil {
			e = &gateEntry{worker: w}
			g.m[key] = e
		}
		if e.worker == w {
			e.n++
			g.mu.Unlock()
			m.gated, m.gateKey = true, key
			return true
		}
		if e.free == nil {
			e.free = make(chan struct{})
		}
		free := e.free
		g.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return false
		}
	}
}

// leave releases the keys of msgs after their worker finished them.
func (g *idGate) leave(msgs []*message) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range msgs {
		if !m.gated {
			continue
		}
		m.gated = false
		key := m.gateKey
		e := g.m[key]
		if e == nil {
			continue
		}
		if e.n--; e.n == 0 {
			delete(g.m, key)
			if e.free != nil {
				close(e.free)
			}
		}
	}
}
