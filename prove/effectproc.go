package prove

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/effect/effecthttp"
)

// The effect-worker-sigkill scenario runs package effect's worker in a
// subprocess (`ferry prove worker`, role "effects") that the parent
// SIGKILLs and restarts. The fake provider stays in the parent — its books
// are the ground truth — and is reached over loopback HTTP through
// package effecthttp, the executor and reconciler Ferry ships for HTTP
// APIs. The ledger is the scenario's database, which the subprocess opens
// itself (SQLite in WAL mode across processes, or the Postgres schema).

// Provider HTTP protocol (prove's own, not a real provider's):
//
//	POST /charges   Idempotency-Key, X-Prove-Event, X-Prove-Worker headers → 200, X-Charge-Id
//	GET  /charges?key=K                                                    → 200 (charged) | 404
//
// X-Prove-Deadline carries the call's deadline (Unix nanoseconds): the
// provider never applies a charge after it. A provider that does not
// deduplicate by key must make that promise, or a request delayed on its
// way could land after a status query answered "not found" and the intent
// was executed again. The worker queries status only once the attempt's
// lease, which ends well after the call's deadline, has run out.
const (
	hdrProveEvent    = "X-Prove-Event"
	hdrProveWorker   = "X-Prove-Worker"
	hdrProveDeadline = "X-Prove-Deadline"
	hdrChargeID      = "X-Charge-Id"
)

// providerDelay is how long the provider holds a charge's response after
// applying the charge: the window in which a dead worker leaves the
// provider charged and the ledger uninformed. A kill aimed at the window
// lands in it; the delay stays well under the worker's call timeout.
const providerDelay = 40 * time.Millisecond

// effectTiming is the timing of package effect's worker in every scenario,
// in process or as a subprocess. The lease must cover, with slack, the
// wait of a claimed intent for its turn and its start write, then the call:
// under -race on a loaded machine SQLite's single writer made a 400 ms
// lease (with batches of 64 for 16 concurrent calls) expire before most
// starts ("lost the intent before the call"), and a start wait longer than
// (lease − call timeout)/2 means no call (effect.Worker.execute); the demo
// ended with paid orders never charged. So: batches of one turn of the
// target's concurrency, a 3 s lease, a 500 ms call timeout. A dead
// worker's intent is reconciled once its lease runs out, so the lease is
// also how long a crash costs. The breaker's pause is scaled like the
// rest: with the default 5 s cooldown, a breaker opened by calls timed out
// under load held the remaining intents past settle's stall period (CI
// once: external-success-local-failure with no fault fired).
func effectTiming() []effect.WorkerOption {
	return []effect.WorkerOption{
		effect.WithPollInterval(20 * time.Millisecond), effect.WithBatchSize(16), effect.WithTargetConcurrency(16),
		effect.WithLease(3 * time.Second), effect.WithCallTimeout(500 * time.Millisecond),
		effect.WithBackoff(20*time.Millisecond, 200*time.Millisecond),
		effect.WithBreaker(5, 500*time.Millisecond),
	}
}

// providerServer puts the fake provider on loopback HTTP for effect
// workers in other processes.
type providerServer struct {
	p     *fakeProvider
	srv   *http.Server
	url   string
	done  chan struct{}
	delay time.Duration
}

func startProviderServer(p *fakeProvider, delay time.Duration) (*providerServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("prove: provider listen: %w", err)
	}
	s := &providerServer{p: p, url: "http://" + ln.Addr().String(), done: make(chan struct{}), delay: delay}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", s.charge)
	mux.HandleFunc("GET /charges", s.status)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln) // ends with http.ErrServerClosed on close
	}()
	return s, nil
}

func (s *providerServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	<-s.done
}

