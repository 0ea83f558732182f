package effecthttp_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/effect/effecthttp"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

// keylessProvider is a fake payment provider (we do not ship against a
// payment API) that ignores idempotency keys — every charge request it
// reads is a new charge — and drops the connection after reading each
// charge request, without answering. It remembers the key header only to
// answer status queries (200 + X-Charge-Id when a charge carries that key,
// 404 otherwise). A transport that re-sends a charge on its own double
// charges here, visibly.
type keylessProvider struct {
	srv *httptest.Server

	mu       sync.Mutex
	posts    map[string]int    // key → charge requests read
	byKey    map[string]string // key → charge id of the first charge
	statuses map[string]int    // key → status queries
	next     int
}

func newKeylessProvider(t *testing.T) *keylessProvider {
	t.Helper()
	p := &keylessProvider{posts: map[string]int{}, byKey: map[string]string{}, statuses: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // read the whole request: the charge is applied
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		p.posts[key]++
		p.next++
		if _, ok := p.byKey[key]; !ok {
			p.byKey[key] = fmt.Sprintf("ch_%d", p.next)
		}
		p.mu.Unlock()
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close() // applied, and no answer
		}
	})
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		p.mu.Lock()
		p.statuses[key]++
		id, ok := p.byKey[key]
		p.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Charge-Id", id)
		w.WriteHeader(http.StatusOK)
	})
	// Slow enough that concurrent warm-up requests each open a connection.
	mux.HandleFunc("GET /warm", func(http.ResponseWriter, *http.Request) { time.Sleep(100 * time.Millisecond) })
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *keylessProvider) snapshot() (posts map[string]int, byKey map[string]string, statuses map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cp := func(m map[string]int) map[string]int {
		out := make(map[string]int, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	ids := make(map[string]string, len(p.byKey))
	for k, v := range p.byKey {
		ids[k] = v
	}
	return cp(p.posts), ids, cp(p.statuses)
}

// canonicalKey puts the key back under the canonical header name before
// the transport sees the request: what a client that sets
// Idempotency-Key with Header.Set sends. The negative control.
type canonicalKey struct{ rt http.RoundTripper }

func (c canonicalKey) RoundTrip(r *http.Request) (*http.Response, error) {
	if v := r.Header["idempotency-key"]; len(v) > 0 { // the raw map key effecthttp sets
		r = r.Clone(r.Context())
		delete(r.Header, "idempotency-key")
		r.Header.Set("Idempotency-Key", v[0])
	}
	return c.rt.RoundTrip(r)
}

// warm opens k keep-alive connections to p through hc and leaves them idle,
// so the first k charges go over reused connections: the case where
// net/http re-sends by itself a request it thinks replayable (on a fresh
// connection it never does).
func warm(t *testing.T, hc *http.Client, p *keylessProvider, k int) {
	t.Helper()
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() {
			resp, err := hc.Get(p.srv.URL + "/warm")
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		})
	}
	wg.Wait()
}

