package prove

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/faultproxy"
)

// scenario is one row of the crash matrix: a workload shape, the faults
// it injects, the pipeline (correct or deliberately broken) and any extra
// steps and checks.
type scenario struct {
	name, desc string
	control    bool
	plan       planOptions

	relays        int  // reference relays running concurrently (0: naive producer publishes)
	pauseRelay    bool // one relay stalls past its lease once
	markBeforeAck bool
	nonAtomic     bool
	ackEarly      bool // the reference inbox acks on receipt, before its transaction commits
	inlineEffect  bool
	naive         bool

	revokeBeforeConsume bool // stale authorization: consume only after publish + revocation
	outage              bool
	dbOutage            bool // the relay's database connections go through the fault proxy
	duplicates          int  // forged redeliveries (same event id, new broker msg id)
	collision           bool // forged message reusing an event id with other content
	undecodable         bool // a message that is not a CloudEvent
	cleanup             string
	leakage             bool
	sigkill             bool          // the relay runs as a subprocess, SIGKILLed and restarted
	sigkillInbox        bool          // the consumer runs as a subprocess, SIGKILLed and restarted
	sigkillEffects      bool          // the effect worker runs as a subprocess (provider over HTTP), SIGKILLed and restarted
	cdc                 bool          // publish with package relay/cdc instead of the polling relay
	cdcCurrentWAL       bool          // the CDC control: restart from the current WAL, not the slot
	cdcConfirmEarly     bool          // the CDC control: confirm the LSN before the rows are marked sent
	throttle            time.Duration // pause per producer transaction, to spread the workload over the faults
	clusterFault        string        // --broker nats-cluster: clusterLeaderKill or clusterPartition (cluster.go)
	brokerFault         string        // a Kafka (kfake) or RabbitMQ fault: kafkaLeaderMove, kafkaBrokerDown, rabbitConnDrop, rabbitChannelClose, rabbitNodeKill (brokerfaults.go)
	skew                bool          // each package relay reads a skewed or stepping clock (skew.go)
	dbCrash             bool          // the database is prove's own Postgres server, SIGKILLed and restarted mid-run (dbcrash.go)
	notAvailable        func(*stack, *config) string

	// extra checks after the common ones.
	extra func(*env, *Figures, *truth) []string
}

