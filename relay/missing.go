package relay

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/internal/backoff"
)

// missingDests tracks destinations (event topics: a Kafka topic, a NATS
// subject, a RabbitMQ routing key) whose last publish failed with
// broker.ErrDestinationMissing (Relay.missing) or, for Relay.unavailable,
// failed transiently while the destination took nothing else (see
// holdUnavailable). Rows routed to them are held: marked
// pending again with a delay, no attempt charged, never dead. The delay
// grows per destination (not per row: the fault is the destination's),
// from the backoff base up to the probe cap, so a destination created
// later is used within about one probe interval, whatever the backlog.
// The zero value is ready to use.
type missingDests struct {
	n  atomic.Int32 // len(m): lets ok skip the lock on the hot path
	mu sync.Mutex
	m  map[string]*missingDest
}

type missingDest struct {
	since    time.Time // first failure of this episode
	last     time.Time // latest failure
	failures int       // consecutive failures
}

// failed records a failure for topic and returns the delay before its rows
// are tried again: uniform in [ceil/2, ceil], ceil = min(cap, base·2^(n-1)).
// The lower half bound keeps a missing destination from being retried in a
// tight loop.
func (d *missingDests) failed(topic string, now time.Time, base, limit time.Duration) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]*missingDest{}
	}
	e, ok := d.m[topic]
	if !ok {
		e = &missingDest{since: now}
		d.m[topic] = e
		d.n.Store(int32(len(d.m)))
	}
	e.failures++
	e.last = now
	ceil := max(backoff.Ceil(base, limit, e.failures), time.Millisecond)
	return backoff.Uniform(ceil/2, ceil)
}

// ok records a successful publish to topic; it reports whether topic was
// missing before (and for how long).
func (d *missingDests) ok(topic string, now time.Time) (was bool, missingFor time.Duration) {
	if d.n.Load() == 0 {
		return false, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e, found := d.m[topic]
	if !found {
		return false, 0
	}
	delete(d.m, topic)
	d.n.Store(int32(len(d.m)))
	return true, now.Sub(e.since)
}

// list returns the destinations currently missing, sorted, after dropping
// those not seen failing for stale (their rows were resolved otherwise,
// e.g. discarded by an operator, so nothing publishes to them any more).
func (d *missingDests) list(now time.Time, stale time.Duration) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.m))
	for t, e := range d.m {
		if now.Sub(e.last) > stale {
			delete(d.m, t)
			d.n.Store(int32(len(d.m)))
			continue
		}
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// missingStale is how long a missing destination stays reported without a
// new failure: a few retry periods plus a batch's publish bound.
func (r *Relay) missingStale() time.Duration {
	return 3*r.cfg.probeMax + r.cfg.publishTimeout + r.cfg.poll
}

// refreshMissing sets ferry_relay_destination_missing (and _unavailable)
// and returns the missing list.
func (r *Relay) refreshMissing() []string {
	now := time.Now()
	r.m.destUnavailable.Set(float64(len(r.unavailable.list(now, r.missingStale()))))
	l := r.missing.list(now, r.missingStale())
	r.m.destMissing.Set(float64(len(l)))
	return l
}

// acceptedDests remembers when the broker last accepted an event for each
// destination, so a transient failure can be told apart: the row's own
// when its destination took other events lately, the destination's when
// it took none. Entries older than keep are dropped as the map grows, so
// per-aggregate topics do not make it grow without bound.
type acceptedDests struct {
	mu      sync.Mutex
	m       map[string]time.Time
	pruneAt int
}

func (a *acceptedDests) record(topics map[string]bool, now, keepAfter time.Time) {
	if len(topics) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]time.Time{}
	}
	for t := range topics {
		a.m[t] = now
	}
	if len(a.m) > 2*a.pruneAt+64 {
		for t, at := range a.m {
			if at.Before(keepAfter) {
				delete(a.m, t)
			}
		}
		a.pruneAt = len(a.m)
	}
}

// since reports whether topic accepted an event at or after t.
func (a *acceptedDests) since(topic string, t time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.m[topic]
	return ok && !at.Before(t)
}