func (s *providerServer) charge(w http.ResponseWriter, r *http.Request) {
	// Reading the body to its end lets net/http watch the connection, so
	// r.Context() ends when the caller's process dies.
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10)); err != nil {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	ref, ev, worker := r.Header.Get(effecthttp.HeaderIdempotencyKey), r.Header.Get(hdrProveEvent), r.Header.Get(hdrProveWorker)
	if ref == "" || len(ev) < 8 {
		http.Error(w, "Idempotency-Key and X-Prove-Event are required", http.StatusBadRequest)
		return
	}
	var deadline time.Time
	if d, err := strconv.ParseInt(r.Header.Get(hdrProveDeadline), 10, 64); err == nil {
		deadline = time.Unix(0, d)
	}
	p := s.p
	p.mu.Lock()
	if !deadline.IsZero() && time.Now().After(deadline) {
		// The caller has given up on this request: never apply it late.
		p.late++
		p.mu.Unlock()
		http.Error(w, "deadline passed", http.StatusGatewayTimeout)
		return
	}
	p.calls++
	p.charges[ev]++
	p.byRef[ref] = true
	p.held[worker]++
	p.mu.Unlock()
	var cut bool
	select {
	case <-time.After(s.delay):
	case <-r.Context().Done():
		cut = true // the caller is gone: charged, and nobody will read the answer
	}
	p.mu.Lock()
	if pin := p.pins[worker]; pin != nil && !cut {
		// Pinned by an aimed kill: hold on until it lands (bounded, should
		// the kill never come).
		p.mu.Unlock()
		select {
		case <-r.Context().Done():
			cut = true
		case <-pin:
		case <-time.After(10 * time.Second):
		}
		p.mu.Lock()
	}
	p.held[worker]--
	if cut {
		p.cut[ref] = true
	}
	p.mu.Unlock()
	if cut {
		return
	}
	w.Header().Set(hdrChargeID, "ch_"+ev[:8])
	w.WriteHeader(http.StatusOK)
}

func (s *providerServer) status(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("key")
	if ref == "" {
		http.Error(w, "key is required", http.StatusBadRequest)
		return
	}
	if !s.p.status(ref) {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// pinHeld reports whether the provider holds a charge response for
// worker and, if it does, pins it: the response stays held until the
// worker is gone or unpin is called. Checked and pinned under the lock the
// handler takes before it lets a response go, so a pinned response cannot
// slip out between the check and the kill.
func (p *fakeProvider) pinHeld(worker string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[worker] == 0 {
		return false
	}
	if p.pins[worker] == nil {
		p.pins[worker] = make(chan struct{})
	}
	return true
}

// unpin releases what pinHeld held for worker.
func (p *fakeProvider) unpin(worker string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pin := p.pins[worker]; pin != nil {
		close(pin)
		delete(p.pins, worker)
	}
}

func (p *fakeProvider) chargeCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// runHTTPEffects is the subprocess body (role "effects"): package effect's
// worker with package effecthttp as executor and reconciler, calling the
// parent's provider at providerURL. blindRetry is the broken build the
// scenario must catch: a reconciler that never asks and answers "not
// found", so every unknown outcome is executed again.
func (e *env) runHTTPEffects(ctx context.Context, id, providerURL string, blindRetry bool) error {
	if providerURL == "" {
		return errors.New("prove: effects worker: no provider url")
	}
	l, err := effect.NewLedger(e.db.drv)
	if err != nil {
		return fmt.Errorf("prove: ledger: %w", err)
	}
	build := func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, providerURL+"/charges", bytes.NewReader(in.Request))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(hdrProveEvent, in.EventID.String())
		req.Header.Set(hdrProveWorker, id)
		if d, ok := ctx.Deadline(); ok {
			req.Header.Set(hdrProveDeadline, strconv.FormatInt(d.UnixNano(), 10))
		}
		return req, nil
	}
	client, err := effecthttp.New(build, effecthttp.WithStatusURL(providerURL+"/charges?key={key}"),
		effecthttp.WithOperationIDHeader(hdrChargeID))
	if err != nil {
		return fmt.Errorf("prove: effecthttp: %w", err)
	}
	var rec effect.Reconciler = client
	if blindRetry {
		rec = effect.ReconcilerFunc(func(context.Context, effect.Intent) (effect.Status, error) {
			return effect.Status{Lookup: effect.LookupNotFound}, nil
		})
	}
	w, err := effect.NewWorker(l, client, rec, append(effectTiming(),
		effect.WithWorkerID(id), effect.WithLogger(e.log), effect.WithRegisterer(prometheus.NewRegistry()))...)
	if err != nil {
		return fmt.Errorf("prove: effect worker: %w", err)
	}
	return w.Run(ctx)
}