func allScenarios() []*scenario {
	oneRelay := 1
	return []*scenario{
		{name: "producer-rollback", desc: "deliberate rollbacks: rolled-back events are never published or applied",
			plan: planOptions{rollbackRate: 0.3}, relays: oneRelay},
		{name: "relay-crash-after-publish", desc: "relay crashes after the broker ack, before marking sent; restarts and republishes",
			plan: planOptions{rollbackRate: 0.05, faultRates: map[int]float64{faultRelayCrash: 0.03}}, relays: oneRelay,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.FaultsInjected > 0 && f.DuplicatePublishes == 0 {
					return []string{"relay crashes fired but nothing was republished: the fault did not bite"}
				}
				return nil
			}},
		{name: "consumer-ack-loss", desc: "consumer commits, then crashes before the ack; the redelivery is absorbed",
			plan: planOptions{rollbackRate: 0.05, faultRates: map[int]float64{faultAckLoss: 0.03}}, relays: oneRelay},
		{name: "concurrent-relays", desc: "three relays share the shards by lease; one stalls past its lease and is fenced",
			plan: planOptions{rollbackRate: 0.05}, relays: 3, pauseRelay: true, throttle: 5 * time.Millisecond,
			extra: func(e *env, f *Figures, _ *truth) []string {
				switch {
				case e.stopping && !e.stoppedRelay.Load():
					return []string{"the subprocess relay never froze mid-batch: the fencing case was not exercised"}
				case (e.stopping || e.cfg.referenceRelay) && f.FencedWrites == 0:
					if e.stopping {
						r := e.frozenRelay
						return []string{fmt.Sprintf("the stalled relay's late mark was not fenced (after it resumed the frozen relay made %d publish calls and recorded %d events as sent)", r.PublishCalls, r.Published)}
					}
					return []string{"the stalled relay's late mark was not fenced"}
				}
				return nil
			}},
		{name: "duplicate-delivery", desc: "the broker delivers copies of published events under new message ids",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, duplicates: 25},
		{name: "sequence-gap-reorder", desc: "the consumer sees later events of an aggregate first: park as gap, heal in order",
			plan: planOptions{faultRates: map[int]float64{faultReorder: 0.08}}, relays: oneRelay,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.GapsFound != f.GapsHealed {
					return []string{fmt.Sprintf("%d gaps found, only %d healed", f.GapsFound, f.GapsHealed)}
				}
				return nil
			}},
		{name: "poison-parking", desc: "a handler that always fails parks the message after 3 attempts (dead letter), never drops it",
			plan: planOptions{specials: map[int]int{specialPoison: 4}}, relays: oneRelay},
		{name: "schema-incompatible", desc: "events of an unsupported schema version and a non-CloudEvents message are parked, not applied",
			plan: planOptions{specials: map[int]int{specialSchema: 4}}, relays: oneRelay, undecodable: true,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.ParkedByReason["undecodable"] != 1 {
					return []string{fmt.Sprintf("undecodable message parked %d times, want 1", f.ParkedByReason["undecodable"])}
				}
				return nil
			}},
		{name: "tenant-collision", desc: "tenants share aggregate ids; a forged message reuses an event id with other content",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, collision: true,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.ParkedByReason["collision"] != 1 {
					return []string{fmt.Sprintf("collision parked %d times, want 1", f.ParkedByReason["collision"])}
				}
				return nil
			}},
		{name: "stale-authorization", desc: "a principal is revoked between publish and consume: its events are parked, not applied",
			plan: planOptions{specials: map[int]int{specialUnauthorized: 4}}, relays: oneRelay, revokeBeforeConsume: true},
		{name: "cleanup-guarded", desc: "cleanup refuses a retention shorter than the replay window; a full replay is absorbed",
			plan: planOptions{}, relays: oneRelay, cleanup: "guarded"},
		{name: "external-success-local-failure", desc: "the provider succeeds, the worker dies before the ledger write; reconciliation, no second charge",
			plan: planOptions{faultRates: map[int]float64{faultEffectCrash: 0.2}}, relays: oneRelay,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.FaultsInjected > 0 && f.Reconciliations == 0 {
					return []string{"effect crashes fired but no reconciliation ran"}
				}
				return nil
			}},
		{name: "multi-producer-race", desc: "every producer writes the same few aggregates at once: sequences stay 1..n, applied in order",
			plan: planOptions{race: true}, relays: 2},
		{name: "broker-outage", desc: "the broker is black-holed, then every connection reset; retries stay bounded",
			plan: planOptions{}, relays: oneRelay, outage: true, throttle: 30 * time.Millisecond,
			extra: func(e *env, f *Figures, _ *truth) []string {
				var v []string
				if f.BrokerCallsPerEvent > maxAmplification {
					v = append(v, fmt.Sprintf("retry amplification %.1f broker calls per event exceeds %d", f.BrokerCallsPerEvent, maxAmplification))
				}
				return append(v, outageBit(f)...)
			}},
		{name: "database-outage", desc: "the relay's database connections are black-holed, then reset, mid-run (fault proxy in front of Postgres)",
			plan: planOptions{}, relays: oneRelay, dbOutage: true, throttle: 30 * time.Millisecond, notAvailable: needsPostgresTCP,
			extra: func(e *env, f *Figures, _ *truth) []string { return outageBit(f) }},
		{name: "payload-leakage", desc: "canary strings in every payload never reach logs, errors or metric labels",
			plan: planOptions{specials: map[int]int{specialPoison: 2, specialSchema: 2}}, relays: oneRelay, leakage: true, collision: true, undecodable: true},
		{name: "relay-sigkill", desc: "the relay runs as a subprocess, SIGKILLed at random moments and restarted",
			plan: planOptions{rollbackRate: 0.05}, relays: 0, sigkill: true, throttle: 15 * time.Millisecond,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.FaultsInjected != sigkillKills {
					return []string{fmt.Sprintf("%d kills, want %d", f.FaultsInjected, sigkillKills)}
				}
				return nil
			},
			notAvailable: func(_ *stack, c *config) string {
				if len(c.worker) == 0 {
					return "no worker command (run through `ferry prove`, or pass WithWorkerCommand)"
				}
				return ""
			}},
		{name: "inbox-sigkill", desc: "the consumer (package inbox) runs as a subprocess, SIGKILLed at random moments, mid-transaction included, and restarted",
			plan: planOptions{rollbackRate: 0.05}, relays: 1, sigkillInbox: true, throttle: 15 * time.Millisecond,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.FaultsInjected != sigkillKills {
					return []string{fmt.Sprintf("%d kills, want %d", f.FaultsInjected, sigkillKills)}
				}
				return nil
			},
			notAvailable: func(_ *stack, c *config) string {
				if len(c.worker) == 0 {
					return "no worker command (run through `ferry prove`, or pass WithWorkerCommand)"
				}
				return ""
			}},
		{name: "effect-worker-sigkill", desc: "package effect's worker runs as two subprocesses calling the provider over HTTP, SIGKILLed mid-call (after the charge, before the ledger write included) and restarted",
			plan: planOptions{rollbackRate: 0.05}, relays: 1, sigkillEffects: true, throttle: 10 * time.Millisecond,
			extra: checkEffectSigkill,
			notAvailable: func(_ *stack, c *config) string {
				switch {
				case len(c.worker) == 0:
					return "no worker command (run through `ferry prove`, or pass WithWorkerCommand)"
				case c.referenceInbox:
					return "the reference inbox records into prove's own ledger; the subprocess worker is package effect's"
				}
				return ""
			}},
		{name: "cdc-restart", desc: "the CDC relay (logical replication) runs as a subprocess, SIGKILLed 6 times (mid catch-up, mid-stream, mid backlog); each restart resumes from its slot",
			plan: planOptions{rollbackRate: 0.1}, cdc: true, throttle: 40 * time.Millisecond, notAvailable: needsPostgres,
			extra: func(e *env, f *Figures, _ *truth) []string {
				if f.FaultsInjected != cdcRestarts {
					return []string{fmt.Sprintf("%d CDC restarts, want %d", f.FaultsInjected, cdcRestarts)}
				}
				return nil
			}},
		{name: "nats-leader-kill", desc: "3-node JetStream cluster, stream at 3 replicas: the stream leader's server is shut down mid-drain and restarted; relay and consumer carry on through the leader change",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, clusterFault: clusterLeaderKill, throttle: 30 * time.Millisecond,
			notAvailable: needsNATSCluster, extra: clusterFaultBit},
		{name: "nats-leader-sigkill", desc: "3-node JetStream cluster, every node a process of its own, stream at 3 replicas: the stream leader's process is SIGKILLed mid-drain and restarted on its store and ports; relay and consumer carry on",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, clusterFault: clusterLeaderSigkill, throttle: 30 * time.Millisecond,
			notAvailable: needsProcCluster, extra: clusterFaultBit},
		{name: "nats-partition", desc: "3-node JetStream cluster: the stream leader is cut off from both other nodes (fault proxies on the routes) while publishing, then healed",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, clusterFault: clusterPartition, throttle: 30 * time.Millisecond,
			notAvailable: needsNATSCluster, extra: clusterFaultBit},
		{name: kafkaLeaderMove, desc: "kfake with 3 brokers, topic at 3 replicas: the leader of every partition of the scenario's topic moves to another broker 4 times while the relay publishes and the consumer drains",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, brokerFault: kafkaLeaderMove, throttle: 40 * time.Millisecond,
			notAvailable: needsKfake, extra: brokerFaultBit(kafkaMoveRounds * kafkaPartitions)},
		{name: kafkaBrokerDown, desc: "kfake with 3 brokers: the broker leading partition 0 is shut down mid-publish (connections reset, node removed, its partitions re-led) and added back",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, brokerFault: kafkaBrokerDown, throttle: 40 * time.Millisecond,
			notAvailable: needsKfake, extra: brokerFaultBit(1)},
		{name: rabbitConnDrop, desc: "the relay's AMQP connection is reset 4 times (fault proxy) while publishes await their confirms: the relay reconnects and republishes what it could not confirm",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, brokerFault: rabbitConnDrop, throttle: 40 * time.Millisecond,
			notAvailable: needsRabbitMQ, extra: brokerFaultBit(rabbitDrops)},
		{name: rabbitChannelClose, desc: "RabbitMQ closes the relay's channel (404: its exchange deleted under it) twice mid-publish; the rows are held until the exchange is back",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, brokerFault: rabbitChannelClose, throttle: 40 * time.Millisecond,
			notAvailable: needsRabbitMQ, extra: brokerFaultBit(rabbitCloses)},
		{name: rabbitNodeKill, desc: "prove's own throwaway RabbitMQ node (own node name, ports, epmd and data dir; the --broker node is not touched) is frozen while the relay awaits confirms, SIGKILLed whole and restarted on the same data dir and ports: the durable exchange and quorum queue survive, the relay republishes what was not confirmed",
			plan: planOptions{rollbackRate: 0.05}, relays: oneRelay, brokerFault: rabbitNodeKill, throttle: 40 * time.Millisecond,
			notAvailable: needsRabbitNode, extra: brokerFaultBit(1)},
		{name: "relay-clock-skew", desc: "three relays share the shards, one clock a lease TTL behind, one a TTL ahead, one stepping back a TTL then forward two: leases and fences keep order, no row published twice",
			plan: planOptions{rollbackRate: 0.05}, relays: 3, skew: true, throttle: 30 * time.Millisecond, extra: checkSkew,
			notAvailable: func(_ *stack, c *config) string {
				if c.referenceRelay {
					return "the clock is injected into package relay (relay.WithClock); the reference relay has none"
				}
				return ""
			}},
		{name: "db-crash", desc: "the database is a throwaway Postgres server (initdb, own port, fsync on) SIGKILLed twice — postmaster and backends — while producers commit, the relay marks and the consumer applies, and restarted on the same data dir: every commit the client saw lands once, none it saw fail appears, each unknown outcome resolves",
			plan: planOptions{rollbackRate: 0.05, abandonOnError: true, txWork: 15 * time.Millisecond}, relays: oneRelay, dbCrash: true, throttle: 5 * time.Millisecond,
			notAvailable: needsTempServer, extra: dbCrashBit},

		// Negative controls: broken pipelines that must show violations.
		{name: "control-naive-dual-write", control: true, desc: "commit, then publish directly (crash between); publish inside a tx that rolls back",
			plan: planOptions{rollbackRate: 0.1, faultRates: map[int]float64{faultProducer: 0.05}}, naive: true},
		{name: "control-mark-before-ack", control: true, desc: "relay marks rows sent before the broker acks, then crashes",
			plan: planOptions{faultRates: map[int]float64{faultRelayCrash: 0.03}}, relays: oneRelay, markBeforeAck: true},
		{name: "control-non-atomic-inbox", control: true, desc: "inbox claims in one transaction and applies in another; a crash between",
			plan: planOptions{faultRates: map[int]float64{faultInboxCrash: 0.08}}, relays: oneRelay, nonAtomic: true},
		{name: "control-premature-cleanup", control: true, desc: "cleanup with retention shorter than the replay window, then a replay",
			plan: planOptions{}, relays: oneRelay, cleanup: "premature"},
		{name: "control-cdc-start-from-current-wal", control: true, desc: "the CDC relay restarts from the current WAL position instead of its slot",
			plan: planOptions{}, cdc: true, cdcCurrentWAL: true, throttle: 10 * time.Millisecond, notAvailable: needsPostgres},
		{name: "control-cdc-confirm-before-mark", control: true, desc: "the CDC relay confirms the LSN at the broker's ack, before marking the rows sent, and is SIGKILLed: the table disagrees with the broker",
			plan: planOptions{}, cdc: true, cdcConfirmEarly: true, throttle: 100 * time.Millisecond, notAvailable: needsPostgresAndWorker},
		{name: "control-dual-write-db-crash", control: true, desc: "a producer publishes straight to the broker inside its transaction, before COMMIT, and the database crashes: announced changes that never committed",
			plan: planOptions{abandonOnError: true}, naive: true, dbCrash: true, throttle: 20 * time.Millisecond, notAvailable: needsTempServer},
		{name: "control-inbox-ack-before-commit-db-crash", control: true, desc: "the database crash of db-crash under a consumer that acks each message on receipt, before its claim + effect transaction commits: messages the broker will not redeliver and the database never applied",
			plan: planOptions{rollbackRate: 0.05, abandonOnError: true, txWork: 15 * time.Millisecond}, relays: oneRelay, dbCrash: true, ackEarly: true, throttle: 5 * time.Millisecond,
			notAvailable: needsTempServer},
		{name: "control-inline-effect", control: true, desc: "external call inside the handler without the ledger; crash after provider success",
			plan: planOptions{faultRates: map[int]float64{faultEffectCrash: 0.2}}, relays: oneRelay, inlineEffect: true},
	}
}

