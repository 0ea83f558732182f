package prove

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/internal/testenv"
)

// small is the test scale: every scenario settles in a second or two. The
// settle budget only bounds a scenario that does not settle; it is 60 s
// because under the race detector on a loaded machine relay-crash-after-publish
// needed more than 30 s (5 crashes, each a 2 s lease takeover plus a relay
// start of 1–8 s: its rows were still pending when a 30 s budget ran out).
func small(extra ...Option) []Option {
	return append([]Option{WithEvents(100), WithAggregates(8), WithTenants(3), WithProducers(4),
		WithDuration(60 * time.Second), WithWorkerCommand(os.Args[0], "-test.run=^$")}, extra...)
}

// controlFigure names the figure each negative control must drive above zero.
var controlFigure = map[string]func(Figures) int{
	"control-naive-dual-write":                 func(f Figures) int { return min(f.Lost, f.Phantom) },
	"control-mark-before-ack":                  func(f Figures) int { return f.Lost },
	"control-non-atomic-inbox":                 func(f Figures) int { return f.Lost },
	"control-premature-cleanup":                func(f Figures) int { return f.DuplicateApplies },
	"control-inline-effect":                    func(f Figures) int { return f.DuplicateEffects },
	"control-cdc-start-from-current-wal":       func(f Figures) int { return f.Lost },
	"control-cdc-confirm-before-mark":          func(f Figures) int { return f.StateMismatch },
	"control-dual-write-db-crash":              func(f Figures) int { return f.Phantom },
	"control-inbox-ack-before-commit-db-crash": func(f Figures) int { return f.Lost },
}

func assertMatrix(t *testing.T, rep *Report, allowUnavailable map[string]bool) {
	t.Helper()
	for _, r := range rep.Results {
		switch {
		case r.Status == StatusNotAvailable:
			// The cluster scenarios need --broker nats-cluster (cluster_test.go),
			// the broker faults their own broker (brokerfaults_test.go).
			sc, _ := lookupScenario(r.Scenario)
			otherBroker := sc.clusterFault != "" && !strings.Contains(rep.Stack, "cluster") ||
				sc.brokerFault != "" && !strings.Contains(rep.Stack, brokerFaultStack(sc.brokerFault))
			if !allowUnavailable[r.Scenario] && !otherBroker {
				t.Errorf("%s: not available: %s", r.Scenario, r.Note)
			}
		case r.Control:
			fig, ok := controlFigure[r.Scenario]
			if !ok {
				t.Errorf("%s: control without an expected figure", r.Scenario)
				continue
			}
			if r.Status != StatusPass || len(r.Violations) == 0 || fig(r.Figures) == 0 {
				t.Errorf("%s: negative control must show its violation: status %s, violations %v, figures %+v", r.Scenario, r.Status, r.Violations, r.Figures)
			}
		default:
			if r.Status != StatusPass || len(r.Violations) > 0 {
				t.Errorf("%s: status %s, violations %v (note %q)", r.Scenario, r.Status, r.Violations, r.Note)
			}
			f := r.Figures
			if f.Committed == 0 || f.Lost != 0 || f.Phantom != 0 || f.DuplicateEffects != 0 || f.OrderViolations != 0 || f.DuplicateApplies != 0 {
				t.Errorf("%s: figures %+v", r.Scenario, f)
			}
		}
	}
}