// runDroppingProvider records n charge intents in a SQLite ledger and runs
// the effect worker with c against the provider (one call at a time) until
// every intent settled. It returns the ledger records.
func runDroppingProvider(t *testing.T, c *effecthttp.Client, n int) []effect.Record {
	t.Helper()
	ctx := context.Background()
	db, _ := testenv.NewSQLite(t)
	drv := driver.Driver[*sql.Tx](sqlite.New(db))
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	l, err := effect.NewLedger(drv)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		ttx, tx, err := drv.BeginTx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		keys[i], err = l.RecordTx(ctx, ttx, effect.Intent{Consumer: "billing", EventID: uuid.Must(uuid.NewV7()), Step: "charge",
			TenantID: "acme", Target: "payments", Operation: "charge", Request: []byte(fmt.Sprintf(`{"order":"o%d"}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := effect.NewWorker(l, c, c,
		effect.WithCallTimeout(2*time.Second), effect.WithLease(6*time.Second),
		effect.WithBackoff(5*time.Millisecond, 50*time.Millisecond), effect.WithPollInterval(20*time.Millisecond),
		effect.WithTargetConcurrency(1), effect.WithTargetRate(rate.Inf, 1),
		effect.WithBreaker(1<<30, time.Second), effect.WithMaxAttempts(3), effect.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := l.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.ByState[effect.StatePending]+st.ByState[effect.StateInFlight]+st.ByState[effect.StateUnknown] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled after 60s: %v", st.ByState)
		}
		time.Sleep(20 * time.Millisecond)
	}
	recs := make([]effect.Record, n)
	for i, k := range keys {
		r, ok, err := l.ByKey(ctx, k)
		if err != nil || !ok {
			t.Fatalf("ledger row %s: %v %v", k, ok, err)
		}
		recs[i] = r
	}
	return recs
}

// chargeClient POSTs charges to base; reused counts the charges sent over a
// reused keep-alive connection.
func chargeClient(t *testing.T, base string, reused *atomic.Int32, opts ...effecthttp.Option) *effecthttp.Client {
	t.Helper()
	c, err := effecthttp.New(func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
			if ci.Reused {
				reused.Add(1)
			}
		}})
		return http.NewRequestWithContext(ctx, http.MethodPost, base+"/charges", strings.NewReader(string(in.Request)))
	}, append([]effecthttp.Option{effecthttp.WithStatusURL(base + "/charges?key={key}"), effecthttp.WithOperationIDHeader("X-Charge-Id")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDroppedChargeNeverResentByTransport pins what the package doc says,
// with effecthttp's default client (http.DefaultTransport, keep-alives on)
// and the effect worker: against a provider that ignores keys and drops
// the connection after reading every charge request, each charge request
// reaches it exactly once (no transport-level re-send, although the charge
// after the first goes over a reused keep-alive connection), every effect
// goes unknown and is reconciled by a status query to succeeded, with the
// operation id taken from the status response's X-Charge-Id
// (WithOperationIDHeader applies to status responses).
func TestDroppedChargeNeverResentByTransport(t *testing.T) {
	p := newKeylessProvider(t)
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	warm(t, http.DefaultClient, p, 2) // DefaultTransport keeps at most 2 idle connections per host
	const n = 20
	var reused atomic.Int32
	recs := runDroppingProvider(t, chargeClient(t, p.srv.URL, &reused), n)
	if reused.Load() == 0 {
		t.Fatal("no charge went over a reused connection: the test does not exercise the transport's re-send")
	}
	posts, ids, statuses := p.snapshot()
	for _, r := range recs {
		if posts[r.Key] != 1 {
			t.Errorf("intent %s: the provider read %d charge requests, want 1 (transport re-send → double charge)", r.Key, posts[r.Key])
		}
		if r.State != effect.StateSucceeded || r.Reconciliations < 1 || statuses[r.Key] < 1 {
			t.Errorf("intent %s: %s after %d reconciliations, %d status queries; want succeeded through a status query",
				r.Key, r.State, r.Reconciliations, statuses[r.Key])
		}
		if r.OperationID != ids[r.Key] {
			t.Errorf("intent %s: operation id %q, want %q from the status response's X-Charge-Id", r.Key, r.OperationID, ids[r.Key])
		}
	}
	if len(posts) != n {
		t.Fatalf("provider saw charges for %d keys, want %d", len(posts), n)
	}
}

// TestDroppedChargeResentWithCanonicalKey is the negative control: the same
// run with the key under the canonical header name "Idempotency-Key" (the
// name net/http's Transport treats as "replayable") lets the transport
// re-send charges by itself on a reused connection — the provider, which
// ignores keys, charges twice.
func TestDroppedChargeResentWithCanonicalKey(t *testing.T) {
	p := newKeylessProvider(t)
	tr := &http.Transport{} // the DefaultTransport's idle limit: 2 per host
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: canonicalKey{tr}}
	warm(t, hc, p, 2)
	var reused atomic.Int32
	runDroppingProvider(t, chargeClient(t, p.srv.URL, &reused, effecthttp.WithHTTPClient(hc)), 20)
	posts, _, _ := p.snapshot()
	double := 0
	for _, n := range posts {
		if n > 1 {
			double++
		}
	}
	if double == 0 {
		t.Fatalf("negative control: no charge re-sent with the canonical header (%v); the control shows nothing", posts)
	}
	t.Logf("negative control: %d of %d charges re-sent by the transport (%d sent over reused connections)", double, len(posts), reused.Load())
}