// effectKill is what the parent saw at one kill of the effect worker.
type effectKill struct {
	inWindow bool // aimed at a held response, and the provider was holding one
	inFlight int  // the dead worker's ledger rows left in_flight
	open     int  // ledger rows not finished at that moment
}

// effectProcs is how many effect worker processes run at once: they
// share the ledger by lease, so a kill of one leaves rows the other (or
// the restarted one) takes over once the lease expires.
const effectProcs = 2

// effectProc is one running effect worker subprocess.
type effectProc struct {
	id     string
	cmd    *exec.Cmd
	exited chan struct{}
}

// effectFleet is the live effect worker subprocess of each slot.
type effectFleet struct {
	mu   sync.Mutex
	live [effectProcs]*effectProc
}

func (f *effectFleet) set(slot int, p, old *effectProc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live[slot] == old {
		f.live[slot] = p
	}
}

func (f *effectFleet) get(slot int) *effectProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.live[slot]
}

// pinHolding returns a live process the provider is holding a charge
// response for, if any, with that response pinned (pinHeld).
func (f *effectFleet) pinHolding(p *fakeProvider) *effectProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.live {
		if w != nil && p.pinHeld(w.id) {
			return w
		}
	}
	return nil
}

// startEffectSigkill runs package effect's worker as effectProcs
// concurrent subprocesses, each restarted whenever it dies, and SIGKILLs
// them sigkillKills times in all. Kills are placed in the effect stream,
// not the clock, so they land while intents are being executed at any
// scale: kill k comes once the provider has taken a seeded number of
// charges (spread over the expected total). Kills 0, 1, 4 and 5 are aimed:
// they hit the first process the provider is holding a response for after
// applying its charge — the window between the provider's success and the
// ledger's record. Kills 2 and 3 hit process k%effectProcs a seeded
// 0–40 ms after their mark. killsDone is closed after the last kill.
func startEffectSigkill(ctx context.Context, wg *sync.WaitGroup, e *env, srv *providerServer, killsDone chan<- struct{}) {
	s1, s2 := seedFor(e.cfg.seed, e.sc.name+"/sigkill")
	rng := rand.New(rand.NewPCG(s1, s2))
	paid := 0
	for _, tx := range e.plan.txs {
		for _, ev := range tx.events {
			if !tx.rollback && ev.kind == "order.paid" && ev.special == specialNone {
				paid++
			}
		}
	}
	// Seeded positions in the charge stream, strictly increasing, all
	// before the last charge so that work remains at every kill.
	marks := make([]int, sigkillKills)
	for i := range marks {
		marks[i] = int((0.05 + 0.8*rng.Float64()) * float64(paid))
	}
	slices.Sort(marks)
	for i := 1; i < len(marks); i++ {
		marks[i] = max(marks[i], marks[i-1]+1)
	}
	jitter := make([]time.Duration, sigkillKills)
	for i := range jitter {
		jitter[i] = time.Duration(rng.Int64N(int64(40 * time.Millisecond)))
	}
	fleet := &effectFleet{}
	for slot := range effectProcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprintf("effects-%d-proc-%d", slot, i)
				job := workerJob{Role: "effects", DatabaseURL: e.db.url, Transport: e.tr.job(), ID: id, ProviderURL: srv.url, Broken: e.cfg.broken}
				raw, _ := json.Marshal(job)
				cmd := exec.Command(e.cfg.worker[0], e.cfg.worker[1:]...)
				cmd.Env = append(os.Environ(), WorkerEnv+"="+string(raw))
				if err := cmd.Start(); err != nil {
					e.rec.err(fmt.Errorf("prove: start worker: %w", err))
					sleepCtx(ctx, 200*time.Millisecond)
					continue
				}
				p := &effectProc{id: id, cmd: cmd, exited: make(chan struct{})}
				go func() { _ = cmd.Wait(); close(p.exited) }()
				fleet.set(slot, p, nil)
				select {
				case <-ctx.Done():
					_ = cmd.Process.Kill()
					<-p.exited
				case <-p.exited: // killed by the kill plan, or died: restart
				}
				fleet.set(slot, nil, p)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(killsDone)
		for k := range sigkillKills {
			target, hit, ok := e.aimEffectKill(ctx, fleet, srv.p, k, marks[k], jitter[k], k%4 < 2)
			if !ok {
				return
			}
			_ = target.cmd.Process.Kill() // SIGKILL: no deferred cleanup, no graceful anything
			<-target.exited
			srv.p.unpin(target.id)
			e.faults.Add(1)
			e.recordEffectKill(ctx, target.id, hit)
		}
	}()
}