// outageBit checks that the outage delayed something: otherwise the
// workload ran before or after it and the scenario proved nothing.
func outageBit(f *Figures) []string {
	if f.LagMax < time.Second {
		return []string{fmt.Sprintf("no event waited through the outage (max lag %s): the fault did not bite", f.LagMax)}
	}
	return nil
}

func needsPostgresTCP(st *stack, _ *config) string {
	if st.pgURL == "" && st.myURL == "" {
		return "needs Postgres or MySQL (--database-url): SQLite is a file, there is no connection to cut"
	}
	return ""
}

func needsPostgres(st *stack, _ *config) string {
	if st.pgURL == "" {
		return "needs Postgres with wal_level=logical (--postgres): the CDC relay reads Postgres' write-ahead log"
	}
	return ""
}

// maxAmplification bounds broker calls per committed event in the outage
// scenario: a relay without backoff and circuit breaking retries every
// row on every poll and blows far past it.
const maxAmplification = 5

func runScenario(ctx context.Context, cfg *config, st *stack, sc *scenario, prog *progress) Result {
	start := time.Now()
	res := Result{Scenario: sc.name, Description: sc.desc, Control: sc.control}
	if why := st.unsupported(sc); why != "" {
		res.Status, res.Note = StatusNotAvailable, why
		return res
	}
	if sc.notAvailable != nil {
		if why := sc.notAvailable(st, cfg); why != "" {
			res.Status, res.Note, res.Components = StatusNotAvailable, why, nil
			return res
		}
	}
	f, viol, note, comps, err := execute(ctx, cfg, st, sc, prog)
	res.Components = comps
	if why, ok := strings.CutPrefix(note, notAvailable); ok && err == nil {
		res.Status, res.Note, res.Elapsed = StatusNotAvailable, why, time.Since(start)
		return res
	}
	res.Elapsed = time.Since(start)
	res.Figures, res.Violations, res.Note = f, viol, note
	switch {
	case err != nil:
		res.Status = StatusError
		res.Note = err.Error()
	case sc.control && len(viol) == 0:
		res.Status = StatusFail
		res.Note = "negative control showed no violation: the checker cannot fail"
	case sc.control:
		res.Status = StatusPass
	case len(viol) > 0:
		res.Status = StatusFail
	default:
		res.Status = StatusPass
	}
	return res
}

