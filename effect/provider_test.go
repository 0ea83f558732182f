package effect_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// mode is how the fake provider misbehaves on the first charge request of
// each idempotency key. Later requests behave.
type mode int

const (
	modeNormal             mode = iota
	modeDropAfterApply          // apply, then close the connection without a response
	mode503AfterApply           // apply, then answer 503
	modeTimeoutBeforeApply      // hang until the client gives up; never apply
	modeTimeoutAfterApply       // apply, then hang until the client gives up
)

func (m mode) String() string {
	return [...]string{"normal", "drop_after_apply", "503_after_apply", "timeout_before_apply", "timeout_after_apply"}[m]
}

// call is one request the provider saw for a key, in arrival order.
type call struct {
	kind   string // "charge" or "status"
	result string // charge: applied, replayed, not_applied; status: found, not_found, unavailable
}

// provider is a fake payment provider (the one thing in these tests that is
// a fake: we do not ship against it). It honours Idempotency-Key — the same
// key never charges twice — and counts charges per order, so a client that
// retries with a new key (or none) double-charges visibly.
type provider struct {
	srv  *httptest.Server
	mode atomic.Int32
	// unavailable: every request (charge and status) answers 503 without
	// doing anything.
	unavailable atomic.Bool
	hang        time.Duration // upper bound of a hang

	mu       sync.Mutex
	byKey    map[string]string // key → charge id
	perOrder map[string]int    // order → charges applied
	posts    map[string]int    // key → charge requests seen
	calls    map[string][]call // key → calls in order
	nextID   int
}

type chargeReq struct {
	Order  string `json:"order"`
	Amount int    `json:"amount"`
}

func newProvider(t *testing.T, m mode) *provider {
	t.Helper()
	p := &provider{byKey: map[string]string{}, perOrder: map[string]int{}, posts: map[string]int{}, calls: map[string][]call{}, hang: 5 * time.Second}
	p.mode.Store(int32(m))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", p.charge)
	mux.HandleFunc("GET /charges", p.status)
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *provider) record(key string, c call) {
	p.calls[key] = append(p.calls[key], c)
}

// apply charges the order under key (or replays the charge), under p.mu.
func (p *provider) apply(key, order string) (id string, replayed bool) {
	if id, ok := p.byKey[key]; ok && key != "" {
		return id, true
	}
	p.nextID++
	id = fmt.Sprintf("ch_%06d", p.nextID)
	if key != "" {
		p.byKey[key] = id
	}
	p.perOrder[order]++
	return id, false
}

func (p *provider) charge(w http.ResponseWriter, r *http.Request) {
	if p.unavailable.Load() {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(r.Body)
	var req chargeReq
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || req.Order == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.posts[key]++
	first := p.posts[key] == 1 || key == "" // keyless clients get the fault every time
	m := mode(p.mode.Load())
	if !first {
		m = modeNormal
	}
	if m == modeTimeoutBeforeApply {
		p.record(key, call{"charge", "not_applied"})
		p.mu.Unlock()
		p.wait(r)
		return
	}
	id, replayed := p.apply(key, req.Order)
	res := "applied"
	if replayed {
		res = "replayed"
	}
	p.record(key, call{"charge", res})
	p.mu.Unlock()
	switch m {
	case modeDropAfterApply:
		hj, ok := w.(http.Hijacker)
		if !ok {
			panic("provider: no hijacker")
		}
		conn, _, err := hj.Hijack()
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // reset, not a clean close
			}
			_ = conn.Close()
		}
		return
	case mode503AfterApply:
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	case modeTimeoutAfterApply:
		p.wait(r)
		return
	}
	w.Header().Set("X-Charge-Id", id)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
}

func (p *provider) wait(r *http.Request) {
	t := time.NewTimer(p.hang)
	defer t.Stop()
	select {
	case <-r.Context().Done():
	case <-t.C:
	}
}

func (p *provider) status(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	if p.unavailable.Load() {
		p.mu.Lock()
		p.record(key, call{"status", "unavailable"})
		p.mu.Unlock()
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	p.mu.Lock()
	id, ok := p.byKey[key]
	if ok {
		p.record(key, call{"status", "found"})
	} else {
		p.record(key, call{"status", "not_found"})
	}
	p.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("X-Charge-Id", id)
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":%q}`, id)
}

// blindRetries returns the keys whose charge was re-sent without a status
// query answered "not found" in between: the G5 violation.
func (p *provider) blindRetries() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var bad []string
	for key, cs := range p.calls {
		mayCharge := true
		for _, c := range cs {
			switch {
			case c.kind == "charge" && !mayCharge:
				bad = append(bad, key)
			case c.kind == "charge":
				mayCharge = false
			case c.kind == "status" && c.result == "not_found":
				mayCharge = true
			}
		}
	}
	return bad
}

// chargesPerOrder returns a copy of the per-order charge counts.
func (p *provider) chargesPerOrder() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.perOrder))
	for k, v := range p.perOrder {
		out[k] = v
	}
	return out
}

func (p *provider) postsFor(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.posts[key]
}

func (p *provider) statusQueries() (n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cs := range p.calls {
		for _, c := range cs {
			if c.kind == "status" {
				n++
			}
		}
	}
	return n
}