// aimWait bounds how long a kill waits for its mark or its window: a
// pipeline that stops producing intents must not hang the scenario (the
// kill then happens anyway, outside the window, and the checks say so).
const aimWait = 5 * time.Second

// aimEffectKill waits until the provider has taken mark charges, then —
// aimed — until it holds a response for one of the live processes, or
// for the jitter. It returns the process to kill, whether the kill lands
// in the window, and false for ok when ctx ended first.
func (e *env) aimEffectKill(ctx context.Context, fleet *effectFleet, p *fakeProvider, k, mark int, jitter time.Duration, aimed bool) (_ *effectProc, hit, ok bool) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(aimWait)
	wait := func(cond func() bool) bool {
		for !cond() && time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return false
			case <-tick.C:
			}
		}
		return ctx.Err() == nil
	}
	if !wait(func() bool { return p.chargeCalls() >= mark }) {
		return nil, false, false
	}
	if aimed {
		var target *effectProc
		if !wait(func() bool { target = fleet.pinHolding(p); return target != nil }) {
			return nil, false, false
		}
		if target != nil {
			return target, true, true
		}
	} else {
		sleepCtx(ctx, jitter)
	}
	// Not aimed, or no window opened in time: the slot's process.
	slot := k % effectProcs
	var target *effectProc
	deadline = time.Now().Add(aimWait)
	if !wait(func() bool { target = fleet.get(slot); return target != nil }) || target == nil {
		return nil, false, false
	}
	return target, false, true
}

// recordEffectKill reads, from the ledger, what the dead worker left.
func (e *env) recordEffectKill(ctx context.Context, id string, inWindow bool) {
	k := effectKill{inWindow: inWindow}
	ex := e.db.drv.Executor()
	count := func(q string, dst *int, args ...any) {
		rows, err := ex.Query(ctx, q, args...)
		if err != nil {
			e.rec.err(fmt.Errorf("prove: ledger after kill: %w", err))
			return
		}
		defer rows.Close()
		if rows.Next() {
			_ = rows.Scan(dst)
		}
	}
	count(`SELECT COUNT(*) FROM ferry_effects WHERE state = 'in_flight' AND lease_owner LIKE $1`, &k.inFlight, id+"/%")
	count(`SELECT COUNT(*) FROM ferry_effects WHERE state NOT IN ('succeeded', 'failed')`, &k.open)
	e.effectKillsMu.Lock()
	e.effectKills = append(e.effectKills, k)
	e.effectKillsMu.Unlock()
	e.log.DebugContext(ctx, "prove: effect worker killed", slog.String("worker", id), slog.Bool("in_window", inWindow),
		slog.Int("in_flight", k.inFlight), slog.Int("open", k.open))
}