// notAvailable prefixes the note of a scenario the broker cannot run.
const notAvailable = "not available: "

// defaultScenarioLimit is WithScenarioLimit's default for a settle
// duration d; scenarioGrace how long a scenario stopped at its limit has
// to wind down before prove gives up on it.
func defaultScenarioLimit(d time.Duration) time.Duration { return 4*d + 3*time.Minute }

const scenarioGrace = 30 * time.Second

// execute runs the scenario under its hard limit. Every wait in a scenario
// should have its own bound; the limit is the backstop for one that does
// not, so a stuck scenario becomes an error with the stacks of what it
// waited on instead of a run that never ends.
func execute(ctx context.Context, cfg *config, st *stack, sc *scenario, prog *progress) (Figures, []string, string, []string, error) {
	limit := cfg.scenarioLimit
	if limit == 0 {
		limit = defaultScenarioLimit(cfg.duration)
	}
	o := runLimited(ctx, cfg, prog, sc.name, limit, scenarioGrace, func(sctx context.Context) (o scenarioOutcome) {
		o.f, o.viol, o.note, o.comps, o.err = executeInner(sctx, cfg, st, sc, prog)
		return o
	})
	return o.f, o.viol, o.note, o.comps, o.err
}

// scenarioOutcome is what executeInner returns.
type scenarioOutcome struct {
	f     Figures
	viol  []string
	note  string
	comps []string
	err   error
}

