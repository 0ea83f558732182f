package prove

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/faultproxy"
)

// SoakOptions shape a bounded soak (RunSoak): how long the producers run,
// how often a row of figures is taken, how often a fault fires and the
// producers' steady rate.
type SoakOptions struct {
	// Period is how long the producers commit (`--soak`), 10s..24h.
	Period time.Duration
	// Interval is one row of figures (`--soak-interval`), 1s..Period.
	// Default 1m (or Period, when shorter).
	Interval time.Duration
	// FaultEvery is the gap from the end of one fault to the start of the
	// next (`--soak-fault-every`), 1s..Period; faults stop with the producers. Default 30s (or Period/4, when shorter).
	FaultEvery time.Duration
	// Rate is the producers' steady rate in transactions per second
	// across all producers (`--soak-rate`), 1..10000. Default 20.
	Rate int
}

// Soak fault kinds, fired in turn on the schedule.
const (
	soakRelayKill   = "relay-sigkill"    // relay-b (a subprocess) SIGKILLed, restarted
	soakInboxKill   = "inbox-sigkill"    // the consumer subprocess SIGKILLed, restarted
	soakRelayPause  = "relay-sigstop"    // relay-a SIGSTOPped past its lease, then SIGCONT: its late marks are fenced
	soakOutage      = "broker-outage"    // the relays' broker connections black-holed, then reset
	soakClusterKill = "nats-leader-kill" // --broker nats-cluster: the stream leader's server shut down and restarted
	soakClusterCut  = "nats-partition"   // --broker nats-cluster: the stream leader cut off from the other nodes, healed
	// The broker faults of brokerfaults.go, by their scenario names:
	// kafkaLeaderMove and kafkaBrokerDown on kafka://kfake,
	// rabbitConnDrop and rabbitChannelClose on amqp://.
)

