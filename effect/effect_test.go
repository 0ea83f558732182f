package effect_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/effect/effecthttp"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

const (
	childEnv         = "FERRY_EFFECT_CRASH_CHILD"
	childPGEnv       = "FERRY_EFFECT_CRASH_PG_URL"
	childProviderEnv = "FERRY_EFFECT_CRASH_PROVIDER_URL"
)

// quiet drops worker logs; tests assert on the ledger and the provider.
var quiet = slog.New(slog.DiscardHandler)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runCrashChild())
	}
	testenv.Announce("effect", testenv.Postgres, testenv.MySQL)
	goleak.VerifyTestMain(m)
}

// ---- harness ----

type order struct {
	ID      string
	EventID uuid.UUID
	Key     string
}

type harness[TTx any] struct {
	drv    driver.Driver[TTx]
	ledger *effect.Ledger[TTx]
}

func newHarness[TTx any](t *testing.T, drv driver.Driver[TTx]) *harness[TTx] {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	ddl := `CREATE TABLE orders (id text PRIMARY KEY, amount integer NOT NULL)`
	if drv.Dialect() == driver.MySQL {
		ddl = `CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, amount integer NOT NULL)`
	}
	if _, err := drv.Executor().Exec(ctx, ddl); err != nil {
		t.Fatalf("create orders: %v", err)
	}
	l, err := effect.NewLedger(drv)
	if err != nil {
		t.Fatal(err)
	}
	return &harness[TTx]{drv: drv, ledger: l}
}

func pgHarness(t *testing.T) *harness[pgx.Tx] {
	return newHarness(t, driver.Driver[pgx.Tx](pgxv5.New(testenv.NewPostgresSchema(t).Pool)))
}

func mysqlHarness(t *testing.T) *harness[*sql.Tx] {
	return newHarness(t, driver.Driver[*sql.Tx](mysql.New(testenv.NewMySQLDatabase(t).DB)))
}

func sqliteHarness(t *testing.T) *harness[*sql.Tx] {
	db, _ := testenv.NewSQLite(t)
	return newHarness(t, driver.Driver[*sql.Tx](sqlite.New(db)))
}