// runLimited runs run in a goroutine of its own. If it has not returned
// within limit, the stacks of every goroutine go to the progress writer,
// its context is cancelled, and its outcome is an error wrapping
// ErrScenarioLimit; if it has not returned grace after the cancel either,
// runLimited returns without it (it is left running).
func runLimited(ctx context.Context, cfg *config, prog *progress, name string, limit, grace time.Duration, run func(context.Context) scenarioOutcome) scenarioOutcome {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan scenarioOutcome, 1)
	go func() { done <- run(sctx) }()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case o := <-done:
		return o
	case <-timer.C:
	}
	// The stacks before the cancel: they show what it was waiting on.
	stacks := goroutineStacks()
	waiting := proveFrames(stacks)
	prog.dump(fmt.Sprintf("not finished within its limit of %s; its goroutines:", limit), stacks)
	cfg.logger.ErrorContext(ctx, "prove: scenario exceeded its limit", "scenario", name, "limit", limit, "waiting_in", waiting)
	cancel()
	select {
	case o := <-done:
		return scenarioOutcome{comps: o.comps, err: fmt.Errorf("%w: %s not finished within %s (stopped; it was waiting in %s)", ErrScenarioLimit, name, limit, waiting)}
	case <-time.After(grace):
		return scenarioOutcome{err: fmt.Errorf("%w: %s not finished within %s, and still running %s after it was cancelled (waiting in %s)", ErrScenarioLimit, name, limit, grace, waiting)}
	}
}

// goroutineStacks is every goroutine's stack, as a panic prints them.
func goroutineStacks() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) || len(buf) >= 64<<20 {
			return string(buf[:n])
		}
		buf = make([]byte, 2*len(buf))
	}
}