// SoakReport is the outcome of RunSoak.
type SoakReport struct {
	Stack      string        `json:"stack"`
	Seed       int64         `json:"seed"`
	Period     time.Duration `json:"period_ns"`
	Interval   time.Duration `json:"interval_ns"`
	FaultEvery time.Duration `json:"fault_every_ns"`
	Rate       int           `json:"rate_tx_per_s"`
	// Rows: one per interval, producing then settling.
	Rows []SoakRow `json:"rows"`
	// Faults: every fault fired, in order.
	Faults []SoakFault `json:"faults"`
	// FaultsByKind: how many times each kind of the rotation fired (0:
	// in the rotation, never reached before the period ended).
	FaultsByKind map[string]int `json:"faults_by_kind"`
	// Processes: every Ferry process, sampled after the first interval and
	// at the end (after settling, before stopping).
	Processes []SoakProcess `json:"processes"`
	// Findings: growth between the two samples, stated plainly. They do
	// not fail the soak; the checker's verdict does.
	Findings []string `json:"findings,omitempty"`
	// Result is the checker's verdict over the whole soak: the same
	// checker, figures and classes as every scenario.
	Result  Result        `json:"result"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// SoakRow is one interval's figures, from ground truth: committed (the
// business table), published (distinct event ids the broker stored),
// applied (distinct event ids in the consumer's applied log); per interval
// and in total. LagP99 is the relay lag (occurred_at to the broker's
// stored time) of the events the broker first stored in the interval,
// computed after the soak; 0 where the broker keeps no time (RabbitMQ).
type SoakRow struct {
	At             time.Duration `json:"at_ns"`
	Phase          string        `json:"phase"` // "producing" or "settling"
	Committed      int           `json:"committed"`
	Published      int           `json:"published"`
	Applied        int           `json:"applied"`
	CommittedTotal int           `json:"committed_total"`
	PublishedTotal int           `json:"published_total"`
	AppliedTotal   int           `json:"applied_total"`
	LagP99         time.Duration `json:"lag_p99_ns"`
	Faults         []string      `json:"faults,omitempty"`
	// Note: a figure could not be read this time (the broker was
	// unreachable mid-outage); the previous total is repeated.
	Note string `json:"note,omitempty"`
}

// SoakFault is one fault fired.
type SoakFault struct {
	At   time.Duration `json:"at_ns"`
	Kind string        `json:"kind"`
	Note string        `json:"note,omitempty"`
}

// SoakProcess is one Ferry process's resources at the two samples.
type SoakProcess struct {
	Name string `json:"name"`
	// Runs says what the process hosts.
	Runs     string     `json:"runs"`
	Start    ProcSample `json:"start"`
	End      ProcSample `json:"end"`
	Restarts int        `json:"restarts"`
}

// ProcSample is a process's resident memory (VmRSS, /proc; 0 where there
// is no /proc), goroutine count and Go heap (0: not known).
type ProcSample struct {
	At         time.Duration `json:"at_ns"`
	PID        int           `json:"pid"`
	RSSKiB     int64         `json:"rss_kib"`
	Goroutines int           `json:"goroutines"`
	// HeapKiB is the Go heap in use (runtime.MemStats.HeapInuse): RSS
	// growth with a flat heap is the allocator or the OS, not live data.
	HeapKiB int64 `json:"heap_kib"`
}

// Failed reports whether the soak must exit non-zero: the checker found a
// violation, or the soak could not be carried out.
func (r *SoakReport) Failed() bool { return r.Result.Status != StatusPass }

func (o *SoakOptions) defaults() error {
	bad := func(flag, reason string) error { return fmt.Errorf("%w: %s %s", ErrInvalidConfig, flag, reason) }
	if o.Period < 10*time.Second || o.Period > 24*time.Hour {
		return bad("soak", fmt.Sprintf("must be in 10s..24h, got %s", o.Period))
	}
	if o.Interval == 0 {
		o.Interval = min(time.Minute, o.Period)
	}
	if o.FaultEvery == 0 {
		o.FaultEvery = min(30*time.Second, o.Period/4)
	}
	if o.Rate == 0 {
		o.Rate = 20
	}
	switch {
	case o.Interval < time.Second || o.Interval > o.Period:
		return bad("soak-interval", fmt.Sprintf("must be in 1s..%s (the soak period), got %s", o.Period, o.Interval))
	case o.FaultEvery < time.Second || o.FaultEvery > o.Period:
		return bad("soak-fault-every", fmt.Sprintf("must be in 1s..%s (the soak period), got %s", o.Period, o.FaultEvery))
	case o.Rate < 1 || o.Rate > 10000:
		return bad("soak-rate", fmt.Sprintf("must be in 1..10000 transactions per second, got %d", o.Rate))
	}
	return nil
}

// soakStatusEvery is how often a worker subprocess rewrites its status
// file (pid and goroutine count).
const soakStatusEvery = 500 * time.Millisecond

// RunSoak runs one long pipeline on the stack the options select (the same
// stacks as Run): producers commit at a steady rate for so.Period while
// faults fire every so.FaultEvery, in turn — a relay subprocess SIGKILLed,
// the consumer subprocess SIGKILLed, the other relay subprocess frozen past
// its lease (unix), the relays' broker connections black-holed (not on the
// NATS cluster), then the broker faults of the stack, with the scenarios'
// mechanisms: on the NATS cluster the stream leader shut down and the
// leader partitioned; on kfake partition leaders moved and a broker taken
// away; on RabbitMQ the relay's connection dropped and its channel closed
// — then it settles and runs the scenarios' checker over everything
// committed. WithEvents and
// WithScenarios do not apply: the workload is Rate × Period transactions.
// It needs a worker command (WithWorkerCommand): relays and consumer are
// subprocesses so their memory and goroutines can be measured apart.
func RunSoak(ctx context.Context, so SoakOptions, opts ...Option) (*SoakReport, error) {
	if err := so.defaults(); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if len(cfg.worker) == 0 {
		return nil, fmt.Errorf("%w: soak needs a worker command (run through `ferry prove --soak`, or pass WithWorkerCommand)", ErrInvalidConfig)
	}
	txs := int(math.Ceil(so.Period.Seconds() * float64(so.Rate)))
	// The generator plans by events (1.17 per transaction on average);
	// plan enough, then keep exactly txs transactions.
	cfg.events = min(1_000_000, max(10, txs*2))
	start := time.Now()
	st, err := openStack(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer st.close()
	rep := &SoakReport{Stack: st.describe(), Seed: cfg.seed, Period: so.Period, Interval: so.Interval, FaultEvery: so.FaultEvery, Rate: so.Rate}
	res, err := runSoak(ctx, &cfg, st, so, txs, rep)
	rep.Elapsed = time.Since(start)
	if err != nil {
		res.Status, res.Note = StatusError, err.Error()
	}
	rep.Result = res
	return rep, nil
}

func runSoak(ctx context.Context, cfg *config, st *stack, so SoakOptions, txs int, rep *SoakReport) (Result, error) {
	sc := &scenario{name: "soak", desc: fmt.Sprintf("steady producers (%d tx/s) for %s, a fault every %s", so.Rate, so.Period, so.FaultEvery),
		plan: planOptions{rollbackRate: 0.05}, sigkill: true, sigkillInbox: true}
	res := Result{Scenario: sc.name, Description: sc.desc}
	prog := newProgress(cfg.progress)
	defer prog.done()
	prog.scenario(1, 1, "soak")
	db, err := st.newDatabase(ctx, sc.name)
	if err != nil {
		return res, err
	}
	defer db.close()
	p, err := newPlan(cfg, sc.name, sc.plan)
	if err != nil {
		return res, err
	}
	if len(p.txs) > txs {
		for _, tx := range p.txs[txs:] {
			for _, ev := range tx.events {
				delete(p.events, ev.id)
			}
		}
		p.txs = p.txs[:txs]
	}
	tr, err := st.newTransport(ctx, sc.name, cfg)
	if err != nil {
		return res, err
	}
	defer tr.destroy(context.WithoutCancel(ctx))
	w, err := db.writer(tr.topicTemplate())
	if err != nil {
		return res, err
	}
	e := &env{cfg: cfg, sc: sc, st: st, db: db, w: w, plan: p, log: cfg.logger, sentWatermark: cfg.sentWatermark, shardPipeline: cfg.shardPipeline,
		reg: prometheus.NewRegistry(), rec: newRecorder(), provider: newFakeProvider(), prog: prog, tr: tr, realInbox: true}
	e.metrics = newMetrics(e.reg)
	for _, pr := range []string{"user:clerk", "user:mallory"} {
		if _, err := db.drv.Executor().Exec(ctx, `INSERT INTO prove_policy (principal, action, allowed) VALUES ($1, '*', 1)`, pr); err != nil {
			return res, fmt.Errorf("prove: policy: %w", err)
		}
	}

	// The broker fault: a proxy in front of the broker for the relays'
	// connections (kfake: the stack's own proxy, in front of everyone), or
	// the cluster's leader kill.
	kinds := []string{soakRelayKill, soakInboxKill}
	if canStop {
		kinds = append(kinds, soakRelayPause)
	}
	relayJob := tr.job()
	var proxy faultSwitch
	switch {
	case st.cluster != nil:
		kinds = append(kinds, soakClusterKill, soakClusterCut)
	case st.kfake != nil:
		proxy = st.kfake
		defer proxy.Set(faultproxy.Pass)
	case tr.endpoint() != "":
		p, err := faultproxy.New(tr.endpoint())
		if err != nil {
			return res, err
		}
		defer p.Close()
		proxy = p
		u, err := url.Parse(relayJob.URL)
		if err != nil {
			return res, fmt.Errorf("prove: broker url: %w", err)
		}
		u.Host = p.Addr()
		relayJob.URL = u.String()
		e.relayProxy = p // rabbitmq-connection-drop drives the same proxy
	}
	if proxy != nil {
		kinds = append(kinds, soakOutage)
	}
	switch {
	case st.kfake != nil:
		kinds = append(kinds, kafkaLeaderMove, kafkaBrokerDown)
	case tr.kind() == "rabbitmq":
		kinds = append(kinds, rabbitConnDrop, rabbitChannelClose)
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	start := time.Now()
	since := func() time.Duration { return time.Since(start).Round(time.Millisecond) }

	job := func(role, name string) workerJob {
		j := workerJob{Role: role, DatabaseURL: db.url, Transport: tr.job(), Reference: cfg.referenceRelay,
			StatusFile: filepath.Join(st.tmp, "soak-"+name+".status"), StatusEvery: soakStatusEvery}
		if role == "relay" {
			j.Transport = relayJob
		}
		return j
	}
	procs := []*soakProc{
		{name: "relay-a", runs: "package relay (subprocess; frozen past its lease on the schedule)", job: job("relay", "relay-a")},
		{name: "relay-b", runs: "package relay (subprocess; SIGKILLed on the schedule)", job: job("relay", "relay-b")},
		{name: "inbox", runs: "package inbox (subprocess; SIGKILLed on the schedule)", job: job("inbox", "inbox")},
	}
	for _, sp := range procs {
		sp.supervise(runCtx, &wg, e)
	}
	// The relays are subprocesses: what their publishers classified
	// (indeterminate, destination missing) reaches prove's recorder
	// through their status files, for the RabbitMQ faults' own checks.
	wg.Add(1)
	go func() { defer wg.Done(); mirrorRelayCounts(runCtx, e.rec, procs[:2]) }()
	supervise(runCtx, &wg, e.log, "effects", e.runRealEffects)

	// Producers at a steady rate: transaction n may not end before
	// start + n/rate.
	var txDone atomic.Int64
	every := time.Second / time.Duration(so.Rate)
	prodCtx, prodStop := context.WithCancel(runCtx)
	defer prodStop()
	prodErr := make(chan error, 1)
	go func() {
		prodErr <- produce(prodCtx, db, w, p, cfg.producers, func() {
			n := txDone.Add(1)
			sleepCtx(prodCtx, time.Until(start.Add(time.Duration(n)*every)))
		})
	}()

	// Faults on the schedule, in turn, while the producers run.
	var faultMu sync.Mutex
	var pending []string // fired since the last row
	record := func(at time.Duration, kind, note string) {
		faultMu.Lock()
		defer faultMu.Unlock()
		rep.Faults = append(rep.Faults, SoakFault{At: at, Kind: kind, Note: note})
		pending = append(pending, kind)
	}
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		at := start.Add(so.FaultEvery)
		for i := 0; at.Before(start.Add(so.Period)); i++ {
			sleepCtx(prodCtx, time.Until(at))
			if prodCtx.Err() != nil {
				return
			}
			kind, began := kinds[i%len(kinds)], since()
			// A fault begun runs to its end (heal, restart, resume) even
			// when the period ends meanwhile: cut short, a cluster fault
			// would report its wait for a new leader as a failure.
			note, err := soakFault(runCtx, e, kind, procs, proxy)
			if err != nil {
				e.rec.err(err)
				note = "failed: " + err.Error()
			}
			record(began, kind, note)
			at = time.Now().Add(so.FaultEvery) // the gap runs from the end of a fault
		}
	}()

	// Rows: one per interval until the producers are done and the
	// pipeline has settled.
	var last SoakRow
	takeRow := func(phase string, final bool) {
		if final && len(rep.Rows) > 0 && since()-last.At < time.Second {
			// A row was just taken; fold what follows into the next.
			return
		}
		row := SoakRow{At: since(), Phase: phase}
		sampleSoak(ctx, e, &row, last)
		faultMu.Lock()
		row.Faults, pending = pending, nil
		faultMu.Unlock()
		rep.Rows = append(rep.Rows, row)
		last = row
		prog.keep(fmt.Sprintf("%s %s: committed %d (+%d), published %d (+%d), applied %d (+%d), faults %d",
			row.At.Round(time.Second), phase, row.CommittedTotal, row.Committed, row.PublishedTotal, row.Published, row.AppliedTotal, row.Applied, e.faults.Load()))
	}
	var startSample bool
	sampleStart := func() {
		if !startSample {
			startSample = true
			for _, sp := range procs {
				sp.start = sp.sample(since())
			}
			runs := "producers, package effect's worker, the fake provider"
			if st.embedded != nil || st.cluster != nil || st.kfake != nil {
				runs += ", the in-process broker"
			}
			rep.Processes = append(rep.Processes, SoakProcess{Name: "prove", Runs: runs, Start: selfSample(since())})
		}
	}
	ticker := time.NewTicker(so.Interval)
	defer ticker.Stop()
	periodEnd := time.After(so.Period)
	var perr error
	prodDone := false
producing:
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-ticker.C:
			takeRow("producing", false)
			sampleStart()
		case <-periodEnd:
			prodStop()
			if !prodDone {
				perr = <-prodErr
			}
			break producing
		case perr = <-prodErr:
			// The plan ran out (the rate was met): wait for the period.
			prodDone = true
			if perr != nil {
				break producing
			}
		}
	}
	// A transaction cut off by the end of the period is not an error (it
	// did not commit, and the checker reads what did).
	if perr != nil && prodCtx.Err() == nil {
		return res, fmt.Errorf("prove: soak workload: %w", perr)
	}
	<-faultsDone
	takeRow("producing", true)
	sampleStart()
	settled := make(chan struct{})
	go func() { defer close(settled); settle(runCtx, e, cfg) }()
settling:
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-ticker.C:
			takeRow("settling", false)
		case <-settled:
			break settling
		}
	}
	takeRow("settling", false) // always: the figures after settling
	for _, sp := range procs {
		rep.Processes = append(rep.Processes, SoakProcess{Name: sp.name, Runs: sp.runs, Start: sp.start, End: sp.sample(since()), Restarts: int(sp.restarts.Load())})
	}
	rep.Processes[0].End = selfSample(since())
	stop()
	wg.Wait()

	t, err := collect(ctx, e)
	if err != nil {
		return res, err
	}
	f, viol := check(e, t)
	soakLag(rep, start, t)
	if f.FaultsInjected == 0 {
		viol = append(viol, "no fault fired during the soak: the schedule did not bite")
	}
	for _, fl := range rep.Faults {
		if strings.HasPrefix(fl.Note, "failed: ") {
			viol = append(viol, fmt.Sprintf("fault %s at %s could not be injected: %s", fl.Kind, fl.At, strings.TrimPrefix(fl.Note, "failed: ")))
		}
	}
	rep.FaultsByKind = map[string]int{}
	for _, k := range kinds {
		rep.FaultsByKind[k] = 0
	}
	for _, fl := range rep.Faults {
		rep.FaultsByKind[fl.Kind]++
	}
	rep.Findings = growthFindings(rep.Processes)
	res.Figures, res.Violations, res.Components = f, viol, e.components()
	res.Elapsed = time.Since(start)
	res.Status = StatusPass
	if len(viol) > 0 {
		res.Status = StatusFail
	}
	return res, nil
}

// soakFault injects one fault of kind and says what it did.
func soakFault(ctx context.Context, e *env, kind string, procs []*soakProc, proxy faultSwitch) (string, error) {
	switch kind {
	case soakRelayKill, soakInboxKill:
		sp := procs[1]
		if kind == soakInboxKill {
			sp = procs[2]
		}
		pid, ok := sp.kill()
		if !ok {
			return "", fmt.Errorf("prove: %s was not running", sp.name)
		}
		e.faults.Add(1)
		return fmt.Sprintf("%s pid %d SIGKILLed", sp.name, pid), nil
	case soakRelayPause:
		sp := procs[0]
		pid, ok := sp.pause()
		if !ok {
			return "", fmt.Errorf("prove: %s was not running", sp.name)
		}
		e.faults.Add(1)
		sleepCtx(ctx, 3*relayTTL)
		sp.resume()
		return fmt.Sprintf("%s pid %d stopped for %s (lease %s), resumed", sp.name, pid, 3*relayTTL, relayTTL), nil
	case soakOutage:
		e.faults.Add(1)
		proxy.Set(faultproxy.Blackhole)
		proxy.ResetAll()
		sleepCtx(ctx, 1500*time.Millisecond)
		proxy.Set(faultproxy.Reset)
		sleepCtx(ctx, 300*time.Millisecond)
		proxy.Set(faultproxy.Pass)
		return "black-holed 1.5s, reset 0.3s, healed", nil
	case soakClusterKill:
		return runClusterFault(ctx, e, clusterLeaderKill)
	case soakClusterCut:
		return runClusterFault(ctx, e, clusterPartition)
	case kafkaLeaderMove, kafkaBrokerDown, rabbitConnDrop, rabbitChannelClose:
		return runBrokerFault(ctx, e, kind)
	}
	return "", fmt.Errorf("prove: unknown soak fault %q", kind)
}

// soakProc is one worker subprocess slot: restarted whenever it exits,
// killed or paused by the fault schedule.
type soakProc struct {
	name, runs string
	job        workerJob
	start      ProcSample
	restarts   atomic.Int64

	mu  sync.Mutex
	cur *os.Process
}

func (sp *soakProc) supervise(ctx context.Context, wg *sync.WaitGroup, e *env) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			j := sp.job
			j.ID = fmt.Sprintf("%s-%d", sp.name, i)
			raw, _ := json.Marshal(j)
			cmd, exited, err := startWorkerProc(e.cfg.worker, string(raw))
			if err != nil {
				e.rec.err(fmt.Errorf("prove: start worker %s: %w", sp.name, err))
				sleepCtx(ctx, 200*time.Millisecond)
				continue
			}
			if i > 0 {
				sp.restarts.Add(1)
			}
			sp.mu.Lock()
			sp.cur = cmd.Process
			sp.mu.Unlock()
			select {
			case <-exited:
			case <-ctx.Done():
				resume(cmd.Process) // a frozen process cannot handle SIGTERM
				terminate(cmd.Process)
				select {
				case <-exited:
				case <-time.After(5 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
			}
			sp.mu.Lock()
			sp.cur = nil
			sp.mu.Unlock()
		}
	}()
}

func (sp *soakProc) proc() *os.Process {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.cur
}

// running waits up to 2 s for the slot's process (it may be restarting).
func (sp *soakProc) running() *os.Process {
	for i := 0; i < 20; i++ {
		if p := sp.proc(); p != nil {
			return p
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sp.proc()
}

func (sp *soakProc) kill() (int, bool) {
	p := sp.running()
	if p == nil {
		return 0, false
	}
	_ = p.Kill()
	return p.Pid, true
}

func (sp *soakProc) pause() (int, bool) {
	p := sp.running()
	if p == nil {
		return 0, false
	}
	pauseProc(p)
	return p.Pid, true
}

func (sp *soakProc) resume() {
	if p := sp.proc(); p != nil {
		resume(p)
	}
}

// sample reads the running process's RSS and the goroutine count it last
// wrote to its status file (a restarting slot is waited for briefly).
func (sp *soakProc) sample(at time.Duration) ProcSample {
	for i := 0; i < 40; i++ {
		if p := sp.proc(); p != nil {
			s := ProcSample{At: at, PID: p.Pid, RSSKiB: readRSS(p.Pid)}
			var ws workerStatus
			if b, err := os.ReadFile(sp.job.StatusFile); err == nil && json.Unmarshal(b, &ws) == nil && ws.PID == p.Pid {
				s.Goroutines, s.HeapKiB = ws.Goroutines, ws.HeapKiB
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if p := sp.proc(); p != nil {
		return ProcSample{At: at, PID: p.Pid, RSSKiB: readRSS(p.Pid)}
	}
	return ProcSample{At: at}
}

// soakPprofDirEnv, when set to a directory, makes each sample of prove's
// own process also write a heap profile there (prove-<at>.heap, after a GC),
// for `go tool pprof -diff_base`. Off by default.
const soakPprofDirEnv = "FERRY_PROVE_PPROF_DIR"

func selfSample(at time.Duration) ProcSample {
	if dir := os.Getenv(soakPprofDirEnv); dir != "" {
		writeHeapProfile(filepath.Join(dir, fmt.Sprintf("prove-%ds.heap", int(at.Seconds()))))
	}
	return ProcSample{At: at, PID: os.Getpid(), RSSKiB: readRSS(os.Getpid()), Goroutines: runtime.NumGoroutine(), HeapKiB: heapKiB()}
}

func heapKiB() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse / 1024)
}

// readRSS returns VmRSS of pid in KiB from /proc, 0 where there is none.
func readRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// workerStatus is what a worker writes to its StatusFile.
type workerStatus struct {
	PID        int   `json:"pid"`
	Goroutines int   `json:"goroutines"`
	HeapKiB    int64 `json:"heap_kib"`
	// PubIndeterminate, PubMissing: the worker's publish results its
	// broker adapter classified indeterminate and destination-missing
	// (recorder.pubIndeterminate, pubMissing), since it started.
	PubIndeterminate int64 `json:"pub_indeterminate,omitempty"`
	PubMissing       int64 `json:"pub_missing,omitempty"`
}

// writeWorkerStatus rewrites path with the process's goroutine count and
// rec's publish counts every `every` until ctx ends (a worker subprocess,
// for the soak).
func writeWorkerStatus(ctx context.Context, path string, every time.Duration, rec *recorder) {
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		b, _ := json.Marshal(workerStatus{PID: os.Getpid(), Goroutines: runtime.NumGoroutine(), HeapKiB: heapKiB(),
			PubIndeterminate: rec.pubIndeterminate.Load(), PubMissing: rec.pubMissing.Load()})
		tmp := path + ".tmp"
		if os.WriteFile(tmp, b, 0o600) == nil {
			_ = os.Rename(tmp, path)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// mirrorRelayCounts adds what the relay subprocesses' status files report
// (publishes left indeterminate or met with a missing destination) to rec,
// so the broker faults that watch for them (rabbitmq-channel-closed waits
// for the relay to hit the closed channel) see the subprocesses' calls.
// A status file is rewritten every soakStatusEvery, so a count reaches rec
// that much later; what a SIGKILLed relay counted after its last write is
// lost with it.
func mirrorRelayCounts(ctx context.Context, rec *recorder, relays []*soakProc) {
	type seen struct {
		pid                    int
		indeterminate, missing int64
	}
	last := make([]seen, len(relays))
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		for i, sp := range relays {
			var ws workerStatus
			b, err := os.ReadFile(sp.job.StatusFile)
			if err != nil || json.Unmarshal(b, &ws) != nil || ws.PID == 0 {
				continue
			}
			if ws.PID != last[i].pid { // a new process counts from zero
				last[i] = seen{pid: ws.PID}
			}
			if d := ws.PubIndeterminate - last[i].indeterminate; d > 0 {
				rec.pubIndeterminate.Add(d)
				last[i].indeterminate = ws.PubIndeterminate
			}
			if d := ws.PubMissing - last[i].missing; d > 0 {
				rec.pubMissing.Add(d)
				last[i].missing = ws.PubMissing
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleSoak fills row's totals from ground truth and the per-interval
// figures from the previous row.
func sampleSoak(ctx context.Context, e *env, row *SoakRow, prev SoakRow) {
	// Read downstream first (applied, then the broker, then committed), so
	// a row never shows more applied than committed.
	ex := e.db.drv.Executor()
	var committed, applied int64
	var notes []string
	if err := countInto(ctx, ex, `SELECT COUNT(DISTINCT event_id) FROM prove_applied`, &applied); err != nil {
		applied = int64(prev.AppliedTotal)
		notes = append(notes, "applied not read: "+err.Error())
	}
	published := prev.PublishedTotal
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	msgs, err := e.tr.readAll(rctx)
	cancel()
	if err != nil {
		notes = append(notes, "broker not read (published repeats the last total): "+err.Error())
	} else {
		ids := map[string]bool{}
		for _, m := range msgs {
			if m.EventID != "" {
				ids[m.EventID] = true
			}
		}
		published = len(ids)
	}
	if err := countInto(ctx, ex, `SELECT COUNT(*) FROM prove_business`, &committed); err != nil {
		committed = int64(prev.CommittedTotal)
		notes = append(notes, "committed not read: "+err.Error())
	}
	row.CommittedTotal, row.AppliedTotal, row.PublishedTotal = int(committed), int(applied), published
	row.Committed = row.CommittedTotal - prev.CommittedTotal
	row.Applied = row.AppliedTotal - prev.AppliedTotal
	row.Published = row.PublishedTotal - prev.PublishedTotal
	row.Note = strings.Join(notes, "; ")
}

// soakLag fills each row's LagP99 from the checker's truth: the events
// the broker first stored between the previous row and this one.
func soakLag(rep *SoakReport, start time.Time, t *truth) {
	first := map[string]time.Time{}
	for _, m := range t.stream {
		if m.EventID == "" || m.Time.IsZero() {
			continue
		}
		if _, ok := first[m.EventID]; !ok {
			first[m.EventID] = m.Time
		}
	}
	lags := make([][]time.Duration, len(rep.Rows))
	for id, ts := range first {
		o, ok := t.outbox[id]
		if !ok {
			continue
		}
		at := ts.Sub(start)
		i := sort.Search(len(rep.Rows), func(i int) bool { return rep.Rows[i].At >= at })
		if i == len(rep.Rows) {
			i--
		}
		if i >= 0 {
			lags[i] = append(lags[i], max(0, ts.Sub(o.occurred)))
		}
	}
	for i, l := range lags {
		if len(l) == 0 {
			continue
		}
		sort.Slice(l, func(a, b int) bool { return l[a] < l[b] })
		rep.Rows[i].LagP99 = l[min(len(l)-1, len(l)*99/100)]
	}
}

// Growth thresholds: what counts as a finding between the two samples.
const (
	growthRSSFactor   = 1.5 // resident memory up by half
	growthGoroutinesN = 10  // goroutines up by more than 10 and by a fifth
)

// growthFindings states each process's growth between the samples, for
// processes that lived through both (a restarted worker's end sample is of
// a younger process, so its growth says nothing).
func growthFindings(ps []SoakProcess) []string {
	var out []string
	for _, p := range ps {
		if p.Start.PID == 0 || p.End.PID == 0 {
			out = append(out, fmt.Sprintf("%s: not sampled at both ends", p.Name))
			continue
		}
		if p.Start.PID != p.End.PID {
			continue
		}
		if p.Start.RSSKiB > 0 && float64(p.End.RSSKiB) > growthRSSFactor*float64(p.Start.RSSKiB) {
			out = append(out, fmt.Sprintf("%s (pid %d): resident memory grew from %d KiB to %d KiB (×%.2f) between %s and %s; Go heap in use %d KiB → %d KiB",
				p.Name, p.End.PID, p.Start.RSSKiB, p.End.RSSKiB, float64(p.End.RSSKiB)/float64(p.Start.RSSKiB), p.Start.At.Round(time.Second), p.End.At.Round(time.Second),
				p.Start.HeapKiB, p.End.HeapKiB))
		}
		if g0, g1 := p.Start.Goroutines, p.End.Goroutines; g0 > 0 && g1-g0 > growthGoroutinesN && g1 > g0+g0/5 {
			out = append(out, fmt.Sprintf("%s (pid %d): goroutines grew from %d to %d between %s and %s", p.Name, p.End.PID, g0, g1, p.Start.At.Round(time.Second), p.End.At.Round(time.Second)))
		}
	}
	return out
}

// keep writes s as a line that stays (a soak row), also on a terminal.
func (p *progress) keep(s string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line(s)
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// writeHeapProfile writes the heap profile to path; a failure is only
// printed, a profile is a diagnostic.
func writeHeapProfile(path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: heap profile: %v\n", err)
		return
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "soak: heap profile: %v\n", err)
	}
}