// handle is what a consumer handler does for an "order placed" event: write
// its own row and record the charge as an intent, in one transaction.
func (h *harness[TTx]) handle(ctx context.Context, o order, amount int) (string, error) {
	ttx, tx, err := h.drv.BeginTx(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	insert := `INSERT INTO orders (id, amount) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`
	if h.drv.Dialect() == driver.MySQL {
		insert = `INSERT IGNORE INTO orders (id, amount) VALUES ($1, $2)`
	}
	if _, err := tx.Exec(ctx, insert, o.ID, amount); err != nil {
		return "", err
	}
	body, _ := json.Marshal(map[string]any{"order": o.ID, "amount": amount})
	key, err := h.ledger.RecordTx(ctx, ttx, effect.Intent{Consumer: "billing", EventID: o.EventID, Step: "charge",
		TenantID: "acme", Target: "payments", Operation: "charge", Request: body})
	if err != nil {
		return "", err
	}
	return key, tx.Commit(ctx)
}

func (h *harness[TTx]) placeOrders(t *testing.T, n int) []order {
	t.Helper()
	ctx := context.Background()
	out := make([]order, n)
	for i := range out {
		out[i] = order{ID: fmt.Sprintf("o%05d", i), EventID: uuid.Must(uuid.NewV7())}
		key, err := h.handle(ctx, out[i], 100+i)
		if err != nil {
			t.Fatalf("handle order %d: %v", i, err)
		}
		out[i].Key = key
	}
	return out
}

func httpClient(t *testing.T, p *provider, opts ...effecthttp.Option) *effecthttp.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 128, DialContext: (&net.Dialer{Timeout: time.Second}).DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	base := p.srv.URL
	c, err := effecthttp.New(func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/charges", strings.NewReader(string(in.Request)))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		return req, nil
	}, append([]effecthttp.Option{
		effecthttp.WithHTTPClient(&http.Client{Transport: tr}),
		effecthttp.WithStatusURL(base + "/charges?idempotency_key={key}"),
		effecthttp.WithOperationIDHeader("X-Charge-Id"),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fastOpts suit the fault modes: short timeouts and backoff, and a breaker
// that does not trip (every first call misbehaves, which is not an outage).
func fastOpts() []effect.WorkerOption {
	return []effect.WorkerOption{
		effect.WithCallTimeout(300 * time.Millisecond), effect.WithLease(3 * time.Second),
		effect.WithBackoff(5*time.Millisecond, 100*time.Millisecond), effect.WithPollInterval(20 * time.Millisecond),
		effect.WithTargetConcurrency(64), effect.WithBatchSize(128), effect.WithTargetRate(rate.Inf, 1),
		effect.WithBreaker(1<<30, time.Second), effect.WithMaxAttempts(5), effect.WithLogger(quiet),
	}
}

// runUntilSettled runs w until no intent is pending, in flight or unknown.
func runUntilSettled[TTx any](t *testing.T, h *harness[TTx], w *effect.Worker, limit time.Duration) effect.Stats {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	return waitSettled(t, h, limit)
}

func checkExactlyOnce(t *testing.T, p *provider, orders []order) {
	t.Helper()
	per := p.chargesPerOrder()
	bad := 0
	for _, o := range orders {
		if per[o.ID] != 1 {
			if bad < 5 {
				t.Errorf("order %s charged %d times, want 1", o.ID, per[o.ID])
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d orders not charged exactly once", bad, len(orders))
	}
	if blind := p.blindRetries(); len(blind) > 0 {
		t.Fatalf("%d keys were re-sent without a status query answering not_found first (e.g. %s)", len(blind), blind[0])
	}
}

// ---- fault modes over 1,000 orders ----

func runMode[TTx any](t *testing.T, h *harness[TTx], m mode, n int, extra ...effect.WorkerOption) {
	p := newProvider(t, m)
	orders := h.placeOrders(t, n)
	c := httpClient(t, p)
	reg := prometheus.NewRegistry()
	w, err := effect.NewWorker(h.ledger, c, c, append(append(fastOpts(), effect.WithRegisterer(reg)), extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	st := runUntilSettled(t, h, w, 2*time.Minute)
	t.Logf("mode %s: %d orders settled in %s; status queries %d", m, n, time.Since(start).Round(time.Millisecond), p.statusQueries())
	if st.ByState[effect.StateSucceeded] != int64(n) {
		t.Fatalf("ledger states %v, want all %d succeeded", st.ByState, n)
	}
	checkExactlyOnce(t, p, orders)

	// Per-row evidence: each effect links to its event, has the provider's
	// charge id, and its attempts/reconciliations match the mode.
	wantAttempts, wantRecon := 1, 1
	switch m {
	case modeNormal:
		wantRecon = 0
	case modeTimeoutBeforeApply:
		wantAttempts = 2 // unknown → status: not found → same key again
	}
	ctx := context.Background()
	for i, o := range orders {
		if i%97 != 0 && i != len(orders)-1 {
			continue // sample: the aggregate assertions above cover every order
		}
		recs, err := h.ledger.ByEvent(ctx, o.EventID)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 1 {
			t.Fatalf("order %s: %d ledger rows for its event", o.ID, len(recs))
		}
		r := recs[0]
		// Reconciliations may exceed the minimum on a slow machine (a lease
		// that expires while the outcome is being recorded is reconciled).
		// So may attempts: on a loaded machine an attempt whose start
		// waited too long on the database is recorded but not called
		// (Worker.execute: the lease would not cover the call), and is
		// reconciled and retried with the same key; a call can also fail
		// in the client before the provider reads it. Attempts count the
		// attempts on record, so they may exceed the requests the
		// provider received (checkExactlyOnce above shows the one
		// charge), never fall short of them nor of the mode's.
		posts := p.postsFor(o.Key)
		if r.State != effect.StateSucceeded || r.Key != o.Key || r.Consumer != "billing" || r.EventID != o.EventID ||
			!strings.HasPrefix(r.OperationID, "ch_") || r.CompletedAt.IsZero() || r.Attempts < max(wantAttempts, posts) ||
			posts < 1 || r.Reconciliations < wantRecon {
			t.Fatalf("order %s: record %+v, provider saw %d charge requests; want succeeded, op id ch_…, attempts >= %d and >= the requests, reconciliations >= %d",
				o.ID, r, posts, wantAttempts, wantRecon)
		}
	}
	if m != modeNormal {
		found := sumMetric(t, reg, "ferry_effect_reconciliations_total")
		if found < float64(n) {
			t.Fatalf("reconciliations_total = %v, want >= %d", found, n)
		}
	}
}

// sumMetric sums every series of the counter or gauge family name.
// sumMetric sums the family name's series, only those carrying every
// label of labels (name, value pairs) if any are given.
func sumMetric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func TestFaultModesPostgres(t *testing.T) {
	for _, m := range []mode{modeDropAfterApply, mode503AfterApply, modeTimeoutBeforeApply, modeTimeoutAfterApply} {
		t.Run(m.String(), func(t *testing.T) { runMode(t, pgHarness(t), m, 1000) })
	}
}

func TestFaultModesMySQL(t *testing.T) {
	for _, m := range []mode{modeNormal, modeDropAfterApply, mode503AfterApply, modeTimeoutBeforeApply, modeTimeoutAfterApply} {
		t.Run(m.String(), func(t *testing.T) { runMode(t, mysqlHarness(t), m, 1000) })
	}
}

func TestFaultModesSQLite(t *testing.T) {
	for _, m := range []mode{modeNormal, modeDropAfterApply, mode503AfterApply, modeTimeoutBeforeApply, modeTimeoutAfterApply} {
		// SQLite has one writer at a time: hold fewer intents at once, so
		// outcome writes queue briefly and leases stay comfortably valid.
		t.Run(m.String(), func(t *testing.T) {
			n := 1000
			if raceEnabled {
				n = 200 // the 1,000-order runs are the Postgres ones and this test without -race
			}
			runMode(t, sqliteHarness(t), m, n, effect.WithBatchSize(32), effect.WithLease(10*time.Second))
		})
	}
}

func TestFaultModeDatabaseSQLPostgres(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	h := newHarness(t, driver.Driver[*sql.Tx](databasesql.New(s.OpenSQL(t), driver.Postgres)))
	runMode(t, h, modeDropAfterApply, 300)
}

// ---- negative controls ----

// TestNaiveInlineCallDoubleCharges is the negative control for the whole
// mechanism: the same workload with the call made inline in the handler,
// retried on error, with no ledger and no idempotency key, double-charges.
// It proves checkExactlyOnce can fail.
func TestNaiveInlineCallDoubleCharges(t *testing.T) {
	p := newProvider(t, modeDropAfterApply)
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 300 * time.Millisecond}
	const n = 1000
	orders := make([]order, n)
	for i := range orders {
		orders[i] = order{ID: fmt.Sprintf("o%05d", i), EventID: uuid.Must(uuid.NewV7())}
		body := fmt.Sprintf(`{"order":%q,"amount":%d}`, orders[i].ID, 100+i)
		for attempt := 0; attempt < 3; attempt++ { // "retry on error"
			resp, err := hc.Post(p.srv.URL+"/charges", "application/json", strings.NewReader(body))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode < 300 {
					break
				}
			}
		}
	}
	per := p.chargesPerOrder()
	double := 0
	for _, o := range orders {
		if per[o.ID] > 1 {
			double++
		}
	}
	t.Logf("naive inline call: %d of %d orders charged more than once", double, n)
	if double == 0 {
		t.Fatal("negative control: the naive inline call produced no double charge; the check cannot fail")
	}
}

// TestBlindRetryIsDetected is the negative control for the reconciliation
// check: a worker whose "reconciler" answers not-found without asking (a
// blind retry) is caught by provider.blindRetries.
func TestBlindRetryIsDetected(t *testing.T) {
	h := pgHarness(t)
	p := newProvider(t, modeDropAfterApply)
	orders := h.placeOrders(t, 50)
	c := httpClient(t, p)
	blind := effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) {
		return effect.Status{Lookup: effect.LookupNotFound}, nil
	})
	w, err := effect.NewWorker(h.ledger, c, blind, fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	runUntilSettled(t, h, w, time.Minute)
	if got := len(p.blindRetries()); got != len(orders) {
		t.Fatalf("blind retries detected for %d keys, want %d: the checker cannot fail", got, len(orders))
	}
}

// ---- crash: SIGKILL after the provider applied, before the ledger recorded ----

// runCrashChild is the worker process of TestCrashAfterApplySIGKILL. Its
// fault hook kills the process (SIGKILL, no deferred code, no flush) right
// after the first Execute returned and before the ledger write.
func runCrashChild() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childPGEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	l, err := effect.NewLedger(pgxv5.New(pool))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	base := os.Getenv(childProviderEnv)
	c, err := effecthttp.New(func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodPost, base+"/charges", strings.NewReader(string(in.Request)))
	}, effecthttp.WithStatusURL(base+"/charges?idempotency_key={key}"), effecthttp.WithOperationIDHeader("X-Charge-Id"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	w, err := effect.NewWorker(l, c, c, effect.WithLease(2*time.Second), effect.WithCallTimeout(time.Second), effect.WithLogger(quiet),
		effect.WithFaults(effect.Faults{AfterExecuteBeforeRecord: func(in effect.Intent, res effect.Result, err error) error {
			if err == nil {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // never reached
			}
			return nil
		}}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	for range 100 {
		if _, err := w.Work(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 2
		}
	}
	return 3 // the hook never fired
}

func TestCrashAfterApplySIGKILL(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	h := newHarness(t, driver.Driver[pgx.Tx](pgxv5.New(s.Pool)))
	p := newProvider(t, modeNormal)
	orders := h.placeOrders(t, 20)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashAfterApplySIGKILL$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childPGEnv+"="+s.URL, childProviderEnv+"="+p.srv.URL)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: err %v, want death by SIGKILL; output:\n%s", err, out)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child exit %v, want SIGKILL; output:\n%s", ee, out)
	}

	// The provider applied at least one charge the ledger does not know about.
	ctx := context.Background()
	applied := 0
	var crashed []order
	for _, o := range orders {
		if p.chargesPerOrder()[o.ID] == 1 {
			applied++
			r, _, err := h.ledger.ByKey(ctx, o.Key)
			if err != nil {
				t.Fatal(err)
			}
			if r.State != effect.StateInFlight || r.Attempts != 1 {
				t.Fatalf("order %s charged by the dead worker but ledger says %s/%d attempts; want in_flight/1", o.ID, r.State, r.Attempts)
			}
			crashed = append(crashed, o)
		}
	}
	if applied == 0 {
		t.Fatal("child died before any charge was applied: the scenario did not happen")
	}
	t.Logf("child killed with %d charges applied and unrecorded", applied)

	// Restart: a fresh worker waits out the dead worker's lease, treats the
	// in_flight rows as unknown, reconciles, and finds the charges.
	c := httpClient(t, p)
	w, err := effect.NewWorker(h.ledger, c, c, fastOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	runUntilSettled(t, h, w, time.Minute)
	checkExactlyOnce(t, p, orders)
	for _, o := range crashed {
		r, _, err := h.ledger.ByKey(ctx, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != effect.StateSucceeded || r.Attempts != 1 || r.Reconciliations != 1 || r.OperationID == "" || p.postsFor(o.Key) != 1 {
			t.Fatalf("order %s after restart: %+v, provider posts %d; want succeeded by reconciliation, 1 attempt, 1 post", o.ID, r, p.postsFor(o.Key))
		}
	}
}

// ---- outage: breaker, bounded attempts, nothing lost ----

func TestProviderOutage(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { testProviderOutage(t, runOutage(t, pgHarness(t), true)) })
	t.Run("mysql", func(t *testing.T) { testProviderOutage(t, runOutage(t, mysqlHarness(t), true)) })
}

func testProviderOutage(t *testing.T, res outageResult) {
	if res.succeeded != res.n {
		t.Fatalf("after recovery: %d of %d succeeded (nothing may be lost)", res.succeeded, res.n)
	}
	if res.maxAttempts > res.bound {
		t.Fatalf("an effect used %d attempts, bound %d", res.maxAttempts, res.bound)
	}
	if !strings.Contains(res.transitions, "closed>open") || !strings.Contains(res.transitions, "half_open>closed") {
		t.Fatalf("breaker transitions %q: want it to open and to close again", res.transitions)
	}
	// With the breaker, the outage costs a few probes, not n × attempts.
	if res.outageAttempts > float64(res.n)/2 {
		t.Fatalf("%v attempts during the outage for %d intents: the breaker did not hold calls back", res.outageAttempts, res.n)
	}
	t.Logf("outage with breaker: %v attempts during 3s of outage; max attempts per effect %d; transitions %s",
		res.outageAttempts, res.maxAttempts, res.transitions)
}

// TestProviderOutageWithoutBreaker is the negative control: the same outage
// with the breaker effectively removed turns into a retry storm — many more
// attempts, and intents burn their attempt budget while nothing is sent.
func TestProviderOutageWithoutBreaker(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { testProviderOutageWithoutBreaker(t, runOutage(t, pgHarness(t), false)) })
	t.Run("mysql", func(t *testing.T) { testProviderOutageWithoutBreaker(t, runOutage(t, mysqlHarness(t), false)) })
}

func testProviderOutageWithoutBreaker(t *testing.T, res outageResult) {
	t.Logf("outage without breaker: %v attempts during 3s of outage, %d of %d failed with attempts exhausted",
		res.outageAttempts, res.failed, res.n)
	if res.outageAttempts <= float64(res.n)/2 && res.failed == 0 {
		t.Fatalf("without the breaker the outage cost only %v attempts and lost nothing: the breaker check cannot fail", res.outageAttempts)
	}
}

type outageResult struct {
	n, bound, maxAttempts, succeeded, failed int
	outageAttempts                           float64
	transitions                              string
}

func runOutage[TTx any](t *testing.T, h *harness[TTx], withBreaker bool) outageResult {
	p := newProvider(t, modeNormal)
	const n, maxAttempts = 100, 6
	orders := h.placeOrders(t, n)

	// Connection refused is real: while down, the transport dials a port
	// nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	_ = ln.Close()
	var down sync.Mutex
	refuse := true
	dialer := &net.Dialer{Timeout: time.Second}
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		down.Lock()
		r := refuse
		down.Unlock()
		if r {
			addr = deadAddr
		}
		return dialer.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	c := httpClient(t, p, effecthttp.WithHTTPClient(&http.Client{Transport: tr}))

	threshold := 5
	if !withBreaker {
		threshold = 1 << 30
	}
	var mu sync.Mutex
	var transitions []string
	reg := prometheus.NewRegistry()
	w, err := effect.NewWorker(h.ledger, c, c,
		effect.WithCallTimeout(300*time.Millisecond), effect.WithLease(3*time.Second),
		effect.WithBackoff(10*time.Millisecond, 200*time.Millisecond), effect.WithPollInterval(20*time.Millisecond),
		effect.WithMaxAttempts(maxAttempts), effect.WithBreaker(threshold, 250*time.Millisecond), effect.WithRegisterer(reg), effect.WithLogger(quiet),
		effect.WithBreakerObserver(func(target string, from, to effect.BreakerState) {
			mu.Lock()
			transitions = append(transitions, from.String()+">"+to.String())
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	time.Sleep(1500 * time.Millisecond) // phase 1: connection refused
	if withBreaker && w.BreakerState("payments") == effect.BreakerClosed {
		t.Errorf("breaker closed during a refused-connection outage")
	}
	down.Lock()
	refuse = false
	down.Unlock()
	p.unavailable.Store(true) // phase 2: 503 on charges and on status queries
	time.Sleep(1500 * time.Millisecond)
	outageAttempts := sumMetric(t, reg, "ferry_effect_attempts_total")
	p.unavailable.Store(false) // recovery
	cancel()
	<-done

	st := runUntilSettled(t, h, w, time.Minute)
	res := outageResult{n: n, bound: maxAttempts, outageAttempts: outageAttempts,
		succeeded: int(st.ByState[effect.StateSucceeded]), failed: int(st.ByState[effect.StateFailed])}
	if blind := p.blindRetries(); len(blind) > 0 {
		t.Fatalf("%d keys re-sent without a status query answering not_found first", len(blind))
	}
	per := p.chargesPerOrder()
	ctx = context.Background()
	for _, o := range orders {
		if per[o.ID] > 1 {
			t.Fatalf("order %s charged %d times", o.ID, per[o.ID])
		}
		r, _, err := h.ledger.ByKey(ctx, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		res.maxAttempts = max(res.maxAttempts, r.Attempts)
	}
	mu.Lock()
	res.transitions = strings.Join(transitions, " ")
	mu.Unlock()
	return res
}

// ---- ledger API ----

func TestRecordIsIdempotent(t *testing.T) {
	for name, h := range map[string]interface {
		handle(context.Context, order, int) (string, error)
	}{"postgres": pgHarness(t), "mysql": mysqlHarness(t), "sqlite": sqliteHarness(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			o := order{ID: "o1", EventID: uuid.Must(uuid.NewV7())}
			k1, err := h.handle(ctx, o, 100)
			if err != nil {
				t.Fatal(err)
			}
			k2, err := h.handle(ctx, o, 100) // redelivered handler
			if err != nil || k2 != k1 || k1 != effect.Key("billing", o.EventID, "charge") {
				t.Fatalf("second record: %q %v; want the same key %q", k2, err, k1)
			}
			_, err = h.handle(ctx, o, 999) // same step, another request
			var ce *effect.IntentConflictError
			if !errors.Is(err, effect.ErrIntentConflict) || !errors.As(err, &ce) || ce.Key != k1 {
				t.Fatalf("conflicting record: %v, want ErrIntentConflict naming %s", err, k1)
			}
		})
	}
}

func TestKeyFormula(t *testing.T) {
	ev := uuid.MustParse("01890f4e-7d1c-7cc0-8a3b-6c2f1e0b9a55")
	k := effect.Key("billing", ev, "charge")
	// Golden value: the formula is part of the contract (providers store
	// these keys), so a change must be deliberate.
	const want = "fx1_"
	if !strings.HasPrefix(k, want) || len(k) != 68 {
		t.Fatalf("key %q: want fx1_ + 64 hex", k)
	}
	if k != effect.Key("billing", ev, "charge") || k == effect.Key("billing", ev, "email") || k == effect.Key("billing2", ev, "charge") {
		t.Fatal("key not deterministic or not distinct")
	}
	if k != goldenKey {
		t.Fatalf("key formula changed: %s, golden %s", k, goldenKey)
	}
}

// goldenKey was computed independently of the Go code (Python hashlib over the documented formula).
const goldenKey = "fx1_dfaa16b90193933900bac728624d7c169fec193f262e92b69b99a5967f53cf4a"

func TestIntentValidation(t *testing.T) {
	h := sqliteHarness(t)
	ctx := context.Background()
	cases := []struct {
		in    effect.Intent
		field string
	}{
		{effect.Intent{EventID: uuid.New(), Step: "s", Target: "t", Operation: "o"}, "consumer"},
		{effect.Intent{Consumer: "c", Step: "s", Target: "t", Operation: "o"}, "event_id"},
		{effect.Intent{Consumer: "c", EventID: uuid.New(), Step: "s", Target: "t", Operation: "o", Request: make([]byte, effect.MaxRequestBytes+1)}, "request"},
		{effect.Intent{Consumer: "c\x00", EventID: uuid.New(), Step: "s", Target: "t", Operation: "o"}, "consumer"},
		{effect.Intent{Consumer: "c", EventID: uuid.New(), Step: strings.Repeat("s", 201), Target: "t", Operation: "o"}, "step"},
	}
	for _, c := range cases {
		_, err := h.ledger.Record(ctx, c.in)
		var ie *effect.IntentError
		if !errors.As(err, &ie) || ie.Field != c.field || !errors.Is(err, effect.ErrInvalidIntent) {
			t.Fatalf("%+v: err %v, want IntentError on %s", c.in.Consumer, err, c.field)
		}
	}
}

func TestWorkerConfigRefused(t *testing.T) {
	h := sqliteHarness(t)
	c := effect.ExecutorFunc(func(context.Context, effect.Intent) (effect.Result, error) { return effect.Result{}, nil })
	if _, err := effect.NewWorker(h.ledger, c, nil); !errors.Is(err, ferry.ErrInvalidConfig) {
		t.Fatalf("no reconciler: %v", err)
	}
	r := effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) { return effect.Status{}, nil })
	_, err := effect.NewWorker(h.ledger, c, r, effect.WithLease(time.Second), effect.WithCallTimeout(time.Second))
	if !errors.Is(err, ferry.ErrInvalidConfig) || !strings.Contains(err.Error(), "1s") {
		t.Fatalf("lease < 2×timeout: %v", err)
	}
}

// TestMetricsAndUnknownAge drives one intent to unknown with a provider that
// cannot answer, and checks the documented metric names and the oldest
// unknown age (with an injected clock, so the figure is exact).
func TestMetricsAndUnknownAge(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	l, err := effect.NewLedger(drv, effect.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Record(ctx, effect.Intent{Consumer: "c", EventID: uuid.Must(uuid.NewV7()), Step: "s", Target: "payments", Operation: "charge"}); err != nil {
		t.Fatal(err)
	}
	exec := effect.ExecutorFunc(func(context.Context, effect.Intent) (effect.Result, error) {
		return effect.Result{}, errors.New("read: connection reset by peer")
	})
	rec := effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) {
		return effect.Status{Lookup: effect.LookupUnknown}, nil
	})
	reg := prometheus.NewRegistry()
	w, err := effect.NewWorker(l, exec, rec, effect.WithRegisterer(reg), effect.WithLogger(quiet), effect.WithBackoff(time.Millisecond, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := w.Work(ctx); err != nil || n != 1 {
		t.Fatalf("work: %d %v", n, err)
	}
	// The first status query waits out the attempt's lease (30s).
	advance(31 * time.Second)
	if n, err := w.Work(ctx); err != nil || n != 1 { // reconcile: still unknown
		t.Fatalf("work: %d %v", n, err)
	}
	advance(59 * time.Second)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, want := range []string{"ferry_effect_reconciliations_total", "ferry_effect_attempts_total", "ferry_effect_breaker_state"} {
		if !names[want] {
			t.Errorf("metric %s not exported (have %v)", want, names)
		}
	}
	// The ledger's facts (intents by state, oldest unknown) are exported
	// once, by ops.Collector; the worker does not repeat them.
	for _, gone := range []string{"ferry_effect_intents", "ferry_effect_oldest_unknown_age_seconds"} {
		if names[gone] {
			t.Errorf("metric %s exported by the worker; ops.Collector owns it", gone)
		}
	}
	// One series per breaker state, 1 for the current one.
	for _, mf := range mfs {
		if mf.GetName() != "ferry_effect_breaker_state" {
			continue
		}
		states := map[string]float64{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "state" {
					states[lp.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
		if len(states) != 3 || states["closed"] != 1 || states["open"] != 0 || states["half_open"] != 0 {
			t.Errorf("ferry_effect_breaker_state{target=payments} = %v, want closed 1, open 0, half_open 0", states)
		}
	}
	r, err := l.ByEvent(ctx, uuid.Nil)
	if err != nil || len(r) != 0 {
		t.Fatalf("ByEvent of an unknown event: %v %v", r, err)
	}
	st, err := l.Stats(ctx)
	if err != nil || st.ByState[effect.StateUnknown] != 1 || st.OldestUnknown != 90*time.Second {
		t.Fatalf("stats %+v %v", st, err)
	}
}