// proveFrames summarises stacks: for each goroutine that is in package
// prove, the innermost prove function, with how many goroutines wait
// there ("prove.settle ×1, prove.runDBCrash ×2"), most frequent first.
func proveFrames(stacks string) string {
	const pkg = "github.com/ferryhq/ferry/prove."
	counts := map[string]int{}
	for _, g := range strings.Split(stacks, "\n\n") {
		for _, line := range strings.Split(g, "\n") {
			fn, ok := strings.CutPrefix(line, pkg)
			if !ok {
				continue
			}
			if i := strings.LastIndexByte(fn, '('); i > 0 {
				fn = fn[:i]
			}
			if fn == "sleepCtx" {
				continue // a helper: its caller is the one waiting
			}
			// The goroutine running execute itself, and a test's own.
			if !strings.HasPrefix(fn, "execute") && !strings.HasPrefix(fn, "goroutineStacks") && !strings.HasPrefix(fn, "Test") {
				counts["prove."+fn]++
			}
			break
		}
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if counts[names[i]] != counts[names[j]] {
			return counts[names[i]] > counts[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s ×%d", n, counts[n])
	}
	if len(parts) == 0 {
		return "no prove function"
	}
	return strings.Join(parts, ", ")
}

func executeInner(ctx context.Context, cfg *config, st *stack, sc *scenario, prog *progress) (Figures, []string, string, []string, error) {
	var pg *tempServer // db-crash: the scenario's own Postgres or MariaDB server, closed after the database
	dbStack := st
	if sc.dbCrash {
		var err error
		if pg, err = startTempServer(ctx, st.crashServerKind()); err != nil {
			return Figures{}, nil, "", nil, err
		}
		defer pg.close()
		dbStack = st.onServer(pg)
	}
	db, err := dbStack.newDatabase(ctx, sc.name)
	if err != nil {
		return Figures{}, nil, "", nil, err
	}
	defer db.close()

	p, err := newPlan(cfg, sc.name, sc.plan)
	if err != nil {
		return Figures{}, nil, "", nil, err
	}
	brStack := st
	envSt := st // the stack the env sees: the process cluster's for nats-leader-sigkill
	if sc.clusterFault == clusterLeaderSigkill {
		// The scenario's own cluster, every node a process (nodeproc_linux.go);
		// closed after the stream is destroyed.
		pc, err := startProcCluster(cfg.worker)
		if err != nil {
			return Figures{}, nil, "", nil, err
		}
		defer pc.close()
		brStack = st.onProcCluster(pc)
		envSt = brStack
	}
	// rabbitmq-node-kill: the scenario's exchange and queues live on a
	// RabbitMQ node of prove's own, killed and restarted mid-run; the
	// --broker node is not used.
	var node *tempServer
	if sc.brokerFault == rabbitNodeKill {
		if node, err = startTempServer(ctx, serverRabbitMQ); err != nil {
			return Figures{}, nil, "", nil, err
		}
		defer node.close()
		brStack = st.onServer(node)
	}
	tr, err := brStack.newTransport(ctx, sc.name, cfg)
	if err != nil {
		return Figures{}, nil, "", nil, err
	}
	defer tr.destroy(context.WithoutCancel(ctx))
	if node != nil {
		sleepCtx(ctx, rabbitNodeIdle)
	}
	if why := tr.unsupported(sc); why != "" {
		return Figures{}, nil, notAvailable + why, nil, nil
	}
	w, err := db.writer(tr.topicTemplate())
	if err != nil {
		return Figures{}, nil, "", nil, err
	}
	e := &env{cfg: cfg, sc: sc, st: envSt, db: db, w: w, plan: p, log: cfg.logger,
		reg: prometheus.NewRegistry(), rec: newRecorder(), provider: newFakeProvider(), prog: prog, tr: tr, rabbitNode: node}
	e.metrics = newMetrics(e.reg)
	// The non-atomic and ack-before-commit controls need a broken inbox;
	// package inbox has no public switch for that, so they run on prove's
	// reference inbox.
	e.realInbox = !cfg.referenceInbox && !sc.nonAtomic && !sc.ackEarly
	e.sentWatermark, e.shardPipeline = cfg.sentWatermark, cfg.shardPipeline
	if sc.cdcCurrentWAL {
		e.cdcFirstDown = make(chan struct{})
	}
	if sc.leakage {
		e.logs = &syncBuffer{}
		e.log = slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for _, pr := range []string{"user:clerk", "user:mallory"} {
		if _, err := db.drv.Executor().Exec(ctx, `INSERT INTO prove_policy (principal, action, allowed) VALUES ($1, '*', 1)`, pr); err != nil {
			return Figures{}, nil, "", nil, fmt.Errorf("prove: policy: %w", err)
		}
	}
	var proxy faultSwitch // the outage's
	switch {
	case sc.outage && st.kfake != nil:
		// kfake: the stack's proxies already stand in front of the
		// brokers' advertised addresses; the outage takes the cluster away
		// from every client (relay, consumer, readers), not only the relay.
		proxy = st.kfake
		defer proxy.Set(faultproxy.Pass)
	case sc.outage || sc.brokerFault == rabbitConnDrop:
		p, err := faultproxy.New(tr.endpoint())
		if err != nil {
			return Figures{}, nil, "", nil, err
		}
		defer p.Close()
		e.pubVia = p.Addr()
		if sc.outage {
			proxy = p
		} else {
			e.relayProxy = p // rabbitmq-connection-drop: its fault drives it
		}
	}
	if sc.dbOutage {
		p, closeDB, err := e.proxiedRelayDB()
		if err != nil {
			return Figures{}, nil, "", nil, err
		}
		defer closeDB()
		proxy = p
	}
	// effect-worker-sigkill: the provider is reached over HTTP by effect
	// workers in other processes; it closes after they are gone.
	var provSrv *providerServer
	if sc.sigkillEffects {
		if provSrv, err = startProviderServer(e.provider, providerDelay); err != nil {
			return Figures{}, nil, "", nil, err
		}
		defer provSrv.close()
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
		if sc.cdc {
			e.dropCDC(context.WithoutCancel(ctx))
		}
	}()

	markBeforeAck := sc.markBeforeAck || cfg.broken == "mark-before-ack"
	// concurrent-relays: with a worker command, one relay is a subprocess
	// that freezes itself mid-batch (the whole process, heartbeat
	// included) and must be fenced when it wakes. In-process, package
	// relay keeps renewing its lease while one goroutine stalls, so only
	// the reference relay's stall crosses lease expiry.
	stopping := sc.pauseRelay && !cfg.referenceRelay && len(cfg.worker) > 0 && canStop
	e.stopping = stopping
	pause := &atomic.Bool{}
	pause.Store(sc.pauseRelay && !stopping)
	startRelays := func() {
		for i := 0; i < sc.relays; i++ {
			name := fmt.Sprintf("relay-%d", i)
			po := pause                // the first relay to fetch rows stalls
			var clock func() time.Time // one per relay, kept across its restarts
			if sc.skew {
				clock = skewClock(e, i)
			}
			supervise(runCtx, &wg, e.log, name, func(ctx context.Context) error {
				if cfg.referenceRelay {
					pub, err := e.newPublisher()
					if err != nil {
						return err
					}
					defer pub.Close()
					r := &refRelay{env: e, id: name + "-" + randHex(3), pub: pub, ttl: relayTTL, held: map[int]int64{},
						markBeforeAck: markBeforeAck, pauseOnce: po}
					return r.run(ctx)
				}
				return e.runRealRelay(ctx, name, relayFaults{pause: po, markBeforeAck: markBeforeAck, clock: clock})
			})
		}
	}
	frozen, resumed := make(chan struct{}), make(chan struct{})
	if stopping {
		startStoppingRelay(runCtx, &wg, e, frozen, resumed)
	} else {
		close(resumed)
		startRelays()
	}
	killsDone := make(chan struct{})
	if sc.cdc {
		startCDCRelay(runCtx, &wg, e, sc.cdcCurrentWAL, killsDone)
	} else if sc.sigkill {
		startSigkill(runCtx, &wg, e, "relay", killsDone)
	} else if sc.sigkillInbox {
		startSigkill(runCtx, &wg, e, "inbox", killsDone)
	} else if !sc.sigkillEffects {
		close(killsDone) // effect-worker-sigkill: closed by startEffectSigkill
	}
	inbox := &refInbox{env: e, maxAttempts: 3, nonAtomic: sc.nonAtomic, ackBeforeCommit: sc.ackEarly, inlineEffect: sc.inlineEffect || cfg.broken == "no-ledger"}
	startConsumer := func() {
		if e.realInbox {
			supervise(runCtx, &wg, e.log, "inbox", func(ctx context.Context) error {
				sleepCtx(ctx, cfg.consumerDelay)
				return e.runRealInbox(ctx, "prove", inbox.inlineEffect, sc.cleanup != "")
			})
			return
		}
		supervise(runCtx, &wg, e.log, "inbox", func(ctx context.Context) error {
			sleepCtx(ctx, cfg.consumerDelay)
			return inbox.run(ctx)
		})
	}
	if !sc.revokeBeforeConsume && !sc.sigkillInbox {
		startConsumer()
	}
	if sc.sigkillEffects {
		startEffectSigkill(runCtx, &wg, e, provSrv, killsDone)
	} else {
		run := (&refEffects{env: e, unknownAfter: 300 * time.Millisecond}).run
		if e.realInbox {
			run = e.runRealEffects
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleepCtx(runCtx, cfg.effectDelay)
			supervise(runCtx, &wg, e.log, "effects", run)
		}()
	}

	// The outage: black hole, then reset every connection, then heal.
	outageDone := make(chan struct{})
	var clusterErr error // set by the cluster fault before outageDone closes
	if proxy != nil {
		go func() {
			defer close(outageDone)
			sleepCtx(runCtx, 300*time.Millisecond)
			e.faults.Add(1)
			proxy.Set(faultproxy.Blackhole)
			proxy.ResetAll()
			sleepCtx(runCtx, 1500*time.Millisecond)
			proxy.Set(faultproxy.Reset)
			sleepCtx(runCtx, 300*time.Millisecond)
			proxy.Set(faultproxy.Pass)
		}()
	} else if sc.clusterFault != "" || sc.brokerFault != "" {
		go func() {
			defer close(outageDone)
			sleepCtx(runCtx, 300*time.Millisecond)
			var note string
			var err error
			if sc.clusterFault != "" {
				note, err = runClusterFault(runCtx, e, sc.clusterFault)
			} else {
				note, err = runBrokerFault(runCtx, e, sc.brokerFault)
			}
			e.extraNote, clusterErr = note, err
		}()
	} else if sc.dbCrash {
		go func() {
			defer close(outageDone)
			note, err := runDBCrash(runCtx, e, pg)
			e.extraNote, clusterErr = note, err
		}()
	} else {
		close(outageDone)
	}

	var txDone atomic.Int64
	total := len(p.txs)
	perrCh := make(chan error, 1)
	go func() {
		if sc.naive && sc.dbCrash {
			perrCh <- produceNaiveInTx(runCtx, e)
			return
		}
		if sc.naive {
			perrCh <- produceNaive(runCtx, e)
			return
		}
		if sc.cdcCurrentWAL {
			waitSlot(runCtx, e, 60*time.Second)
		}
		perrCh <- produce(runCtx, db, w, p, cfg.producers, func() {
			sleepCtx(runCtx, sc.throttle)
			n := txDone.Add(1)
			if e.cdcFirstDown != nil && n >= cdcHoldAt {
				select {
				case <-e.cdcFirstDown:
				case <-runCtx.Done():
				case <-time.After(60 * time.Second):
				}
			}
			prog.update("producing %d/%d transactions, %d faults fired", n, total, e.faults.Load())
		})
	}()
	if stopping {
		select {
		case <-frozen:
		case <-time.After(cfg.duration):
		case <-runCtx.Done():
		}
		startRelays()
	}
	perr := <-perrCh
	select {
	case <-resumed:
	case <-runCtx.Done():
	}
	if perr != nil {
		// A fault that failed (a crashed database that did not restart)
		// is the cause of what the workload then saw: report it first.
		select {
		case <-outageDone:
			if clusterErr != nil {
				return Figures{}, nil, "", nil, fmt.Errorf("%w (then the workload: %v)", clusterErr, perr)
			}
		default:
		}
		return Figures{}, nil, "", nil, fmt.Errorf("prove: workload: %w", perr)
	}
	<-outageDone
	if clusterErr != nil {
		return Figures{}, nil, "", nil, clusterErr
	}

	if sc.revokeBeforeConsume {
		// Wait until every committed event is in the stream, then revoke.
		if err := waitPublished(runCtx, e, cfg.duration); err != nil {
			return Figures{}, nil, "", nil, err
		}
		if _, err := db.drv.Executor().Exec(ctx, `UPDATE prove_policy SET allowed = 0 WHERE principal = 'user:mallory'`); err != nil {
			return Figures{}, nil, "", nil, fmt.Errorf("prove: revoke: %w", err)
		}
		startConsumer()
	}
	select {
	case <-killsDone:
	case <-runCtx.Done():
	}
	if sc.pauseRelay && cfg.referenceRelay {
		// The stalled relay wakes after 3 lease periods and must be fenced.
		for i := 0; i < 100 && e.rec.fencedMarks.Load() == 0; i++ {
			sleepCtx(runCtx, 50*time.Millisecond)
		}
	}
	if err := forge(runCtx, e); err != nil {
		return Figures{}, nil, "", nil, err
	}
	settle(runCtx, e, cfg)
	var note string
	if sc.cleanup != "" {
		n, err := cleanupThenReplay(runCtx, e, &wg, inbox)
		if err != nil {
			return Figures{}, nil, "", nil, err
		}
		note = n
	}
	stop()
	wg.Wait()

	t, err := collect(ctx, e)
	if err != nil {
		return Figures{}, nil, "", nil, err
	}
	f, viol := check(e, t)
	if sc.leakage {
		e.rec.mu.Lock()
		errs := append([]string(nil), e.rec.errs...)
		e.rec.mu.Unlock()
		// Errors the components stored in the database are errors too.
		stored, err := storedErrors(ctx, e)
		if err != nil {
			return Figures{}, nil, "", nil, err
		}
		errs = append(errs, stored...)
		leaks, err := findLeaks(p.canary, e.logs.String(), errs, e.reg)
		if err != nil {
			return Figures{}, nil, "", nil, err
		}
		f.Leaks = len(leaks)
		for _, l := range leaks {
			viol = append(viol, "payload leak: "+l)
		}
		if e.logs.String() == "" || len(errs) == 0 {
			viol = append(viol, "leak check saw no logs or no errors: nothing was checked")
		}
	}
	if sc.extra != nil {
		viol = append(viol, sc.extra(e, &f, t)...)
	}
	if e.sentWatermark && !sc.cdc && !sc.naive {
		// package relay ran in the watermark design: most rows must have
		// been sent by a watermark, or the design was not exercised.
		e.extraNote = strings.TrimPrefix(e.extraNote+fmt.Sprintf("; watermark design: %d rows sent by their shard's watermark, %d by their status", t.sentByWatermark, t.sentByStatus), "; ")
		if t.sentByStatus > 0 && t.sentByWatermark == 0 { // (a cleanup may have deleted them all)
			viol = append(viol, "watermark design: no row was sent by a watermark (the relay did not run in the design under test)")
		}
	}
	if e.shardPipeline > 1 && !sc.cdc && !sc.naive && !cfg.referenceRelay {
		e.extraNote = strings.TrimPrefix(e.extraNote+fmt.Sprintf("; shard pipeline: %d batches claimed beside another of their shard (in-process relays)", e.rec.pipelined.Load()), "; ")
	}
	if cfg.partitionInbox > 0 && e.db.dialect == driver.Postgres && e.realInbox {
		// The inbox was partitioned: Ferry's UUIDv7 event ids must have
		// been claimed in range partitions, or the partitioning was not
		// exercised (every claim in the default partition).
		var total, def int64
		exec := e.db.drv.Executor()
		if err := countInto(ctx, exec, `SELECT count(*) FROM ferry_inbox`, &total); err != nil {
			return Figures{}, nil, "", nil, err
		}
		if err := countInto(ctx, exec, `SELECT count(*) FROM ferry_inbox_default`, &def); err != nil {
			return Figures{}, nil, "", nil, err
		}
		e.extraNote = strings.TrimPrefix(e.extraNote+fmt.Sprintf("; partitioned inbox: %d claims in range partitions, %d in the default", total-def, def), "; ")
		if total > 0 && def == total {
			viol = append(viol, "partitioned inbox: every claim is in the default partition (no range partition was used)")
		}
	}
	if e.extraNote != "" {
		note = strings.TrimPrefix(note+"; "+e.extraNote, "; ")
	}
	return f, viol, note, e.components(), nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// waitPublished waits until the stream holds every committed event.
func waitPublished(ctx context.Context, e *env, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		var committed int64
		rows, err := e.db.drv.Executor().Query(ctx, `SELECT COUNT(*) FROM prove_business`)
		if err != nil {
			return fmt.Errorf("prove: count: %w", err)
		}
		if rows.Next() {
			_ = rows.Scan(&committed)
		}
		rows.Close()
		msgs, err := e.tr.readAll(ctx)
		if err != nil {
			return err
		}
		ids := map[string]bool{}
		for _, m := range msgs {
			ids[m.EventID] = true
		}
		e.prog.update("waiting for publication: %d/%d", len(ids), committed)
		if int64(len(ids)) >= committed {
			return nil
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	return errors.New("prove: events were not all published in time")
}

// forge publishes the scenario's hostile messages straight to the broker.
func forge(ctx context.Context, e *env) error {
	sc := e.sc
	if sc.duplicates == 0 && !sc.collision && !sc.undecodable {
		return nil
	}
	if err := waitPublished(ctx, e, e.cfg.duration); err != nil {
		return err
	}
	raw, err := e.tr.readAll(ctx)
	if err != nil {
		return err
	}
	for i := 0; i < sc.duplicates && i < len(raw); i++ {
		if err := e.tr.forge(ctx, raw[i].Headers, raw[i].Body, "dup-"+randHex(8)); err != nil {
			return fmt.Errorf("prove: forge duplicate: %w", err)
		}
	}
	if sc.collision && len(raw) > 0 {
		body := append([]byte(nil), raw[0].Body...)
		body = append(body[:len(body)-1], []byte(`,"forged":true}`)...)
		if err := e.tr.forge(ctx, raw[0].Headers, body, "forged-"+randHex(8)); err != nil {
			return fmt.Errorf("prove: forge collision: %w", err)
		}
	}
	if sc.undecodable {
		body := []byte(`{"card_note":"` + e.plan.canary[0] + `"}`)
		if err := e.tr.forge(ctx, map[string]string{"x-junk": "1"}, body, "junk-"+randHex(8)); err != nil {
			return fmt.Errorf("prove: forge junk: %w", err)
		}
	}
	return nil
}

// storedErrors reads the error texts components persisted: the outbox's
// last_error and the inbox's parked last_error.
func storedErrors(ctx context.Context, e *env) ([]string, error) {
	var out []string
	qs := []string{`SELECT last_error FROM ferry_outbox WHERE last_error <> ''`}
	if e.realInbox {
		qs = append(qs, `SELECT last_error FROM ferry_inbox_parked WHERE last_error <> ''`)
	}
	for _, q := range qs {
		if err := scanRows(ctx, e.db.drv.Executor(), q, func(s func(...any) error) error {
			var v string
			if err := s(&v); err != nil {
				return err
			}
			out = append(out, v)
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return out, nil
}