// TestEmbeddedMatrix runs every scenario on the embedded stack: zero
// violations for the real ones, at least one for each negative control.
func TestEmbeddedMatrix(t *testing.T) {
	parallelUnlessRace(t)
	rep, err := Run(context.Background(), small()...)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + buf.String())
	if len(rep.Results) != len(allScenarios()) {
		t.Fatalf("%d results for %d scenarios", len(rep.Results), len(allScenarios()))
	}
	assertMatrix(t, rep, map[string]bool{"cdc-restart": true, "control-cdc-start-from-current-wal": true, "control-cdc-confirm-before-mark": true, "database-outage": true,
		"db-crash": true, "control-dual-write-db-crash": true, "control-inbox-ack-before-commit-db-crash": true})
	// The polling relay's broken build marks rows sent before the broker
	// has them: the table disagrees with the broker (state_mismatch).
	if r, _ := rep.Result("control-mark-before-ack"); r.Figures.StateMismatch == 0 {
		t.Errorf("control-mark-before-ack: no state_mismatch: %+v", r.Figures)
	}
	if rep.Failed() {
		t.Errorf("report failed")
	}
	// Faults must actually have fired where planned, or the pass is hollow.
	for _, name := range []string{"relay-crash-after-publish", "consumer-ack-loss", "sequence-gap-reorder", "external-success-local-failure", "relay-sigkill", "inbox-sigkill", "effect-worker-sigkill", "concurrent-relays"} {
		r, _ := rep.Result(name)
		if r.Figures.FaultsInjected == 0 {
			t.Errorf("%s: no fault fired", name)
		}
	}
	for name, check := range map[string]func(Figures) bool{
		"producer-rollback":              func(f Figures) bool { return f.RolledBack > 0 },
		"relay-crash-after-publish":      func(f Figures) bool { return f.DuplicatePublishes > 0 },
		"consumer-ack-loss":              func(f Figures) bool { return f.DuplicateDeliveries > 0 },
		"duplicate-delivery":             func(f Figures) bool { return f.DuplicateDeliveries >= 1 },
		"sequence-gap-reorder":           func(f Figures) bool { return f.GapsFound > 0 && f.GapsFound == f.GapsHealed },
		"poison-parking":                 func(f Figures) bool { return f.ParkedByReason["poison"] == 4 && f.DeadLetters == 4 },
		"schema-incompatible":            func(f Figures) bool { return f.ParkedByReason["schema"] == 4 },
		"stale-authorization":            func(f Figures) bool { return f.ParkedByReason["unauthorized"] == 4 },
		"external-success-local-failure": func(f Figures) bool { return f.Reconciliations > 0 },
		"payload-leakage":                func(f Figures) bool { return f.Leaks == 0 },
		"concurrent-relays":              func(f Figures) bool { return f.FencedWrites > 0 },
		"cleanup-guarded":                func(f Figures) bool { return f.DuplicateDeliveries >= f.Committed }, // the replay happened
	} {
		if r, _ := rep.Result(name); !check(r.Figures) {
			t.Errorf("%s: expected figure missing: %+v", name, r.Figures)
		}
	}
	// The effect worker subprocess: a kill landed after a charge, before the
	// ledger write; every such charge was found by a status query; one
	// charge per paid order.
	if r, _ := rep.Result("effect-worker-sigkill"); r.Figures.FaultsInjected != sigkillKills || r.Figures.ChargesResponseLost == 0 ||
		r.Figures.ReconciledFound < r.Figures.ChargesResponseLost || r.Figures.ProviderCallsPerEffect != 1 {
		t.Errorf("effect-worker-sigkill: expected figures missing: %+v", r.Figures)
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Results) != len(rep.Results) {
		t.Fatalf("json round trip: %v", err)
	}
}