// ledgerEffect is one effect-ledger row at the end of a run.
type ledgerEffect struct {
	key, eventID, state string
	reconciliations     int
}

// checkEffectSigkill is the scenario's own checker, from the provider's
// books and the ledger: every intent succeeded, exactly one charge per
// paid order, at least one kill between a charge and its ledger record,
// and every such charge resolved by a status query that found it — not
// by a second charge.
func checkEffectSigkill(e *env, f *Figures, t *truth) []string {
	var v []string
	if f.FaultsInjected != sigkillKills {
		v = append(v, fmt.Sprintf("%d kills, want %d", f.FaultsInjected, sigkillKills))
	}
	e.effectKillsMu.Lock()
	kills := append([]effectKill(nil), e.effectKills...)
	e.effectKillsMu.Unlock()
	aimed, busy := 0, 0
	for _, k := range kills {
		if k.inWindow {
			aimed++
		}
		if k.open > 0 {
			busy++
		}
	}

	// Ledger: every intent ends succeeded; one row per paid, committed event.
	rows := map[string]ledgerEffect{}
	reconciled := 0
	unfinished := map[string]int{} // state -> intents that did not end succeeded
	for _, r := range t.effects {
		rows[r.eventID] = r
		if r.state != string(effect.StateSucceeded) {
			unfinished[r.state]++
		}
		if r.reconciliations > 0 {
			reconciled++
		}
	}
	if len(unfinished) > 0 {
		v = append(v, fmt.Sprintf("intents not ended succeeded, by state: %v", unfinished))
	}
	// Provider's books: exactly one charge per paid, committed order.
	e.provider.mu.Lock()
	charges := map[string]int{}
	for id, n := range e.provider.charges {
		charges[id] = n
	}
	cut := map[string]bool{}
	for ref := range e.provider.cut {
		cut[ref] = true
	}
	found := map[string]int{}
	for ref, n := range e.provider.found {
		found[ref] = n
	}
	late := e.provider.late
	e.provider.mu.Unlock()
	// A paid order never charged is the checker's missing effects.
	paid, noRow := 0, 0
	for id, ev := range e.plan.events {
		if ev.kind != "order.paid" || ev.special != specialNone || !t.business[id] {
			continue
		}
		paid++
		if _, ok := rows[id]; !ok {
			noRow++
		}
	}
	if noRow > 0 {
		v = append(v, fmt.Sprintf("%d paid orders without a ledger intent", noRow))
	}
	// The window: charges applied whose response no worker read.
	byKey := map[string]ledgerEffect{}
	for _, r := range t.effects {
		byKey[r.key] = r
	}
	unresolved := 0
	for ref := range cut {
		r, ok := byKey[ref]
		if found[ref] == 0 || !ok || r.state != string(effect.StateSucceeded) || r.reconciliations == 0 {
			unresolved++
		}
	}
	f.ChargesResponseLost = len(cut)
	f.ReconciledFound = len(found)
	if len(cut) == 0 {
		v = append(v, "no kill landed between a provider charge and its ledger record: the dangerous window was not exercised")
	}
	if unresolved > 0 {
		v = append(v, fmt.Sprintf("%d charges whose response was lost were not resolved by a status query that found them", unresolved))
	}
	if f.Reconciliations == 0 {
		v = append(v, "no reconciliation ran")
	}
	e.extraNote = fmt.Sprintf("%d paid orders, %d kills (%d aimed at a held response; %d with intents open; in flight at the dead worker: %v); "+
		"%d charges applied with the response never read, %d intents found charged by a status query, %d ledger rows reconciled, "+
		"%d charge requests refused as arriving after their call's deadline",
		paid, len(kills), aimed, busy, inFlightList(kills), len(cut), len(found), reconciled, late)
	return v
}

func inFlightList(kills []effectKill) []int {
	out := make([]int, len(kills))
	for i, k := range kills {
		out[i] = k.inFlight
	}
	return out
}
