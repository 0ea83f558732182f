package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/effect/effecthttp"
	"github.com/ferryhq/ferry/migrate"
)

// payMode is how the demo's payment provider misbehaves on the first
// charge request of an order.
type payMode int

const (
	payNormal         payMode = iota
	payDropResponse           // charge, then drop the connection before answering
	payTimeoutBefore          // hang past the client's timeout without charging
	payTimeoutAfter           // charge, then hang past the client's timeout
	payModes                  // count
	demoPaymentOrders = 40
)

func (m payMode) String() string {
	return [...]string{"answers normally", "charges, then drops the response", "times out before charging", "charges, then times out"}[m]
}

// demoProvider is a fake payment API that honours Idempotency-Key (a second
// POST with a known key returns the first charge) and keeps its own books,
// which is what the demo checks: charges per order, from the provider's side.
type demoProvider struct {
	mu       sync.Mutex
	byKey    map[string]string // idempotency key → charge id
	perOrder map[string]int    // order → charges actually made
	posts    map[string]int    // key → POSTs received
	statuses int
	notFound map[string]bool    // keys a status query answered "not found" for
	resent   int                // POSTs for a key already seen, after a "not found"
	blind    int                // POSTs for a key already seen, with no "not found" before: blind retries
	mode     map[string]payMode // order → misbehaviour on its first POST
	hang     time.Duration
}

func (p *demoProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	switch r.Method {
	case http.MethodGet: // status query by key (reconciliation)
		key = r.URL.Query().Get("idempotency_key")
		p.mu.Lock()
		p.statuses++
		id, ok := p.byKey[key]
		if !ok {
			p.notFound[key] = true
		}
		p.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Charge-Id", id)
		return
	case http.MethodPost:
	default:
		http.Error(w, "method", http.StatusMethodNotAllowed)
		return
	}
	order := r.URL.Query().Get("order")
	p.mu.Lock()
	p.posts[key]++
	first := p.posts[key] == 1
	if !first {
		if p.notFound[key] {
			p.resent++
			delete(p.notFound, key)
		} else {
			p.blind++
		}
	}
	mode := p.mode[order]
	p.mu.Unlock()
	if first && mode == payTimeoutBefore {
		time.Sleep(p.hang)
		return
	}
	p.mu.Lock()
	id, ok := p.byKey[key]
	if !ok {
		id = fmt.Sprintf("ch_%04d", len(p.byKey)+1)
		p.byKey[key] = id
		p.perOrder[order]++
	}
	p.mu.Unlock()
	if first {
		switch mode {
		case payDropResponse:
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					_ = conn.Close()
					return
				}
			}
		case payTimeoutAfter:
			time.Sleep(p.hang)
			return
		}
	}
	w.Header().Set("X-Charge-Id", id)
	w.WriteHeader(http.StatusCreated)
}

// runPaymentsDemo charges orders through the effect ledger against a
// provider that drops responses and times out, and shows from the
// provider's books that each order was charged exactly once.
func runPaymentsDemo(ctx context.Context, out io.Writer, dir string) error {
	db, err := sqlite.Open(filepath.Join(dir, "payments.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		return err
	}
	p := &demoProvider{byKey: map[string]string{}, perOrder: map[string]int{}, posts: map[string]int{}, notFound: map[string]bool{}, mode: map[string]payMode{}, hang: 600 * time.Millisecond}
	api := httptest.NewServer(p)
	defer api.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()

	ledger, err := effect.NewLedger(drv)
	if err != nil {
		return err
	}
	// What a consumer handler does: record the charge in its transaction.
	for i := range demoPaymentOrders {
		order := fmt.Sprintf("o-%04d", 3000+i)
		p.mode[order] = payMode(i % int(payModes))
		if err := inSQLiteTx(ctx, db, func(tx *sql.Tx) error {
			_, err := ledger.RecordTx(ctx, tx, effect.Intent{Consumer: "billing", EventID: uuid.Must(uuid.NewV7()), Step: "charge",
				TenantID: "acme", Target: "payments", Operation: "charge", Request: fmt.Appendf(nil, `{"order":%q,"amount_cents":4200}`, order)})
			return err
		}); err != nil {
			return err
		}
	}
	payments, err := effecthttp.New(func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		order := string(in.Request)[len(`{"order":"`):]
		order = order[:strings.IndexByte(order, '"')]
		return http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/charges?order="+order, strings.NewReader(string(in.Request)))
	},
		effecthttp.WithHTTPClient(&http.Client{Transport: transport, Timeout: 250 * time.Millisecond}),
		effecthttp.WithStatusURL(api.URL+"/charges?idempotency_key={key}"),
		effecthttp.WithOperationIDHeader("X-Charge-Id"))
	if err != nil {
		return err
	}
	var reconciled int
	var mu sync.Mutex
	countingRec := effect.ReconcilerFunc(func(ctx context.Context, in effect.Intent) (effect.Status, error) {
		mu.Lock()
		reconciled++
		mu.Unlock()
		return payments.Status(ctx, in)
	})
	worker, err := effect.NewWorker(ledger, payments, countingRec,
		effect.WithPollInterval(20*time.Millisecond), effect.WithCallTimeout(time.Second), effect.WithLease(5*time.Second),
		effect.WithBackoff(20*time.Millisecond, 200*time.Millisecond), effect.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  %d orders recorded as payment intents in the consumer's transaction; the provider misbehaves on\n", demoPaymentOrders)
	fmt.Fprintf(out, "  the first request of 3 in 4 orders: it %s, %s, or %s.\n", payDropResponse, payTimeoutBefore, payTimeoutAfter)

	wctx, stop := context.WithTimeout(ctx, 60*time.Second)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- worker.Run(wctx) }()
	var st effect.Stats
	for {
		if st, err = ledger.Stats(ctx); err != nil {
			stop()
			<-done
			return err
		}
		if st.ByState[effect.StateSucceeded] == demoPaymentOrders || wctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil && ctx.Err() == nil {
		return fmt.Errorf("effect worker: %w", err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	maxCharges, posts := 0, 0
	for _, n := range p.perOrder {
		maxCharges = max(maxCharges, n)
	}
	for _, n := range p.posts {
		posts += n
	}
	fmt.Fprintf(out, "\n  provider: %d orders charged, at most %d charge per order; %d charge requests, %d status queries;\n",
		len(p.perOrder), maxCharges, posts, p.statuses)
	fmt.Fprintf(out, "            %d requests re-sent, each after a status query answered \"not found\"; %d blind retries\n", p.resent, p.blind)
	fmt.Fprintf(out, "  ledger:   %d succeeded, %d unknown, %d failed; %d unknown outcomes reconciled by status query before any retry\n",
		st.ByState[effect.StateSucceeded], st.ByState[effect.StateUnknown], st.ByState[effect.StateFailed], reconciled)
	if len(p.perOrder) != demoPaymentOrders || maxCharges != 1 || p.blind != 0 || st.ByState[effect.StateSucceeded] != demoPaymentOrders {
		return fmt.Errorf("demo invariant broken: %d orders charged (want %d), max %d charges per order, %d blind retries, %d succeeded",
			len(p.perOrder), demoPaymentOrders, maxCharges, p.blind, st.ByState[effect.StateSucceeded])
	}
	fmt.Fprintln(out, "  Every order charged exactly once, though 3 in 4 first requests lost their answer or timed out (G5).")
	return nil
}

func inSQLiteTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