// TestSeedReproduces: the same seed gives the same deterministic figures;
// another seed gives another workload.
func TestSeedReproduces(t *testing.T) {
	parallelUnlessRace(t)
	names := []string{"sequence-gap-reorder", "consumer-ack-loss", "poison-parking"}
	run := func(seed int64, names ...string) *Report {
		rep, err := Run(context.Background(), small(WithSeed(seed), WithScenarios(names...))...)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	a, b := run(7, names...), run(7, names...)
	for i := range a.Results {
		ctl := a.Results[i].Control
		da, db := a.Results[i].Figures.Deterministic(ctl), b.Results[i].Figures.Deterministic(ctl)
		for k, v := range da {
			if db[k] != v {
				t.Errorf("%s: %s = %d then %d with the same seed", a.Results[i].Scenario, k, v, db[k])
			}
		}
	}
	c := run(8, names[0])
	da, dc := a.Results[0].Figures.Deterministic(false), c.Results[0].Figures.Deterministic(false)
	differs := false
	for k, v := range da {
		differs = differs || dc[k] != v
	}
	if !differs {
		t.Errorf("seeds 7 and 8 produced identical figures %v: the seed does not drive the workload", da)
	}
}

// TestBrokenBuildCaught: removing a safety mechanism from the pipeline makes
// the real scenario meant to catch it fail.
func TestBrokenBuildCaught(t *testing.T) {
	parallelUnlessRace(t)
	cases := []struct {
		broken, scenario string
		figure           func(Figures) int
	}{
		// package relay has no mark-before-ack switch: the broken build is
		// emulated through its BeforePublish hook, which marks the batch
		// sent and then crashes at the planned fault points.
		{"mark-before-ack", "relay-crash-after-publish", func(f Figures) int { return f.Lost }},
		{"no-ledger", "external-success-local-failure", func(f Figures) int { return f.DuplicateEffects }},
		// The subprocess effect worker without reconciliation: every
		// outcome its predecessor left unknown is charged again.
		{"blind-retry", "effect-worker-sigkill", func(f Figures) int { return f.DuplicateEffects }},
	}
	for _, c := range cases {
		t.Run(c.broken, func(t *testing.T) {
			rep, err := Run(context.Background(), small(WithEvents(60), WithScenarios(c.scenario), withBrokenBuild(c.broken))...)
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Results[0]
			if r.Status != StatusFail || c.figure(r.Figures) == 0 || !rep.Failed() {
				t.Fatalf("broken build %s not caught by %s: status %s, violations %v", c.broken, c.scenario, r.Status, r.Violations)
			}
		})
	}
}

// TestReferenceRelay runs the relay scenarios with prove's own reference
// relay, whose in-process stall does cross lease expiry and must be fenced.
func TestReferenceRelay(t *testing.T) {
	parallelUnlessRace(t)
	rep, err := Run(context.Background(), small(WithReferenceRelay(), WithScenarios("concurrent-relays", "control-mark-before-ack"))...)
	if err != nil {
		t.Fatal(err)
	}
	assertMatrix(t, rep, nil)
	if r, _ := rep.Result("concurrent-relays"); r.Figures.FencedWrites == 0 {
		t.Errorf("stalled reference relay was not fenced")
	}
}

// TestPostgresAndSystemNATS runs a subset against Postgres and the
// system NATS server.
func TestPostgresAndSystemNATS(t *testing.T) {
	parallelUnlessRace(t)
	pg := testenv.PostgresURL(t)
	nats := testenv.NATSURL(t)
	rep, err := Run(context.Background(), small(WithPostgres(pg), WithBroker(nats), WithScenarios(
		"relay-crash-after-publish", "consumer-ack-loss", "multi-producer-race",
		"external-success-local-failure", "relay-sigkill", "effect-worker-sigkill", "control-non-atomic-inbox",
		"cdc-restart", "control-cdc-start-from-current-wal", "control-cdc-confirm-before-mark", "database-outage"))...)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stack != "postgres+nats" {
		t.Errorf("stack %q", rep.Stack)
	}
	assertMatrix(t, rep, nil)
	// Issue #23: SIGKILLed six times, the CDC relay leaves the table
	// agreeing with the broker (the relay that confirms before it marks
	// does not: controlFigure).
	if r, _ := rep.Result("cdc-restart"); r.Figures.FaultsInjected != cdcRestarts || r.Figures.StateMismatch != 0 {
		t.Errorf("cdc-restart: %+v", r.Figures)
	}
}

// TestKafka runs a subset on franz-go's in-process kfake through
// broker/kafka, the outage included (kfake's broker advertises prove's
// fault proxy), and the controls whose loss only the broker's committed
// offsets tell apart from a slow consumer.
func TestKafka(t *testing.T) {
	parallelUnlessRace(t)
	rep, err := Run(context.Background(), small(WithBroker("kafka://kfake"), WithScenarios(
		"relay-crash-after-publish", "duplicate-delivery", "broker-outage", "inbox-sigkill",
		kafkaLeaderMove, kafkaBrokerDown, "control-mark-before-ack", "control-non-atomic-inbox"))...)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stack != "sqlite+kafka(kfake)" {
		t.Errorf("stack %q", rep.Stack)
	}
	assertMatrix(t, rep, nil)
	if r, _ := rep.Result("broker-outage"); r.Figures.LagMax < time.Second {
		t.Errorf("broker-outage on kafka: no event waited through the outage: %+v", r.Figures)
	}
	// #18 item 4: 3 brokers; leaders moved, a leader broker removed and
	// added back, while the relay publishes.
	if r, _ := rep.Result(kafkaLeaderMove); r.Figures.FaultsInjected != kafkaMoveRounds*kafkaPartitions || !strings.Contains(r.Note, "3 brokers") {
		t.Errorf("%s: faults %d, note %q", kafkaLeaderMove, r.Figures.FaultsInjected, r.Note)
	}
	if r, _ := rep.Result(kafkaBrokerDown); r.Figures.FaultsInjected != 1 || !strings.Contains(r.Note, "added back") {
		t.Errorf("%s: faults %d, note %q", kafkaBrokerDown, r.Figures.FaultsInjected, r.Note)
	}
	// A real cluster's brokers advertise their own addresses: no proxy.
	if why := (&kafkaTransport{}).unsupported(&scenario{outage: true}); !strings.Contains(why, "kfake") {
		t.Errorf("outage on a real cluster: %q", why)
	}
}

// TestRabbitMQ runs a subset against the RabbitMQ server through
// broker/rabbitmq (including the outage through the fault proxy).
func TestRabbitMQ(t *testing.T) {
	parallelUnlessRace(t)
	rep, err := Run(context.Background(), small(WithBroker(testenv.RabbitMQURL(t)), WithScenarios(
		"consumer-ack-loss", "duplicate-delivery", "broker-outage", rabbitConnDrop, rabbitChannelClose,
		"control-inline-effect", "cleanup-guarded"))...)
	if err != nil {
		t.Fatal(err)
	}
	assertMatrix(t, rep, map[string]bool{"cleanup-guarded": true})
	// #18 item 4: the relay's connection reset while confirms were in
	// flight (republished), its channel closed by the server (held).
	if r, _ := rep.Result(rabbitConnDrop); r.Figures.FaultsInjected != rabbitDrops || r.Figures.DuplicatePublishes == 0 {
		t.Errorf("%s: %+v", rabbitConnDrop, r.Figures)
	}
	if r, _ := rep.Result(rabbitChannelClose); r.Figures.FaultsInjected != rabbitCloses || !strings.Contains(r.Note, "404") {
		t.Errorf("%s: faults %d, note %q", rabbitChannelClose, r.Figures.FaultsInjected, r.Note)
	}
	if r, _ := rep.Result("duplicate-delivery"); r.Figures.DuplicateDeliveries == 0 {
		t.Errorf("no duplicate delivered on RabbitMQ: %+v", r.Figures)
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, o := range []Option{WithEvents(1), WithAggregates(0), WithTenants(1), WithProducers(0), WithDuration(time.Millisecond),
		WithPostgres("mysql://x"), WithBroker("http://x"), WithScenarioLimit(500 * time.Millisecond), WithScenarioLimit(25 * time.Hour)} {
		if _, err := Run(context.Background(), o); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("want ErrInvalidConfig, got %v", err)
		}
	}
	if _, err := Run(context.Background(), WithScenarios("no-such")); !errors.Is(err, ErrUnknownScenario) {
		t.Errorf("want ErrUnknownScenario, got %v", err)
	}
}

// TestScenarioLimit: a scenario still running at its hard limit is
// stopped and reported as an error naming where it waited, with every
// goroutine's stack on the progress writer — not a run that never ends.
// relay-crash-after-publish needs 5 relay crashes of at least a lease
// takeover each: it cannot finish within 1 s.
func TestScenarioLimit(t *testing.T) {
	var progress syncBuffer
	start := time.Now()
	rep, err := Run(context.Background(), small(WithScenarios("relay-crash-after-publish"), WithScenarioLimit(time.Second), WithProgress(&progress))...)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := rep.Result("relay-crash-after-publish")
	if res.Status != StatusError || !strings.Contains(res.Note, ErrScenarioLimit.Error()) || !strings.Contains(res.Note, "(stopped; it was waiting in prove.") {
		t.Fatalf("want an error naming the limit and the prove functions it waited in, got %s: %s", res.Status, res.Note)
	}
	t.Log(res.Note)
	if !rep.Failed() {
		t.Error("a scenario stopped at its limit must fail the run")
	}
	out := progress.String()
	if !strings.Contains(out, "not finished within its limit of 1s; its goroutines:") || !strings.Contains(out, "goroutine ") {
		t.Errorf("no goroutine stacks on the progress writer:\n%.2000s", out)
	}
	if d := time.Since(start); d > scenarioGrace {
		t.Errorf("the stopped scenario took %s to return", d)
	}
}

// TestScenarioLimitStillRunning: a scenario that ignores the cancel at
// its limit is given up on after the grace: runLimited returns an error
// saying it is still running, and does not wait for it.
func TestScenarioLimitStillRunning(t *testing.T) {
	cfg, err := newConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	release := make(chan struct{})
	returned := make(chan struct{})
	defer func() { close(release); <-returned }()
	start := time.Now()
	o := runLimited(context.Background(), &cfg, newProgress(&out), "stuck", 200*time.Millisecond, 300*time.Millisecond, func(context.Context) scenarioOutcome {
		defer close(returned)
		<-release // deaf to its context
		return scenarioOutcome{}
	})
	took := time.Since(start)
	if !errors.Is(o.err, ErrScenarioLimit) || !strings.Contains(o.err.Error(), "stuck not finished within 200ms, and still running 300ms after it was cancelled (waiting in ") {
		t.Fatalf("want a still-running error naming the limit, the grace and where it waited, got %v", o.err)
	}
	if took < 500*time.Millisecond || took > 5*time.Second {
		t.Errorf("runLimited returned after %s, want the limit plus the grace (500ms)", took)
	}
	if !strings.Contains(out.String(), "not finished within its limit of 200ms; its goroutines:") {
		t.Errorf("no goroutine stacks on the progress writer:\n%.2000s", out.String())
	}
	select {
	case <-returned:
		t.Fatal("the stuck scenario returned before it was released: the test did not exercise the still-running path")
	default:
	}
}

func TestProveFrames(t *testing.T) {
	stacks := `goroutine 1 [running]:
github.com/ferryhq/ferry/prove.goroutineStacks()
	/x/prove/scenarios.go:1 +0x1

goroutine 7 [select]:
time.Sleep(0x1)
github.com/ferryhq/ferry/prove.settle({0x1, 0x2}, 0x3)
	/x/prove/settle.go:40 +0x1
github.com/ferryhq/ferry/prove.executeInner(0x1)

goroutine 8 [chan receive]:
github.com/ferryhq/ferry/prove.(*tempServer).start(0x1)
	/x/prove/dbcrash_pg.go:300 +0x1

goroutine 9 [select]:
github.com/ferryhq/ferry/prove.sleepCtx({0x1, 0x2}, 0x3)
	/x/prove/scenarios.go:700 +0x1
github.com/ferryhq/ferry/prove.settle({0x1, 0x2}, 0x3)

goroutine 11 [chan receive]:
github.com/ferryhq/ferry/prove.TestMain(0x1)

goroutine 10 [IO wait]:
net.(*netFD).Read(0x1)
`
	if got, want := proveFrames(stacks), "prove.settle ×2, prove.(*tempServer).start ×1"; got != want {
		t.Errorf("proveFrames = %q, want %q", got, want)
	}
	if got := proveFrames("goroutine 1 [running]:\nmain.main()\n"); got != "no prove function" {
		t.Errorf("proveFrames without prove frames = %q", got)
	}
}

// TestLeakDetectorFindsCanaries: the leakage check can fail.
func TestLeakDetectorFindsCanaries(t *testing.T) {
	canary := "CANARY-0123456789abcdef"
	var buf syncBuffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("handled", slog.String("payload", `{"card":"`+canary+`"}`))
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.applied.WithLabelValues(canary, "order.paid").Inc()
	leaks, err := findLeaks([]string{canary}, buf.String(), []string{"boom: " + canary}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if len(leaks) != 3 {
		t.Fatalf("want leaks in logs, errors and metric labels, got %v", leaks)
	}
	if leaks, _ := findLeaks([]string{canary}, "clean", nil, prometheus.NewRegistry()); len(leaks) != 0 {
		t.Fatalf("false positive: %v", leaks)
	}
}

func TestDemo(t *testing.T) {
	parallelUnlessRace(t)
	var out bytes.Buffer
	d, err := RunDemo(context.Background(), &out, WithEvents(150), WithAggregates(10))
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	f := d.Result.Figures
	if f.Lost != 0 || f.Phantom != 0 || f.DuplicateEffects != 0 || f.FaultsInjected == 0 || f.RolledBack == 0 {
		t.Fatalf("demo figures %+v", f)
	}
	if !strings.Contains(out.String(), "duplicate effects (charges)") {
		t.Fatalf("demo output:\n%s", out.String())
	}
}

// TestPartitionedInbox runs the inbox's scenarios on a partitioned inbox
// (#17, WithPartitionedInbox): redeliveries, a SIGKILLed consumer, gap
// parking and a guarded cleanup with its replay are absorbed as on a plain
// inbox, the claims land in range partitions (not the default), and the
// premature-cleanup control still applies a replayed event twice.
func TestPartitionedInbox(t *testing.T) {
	parallelUnlessRace(t)
	if _, err := Run(context.Background(), WithPartitionedInbox(24*time.Hour)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "partition-inbox") {
		t.Errorf("WithPartitionedInbox on SQLite: %v, want ErrInvalidConfig naming partition-inbox", err)
	}
	pg := testenv.PostgresURL(t)
	if _, err := Run(context.Background(), WithPostgres(pg), WithPartitionedInbox(time.Millisecond)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "partition-inbox must be at least 1s") {
		t.Errorf("WithPartitionedInbox(1ms): %v, want ErrInvalidConfig naming partition-inbox and its limit", err)
	}
	scenarios := []string{"duplicate-delivery", "sequence-gap-reorder", "inbox-sigkill", "cleanup-guarded", "control-premature-cleanup"}
	rep, err := Run(context.Background(), small(WithPostgres(pg), WithPartitionedInbox(24*time.Hour), WithScenarios(scenarios...))...)
	if err != nil {
		t.Fatal(err)
	}
	assertMatrix(t, rep, nil)
	for _, name := range scenarios {
		r, _ := rep.Result(name)
		if !strings.Contains(r.Note, "partitioned inbox: ") || strings.Contains(r.Note, "partitioned inbox: 0 claims in range partitions") {
			t.Errorf("%s: the partitioned inbox was not exercised: note %q", name, r.Note)
		}
	}
}

// TestShardPipeline runs the relay's scenarios with package relay keeping
// up to three batches of a shard in flight (#17 item 3,
// WithShardPipeline): every guarantee holds, the mark-before-ack control
// still loses events, the stalled relay's late mark is fenced, and batches
// of one shard really overlapped.
func TestShardPipeline(t *testing.T) {
	parallelUnlessRace(t)
	if _, err := Run(context.Background(), WithShardPipeline(3)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "shard-pipeline") {
		t.Errorf("WithShardPipeline on SQLite: %v, want ErrInvalidConfig naming shard-pipeline", err)
	}
	pg := testenv.PostgresURL(t)
	if _, err := Run(context.Background(), WithPostgres(pg), WithShardPipeline(3), WithSentWatermark()); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("WithShardPipeline with WithSentWatermark: %v, want ErrInvalidConfig", err)
	}
	// Every scenario runs with the pipeline in .ci/prove's embedded
	// column; these three keep the suite's share short.
	scenarios := []string{"relay-crash-after-publish", "concurrent-relays", "control-mark-before-ack"}
	rep, err := Run(context.Background(), small(WithPostgres(pg), WithShardPipeline(3), WithScenarios(scenarios...))...)
	if err != nil {
		t.Fatal(err)
	}
	assertMatrix(t, rep, nil)
	pipelined := 0
	for _, name := range scenarios {
		r, _ := rep.Result(name)
		var n int
		if i := strings.Index(r.Note, "shard pipeline: "); i >= 0 {
			fmt.Sscanf(r.Note[i+len("shard pipeline: "):], "%d", &n)
		} else if !strings.HasPrefix(name, "control-") {
			t.Errorf("%s: no shard pipeline figure in the note %q", name, r.Note)
		}
		pipelined += n
	}
	if pipelined == 0 {
		t.Error("no batch was claimed beside another of its shard in any scenario: the pipeline was not exercised")
	}
	t.Logf("%d batches claimed beside another of their shard", pipelined)
	if r, _ := rep.Result("concurrent-relays"); r.Figures.FencedWrites == 0 {
		t.Errorf("concurrent-relays: the stalled relay's late mark was not fenced: %+v", r.Figures)
	}
}

// TestSentWatermark runs the relay's scenarios with package relay in the
// watermark design (#17, WithSentWatermark): every guarantee holds as in
// the status design, the mark-before-ack control still loses events, the
// stalled relay's late advance is fenced, and the rows were sent by a
// watermark — read through the design's definition, never written.
func TestSentWatermark(t *testing.T) {
	parallelUnlessRace(t)
	if _, err := Run(context.Background(), WithSentWatermark()); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "sent-watermark") {
		t.Errorf("WithSentWatermark on SQLite: %v, want ErrInvalidConfig naming sent-watermark", err)
	}
	pg := testenv.PostgresURL(t)
	scenarios := []string{"relay-crash-after-publish", "concurrent-relays", "relay-sigkill", "multi-producer-race",
		"relay-clock-skew", "database-outage", "cleanup-guarded", "control-mark-before-ack"}
	rep, err := Run(context.Background(), small(WithPostgres(pg), WithSentWatermark(), WithScenarios(scenarios...))...)
	if err != nil {
		t.Fatal(err)
	}
	assertMatrix(t, rep, nil)
	for _, name := range scenarios {
		r, _ := rep.Result(name)
		if strings.HasPrefix(name, "control-") {
			continue
		}
		if !strings.Contains(r.Note, "watermark design: ") || strings.Contains(r.Note, "watermark design: 0 rows sent by their shard's watermark") {
			t.Errorf("%s: the watermark design was not exercised: note %q", name, r.Note)
		}
	}
	if r, _ := rep.Result("concurrent-relays"); r.Figures.FencedWrites == 0 {
		t.Errorf("concurrent-relays: the stalled relay's late advance was not fenced: %+v", r.Figures)
	}
}
