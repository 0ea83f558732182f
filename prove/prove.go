package prove

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/relay"
)

// Sentinel errors callers branch on.
var (
	// ErrViolation: at least one real scenario reported a violation, or a
	// negative control failed to report one (a checker that cannot fail).
	ErrViolation = errors.New("prove: violations found")
	// ErrUnknownScenario: a requested scenario name does not exist.
	ErrUnknownScenario = errors.New("prove: unknown scenario")
	// ErrScenarioLimit: a scenario had not finished within its hard limit
	// (see WithScenarioLimit) and was stopped; its result is an error
	// naming where it was waiting.
	ErrScenarioLimit = errors.New("prove: scenario exceeded its time limit")
	// ErrInvalidConfig: an option value was rejected; the message names it.
	ErrInvalidConfig = errors.New("prove: invalid configuration")
)

// Status of one scenario run.
const (
	StatusPass         = "pass"          // real scenario, no violation; or control that showed its violation
	StatusFail         = "fail"          // real scenario with violations; or control that showed none
	StatusNotAvailable = "not_available" // the component it needs does not exist on this stack
	StatusError        = "error"         // the harness itself failed (setup, timeout)
)

// config is what the options set.
type config struct {
	seed        int64
	events      int
	aggregates  int
	tenants     int
	producers   int
	duration    time.Duration
	postgresURL string
	mysqlURL    string // MySQL/MariaDB (mysql.go)
	brokerURL   string
	scenarios   []string
	progress    io.Writer
	logger      *slog.Logger
	worker      []string
	ackWait     time.Duration
	// scenarioLimit: the hard limit of one scenario (0: the default,
	// defaultScenarioLimit).
	scenarioLimit time.Duration

	referenceRelay bool // prove's own relay instead of package relay
	sentWatermark  bool // package relay in the watermark design (Postgres)
	shardPipeline  int  // package relay with relay.WithShardPipeline (0: off)
	// partitionInbox: every scenario's inbox is range-partitioned by
	// event id in intervals of this length (migrate.WithPartitionedInbox).
	partitionInbox time.Duration
	referenceInbox bool // prove's own inbox instead of package inbox

	// Tests of the settle logic: a consumer that is slow but correct must
	// not be reported as losing anything. consumerDelay: every start of
	// the consumer (in-process or subprocess) waits this long before it
	// consumes. kafkaDynamic: the Kafka consumer joins without an instance
	// id, so a restarted one waits for the dead member's session.
	// effectDelay: the in-process effect worker starts this long after
	// the pipeline (intents wait, open, meanwhile).
	consumerDelay time.Duration
	kafkaDynamic  bool
	effectDelay   time.Duration

	// broken switches a safety mechanism off in every scenario (tests:
	// a deliberately broken build must be caught by the scenario meant
	// to catch it). "mark-before-ack" or "no-ledger".
	broken string
}

// Option configures Run.
type Option func(*config)

// WithSeed fixes the workload and fault plan. The same seed reproduces the
// deterministic figures (see Figures.Deterministic). Default 1.
func WithSeed(seed int64) Option { return func(c *config) { c.seed = seed } }

// WithEvents sets how many events each scenario's workload plans
// (committed plus rolled back), 10..1,000,000. Default 400.
func WithEvents(n int) Option { return func(c *config) { c.events = n } }

// WithAggregates sets how many orders per tenant the workload spreads over,
// 1..100,000. Default 40.
func WithAggregates(n int) Option { return func(c *config) { c.aggregates = n } }

// WithTenants sets how many tenants share the aggregate ids (2..1000;
// at least two so the tenant-collision check has something to collide).
// Default 3.
func WithTenants(n int) Option { return func(c *config) { c.tenants = n } }

// WithProducers sets the number of concurrent producer goroutines, 1..256.
// Default 4.
func WithProducers(n int) Option { return func(c *config) { c.producers = n } }

// WithDuration bounds how long one scenario may take to settle after its
// workload (a pipeline that never delivers is reported, not waited on
// forever). Default 60s.
func WithDuration(d time.Duration) Option { return func(c *config) { c.duration = d } }

// WithScenarioLimit bounds one scenario's whole run, setup to verdict. A
// scenario still running at the limit — a wait with no end of its own, a
// component that stopped answering — is cancelled, its goroutines' stacks
// are written to the progress writer, and its result is an error wrapping
// ErrScenarioLimit that names the prove functions it was waiting in. The
// default is 4 × the settle duration + 3 minutes (7 minutes at the
// default 60 s): far above any scenario's normal run, which waits at most
// a few settle durations. 1 s .. 24 h.
func WithScenarioLimit(d time.Duration) Option { return func(c *config) { c.scenarioLimit = d } }

// WithPostgres runs against Postgres at url (each scenario in a fresh
// schema, dropped afterwards) instead of SQLite in a temp dir.
func WithPostgres(url string) Option { return func(c *config) { c.postgresURL = url } }

// WithDatabaseURL runs against the database at url: postgres://… (each
// scenario in a fresh schema) or mysql://user:pass@host:port/db (MySQL 8
// or MariaDB 10.6+; each scenario in a fresh database, dropped
// afterwards, so the user needs CREATE and DROP). Default: SQLite in a
// temp dir.
func WithDatabaseURL(url string) Option {
	return func(c *config) {
		if isMySQLURL(url) {
			c.mysqlURL, c.postgresURL = url, ""
		} else {
			c.postgresURL, c.mysqlURL = url, ""
		}
	}
}

// WithBroker runs against a broker instead of the embedded NATS server:
// nats://host:port (JetStream), kafka://kfake (franz-go's in-process
// Kafka), kafka://host:port[,host:port…] (a Kafka cluster) or
// amqp://user:pass@host:port/ (RabbitMQ). Each scenario uses a fresh
// stream, topic or exchange + queue, deleted afterwards. Scenarios a broker
// cannot run (an outage behind a proxy on Kafka, a replay on RabbitMQ)
// report "not available".
func WithBroker(url string) Option { return func(c *config) { c.brokerURL = url } }

// WithScenarios selects scenarios by name (default: all).
func WithScenarios(names ...string) Option {
	return func(c *config) { c.scenarios = append(c.scenarios, names...) }
}

// WithProgress writes a live, overwritten progress line to w (a terminal's
// stderr); nil disables it.
func WithProgress(w io.Writer) Option { return func(c *config) { c.progress = w } }

// WithLogger sets where the pipeline's components log. Default: discard.
// The payload-leakage scenario always captures its own.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithReferenceRelay runs prove's built-in reference relay instead of
// package relay (a second implementation of the same contract, kept to
// cross-check the real one and for stacks the real one does not support).
func WithReferenceRelay() Option { return func(c *config) { c.referenceRelay = true } }

// WithSentWatermark runs package relay in the watermark design
// (relay.WithSentWatermark: acked rows are not written, a per-shard
// watermark says what is sent) and reads every row's state the way that
// design defines it. Postgres only; not with WithReferenceRelay, whose
// relay writes the status column.
func WithSentWatermark() Option { return func(c *config) { c.sentWatermark = true } }

// WithShardPipeline runs package relay with up to depth batches of a shard
// in flight at once (relay.WithShardPipeline; Postgres, status design),
// in-process and in the worker processes alike; each scenario's note says
// how many batches were claimed beside another of their shard.
func WithShardPipeline(depth int) Option { return func(c *config) { c.shardPipeline = depth } }

// WithPartitionedInbox migrates every scenario's database with a
// partitioned inbox (migrate.WithPartitionedInbox(interval): ranges of
// UUIDv7 event ids, a default partition for the rest), so the consumers,
// cleanup and evidence run on it. Postgres only.
func WithPartitionedInbox(interval time.Duration) Option {
	return func(c *config) { c.partitionInbox = interval }
}

// WithReferenceInbox runs prove's built-in reference consumer instead of
// package inbox (a second implementation of the same contract).
func WithReferenceInbox() Option { return func(c *config) { c.referenceInbox = true } }

// withBrokenBuild removes one safety mechanism from every scenario's
// pipeline; unexported because only prove's own tests need it.
func withBrokenBuild(kind string) Option { return func(c *config) { c.broken = kind } }

// withSlowConsumer makes every start of the consumer wait d before it
// consumes (tests only).
func withSlowConsumer(d time.Duration) Option { return func(c *config) { c.consumerDelay = d } }

// withSlowEffects makes the in-process effect worker start d after the
// rest of the pipeline (tests only).
func withSlowEffects(d time.Duration) Option { return func(c *config) { c.effectDelay = d } }

// withKafkaDynamicMembership runs the Kafka consumer without an instance
// id (tests only).
func withKafkaDynamicMembership() Option { return func(c *config) { c.kafkaDynamic = true } }

// WithWorkerCommand is the argv that starts this program as a prove worker
// subprocess (for `ferry`: the executable plus "prove", "worker"). Without
// it the process-level SIGKILL scenario reports "not available".
func WithWorkerCommand(argv ...string) Option { return func(c *config) { c.worker = argv } }

func (c *config) validate() error {
	bad := func(field, reason string) error { return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, reason) }
	switch {
	case c.events < 10 || c.events > 1_000_000:
		return bad("events", fmt.Sprintf("must be in 10..1000000, got %d", c.events))
	case c.aggregates < 1 || c.aggregates > 100_000:
		return bad("aggregates", fmt.Sprintf("must be in 1..100000, got %d", c.aggregates))
	case c.tenants < 2 || c.tenants > 1000:
		return bad("tenants", fmt.Sprintf("must be in 2..1000, got %d", c.tenants))
	case c.producers < 1 || c.producers > 256:
		return bad("producers", fmt.Sprintf("must be in 1..256, got %d", c.producers))
	case c.duration < time.Second:
		return bad("duration", fmt.Sprintf("must be at least 1s, got %s", c.duration))
	case c.scenarioLimit != 0 && (c.scenarioLimit < time.Second || c.scenarioLimit > 24*time.Hour):
		return bad("scenario-limit", fmt.Sprintf("must be in 1s..24h (or 0 for the default), got %s", c.scenarioLimit))
	}
	if c.postgresURL != "" && !strings.HasPrefix(c.postgresURL, "postgres://") && !strings.HasPrefix(c.postgresURL, "postgresql://") {
		return bad("database-url", "must be a postgres:// or mysql:// URL")
	}
	if c.sentWatermark && c.postgresURL == "" {
		return bad("sent-watermark", "needs Postgres (--database-url postgres://…): the watermark design relies on Postgres snapshots")
	}
	if c.partitionInbox != 0 && c.postgresURL == "" {
		return bad("partition-inbox", "needs Postgres (--database-url postgres://…): only Postgres partitions the inbox")
	}
	if c.partitionInbox != 0 && c.partitionInbox < time.Second {
		return bad("partition-inbox", fmt.Sprintf("must be at least 1s, got %s", c.partitionInbox))
	}
	if c.shardPipeline != 0 {
		switch {
		case c.shardPipeline < 2 || c.shardPipeline > relay.MaxShardPipeline:
			return bad("shard-pipeline", fmt.Sprintf("must be in 2..%d, got %d", relay.MaxShardPipeline, c.shardPipeline))
		case c.postgresURL == "":
			return bad("shard-pipeline", "needs Postgres (--database-url postgres://…)")
		case c.sentWatermark:
			return bad("shard-pipeline", "cannot be combined with sent-watermark: the watermark design keeps one batch per shard")
		case c.referenceRelay:
			return bad("shard-pipeline", "cannot be combined with reference-relay: it is an option of package relay")
		}
	}
	if c.sentWatermark && c.referenceRelay {
		return bad("sent-watermark", "cannot be combined with reference-relay: the reference relay writes the status column")
	}
	if c.brokerURL != "" && c.brokerURL != BrokerNATSCluster {
		ok := false
		for _, p := range []string{"nats://", "amqp://", "amqps://", "kafka://"} {
			ok = ok || strings.HasPrefix(c.brokerURL, p)
		}
		if !ok {
			return bad("broker", "must be nats://, amqp://, kafka:// or "+BrokerNATSCluster)
		}
	}
	for _, n := range c.scenarios {
		if _, ok := lookupScenario(n); !ok {
			return fmt.Errorf("%w: %q (see ferry prove --list)", ErrUnknownScenario, n)
		}
	}
	return nil
}

// Report is the outcome of a run.
type Report struct {
	Seed    int64         `json:"seed"`
	Stack   string        `json:"stack"`
	Events  int           `json:"events_per_scenario"`
	Elapsed time.Duration `json:"elapsed_ns"`
	Results []Result      `json:"results"`
}

// Result is one scenario's verdict and figures.
type Result struct {
	Scenario    string `json:"scenario"`
	Description string `json:"description"`
	// Control marks a negative control: a deliberately broken pipeline
	// that must show violations.
	Control bool   `json:"control"`
	Status  string `json:"status"`
	// Components says which pipeline pieces ran: "ferry:outbox" for the
	// real package, "prove:relay" for prove's reference implementation.
	Components []string      `json:"components"`
	Figures    Figures       `json:"figures"`
	Violations []string      `json:"violations,omitempty"`
	Note       string        `json:"note,omitempty"`
	Elapsed    time.Duration `json:"elapsed_ns"`
}

// Failed reports whether the run must exit non-zero: a real scenario with
// a violation or an error, or a control that showed no violation.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Status == StatusFail || res.Status == StatusError {
			return true
		}
	}
	return false
}

// Result returns the result of scenario name.
func (r *Report) Result(name string) (Result, bool) {
	for _, res := range r.Results {
		if res.Scenario == name {
			return res, true
		}
	}
	return Result{}, false
}

// Run executes the selected scenarios one after another, each on a fresh
// database and stream, and returns the report. The error is non-nil only
// when the run could not be carried out (bad options, no broker); check
// Report.Failed for the verdict.
func Run(ctx context.Context, opts ...Option) (*Report, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	names := cfg.scenarios
	if len(names) == 0 {
		for _, s := range allScenarios() {
			names = append(names, s.name)
		}
	}
	start := time.Now()
	st, err := openStack(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer st.close()
	rep := &Report{Seed: cfg.seed, Stack: st.describe(), Events: cfg.events}
	prog := newProgress(cfg.progress)
	defer prog.done()
	for i, n := range names {
		sc, _ := lookupScenario(n)
		prog.scenario(i+1, len(names), n)
		res := runScenario(ctx, &cfg, st, sc, prog)
		rep.Results = append(rep.Results, res)
		if ctx.Err() != nil {
			break
		}
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// newConfig applies opts over the defaults and validates the result (Run
// and RunSoak share it).
func newConfig(opts []Option) (config, error) {
	cfg := config{seed: 1, events: 400, aggregates: 40, tenants: 3, producers: 4, duration: 60 * time.Second, ackWait: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return config{}, err
	}
	if cfg.logger == nil {
		cfg.logger = discardLogger()
	}
	return cfg, nil
}

// ScenarioInfo describes a scenario for listings.
type ScenarioInfo struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Control     bool   `json:"control"`
}

// Scenarios lists every scenario in run order.
func Scenarios() []ScenarioInfo {
	var out []ScenarioInfo
	for _, s := range allScenarios() {
		out = append(out, ScenarioInfo{Name: s.name, Description: s.desc, Control: s.control})
	}
	return out
}

func lookupScenario(name string) (*scenario, bool) {
	all := allScenarios()
	i := slices.IndexFunc(all, func(s *scenario) bool { return s.name == name })
	if i < 0 {
		return nil, false
	}
	return all[i], true
}

// progress draws one overwritten status line. Producers and the settle
// loop update it from several goroutines.
type progress struct {
	w     io.Writer
	mu    sync.Mutex
	label string
	last  time.Time
	tty   bool // redraw in place; else plain lines at a modest rate
}

// newProgress draws on w: an overwritten line on a terminal; elsewhere (a
// pipe, a file, a CI log) plain lines, at most one per plainEvery per
// scenario, so a log is not thousands of carriage-return redraws.
func newProgress(w io.Writer) *progress { return &progress{w: w, tty: isTerminal(w)} }

// plainEvery is how often a progress line is written when w is not a
// terminal.
const plainEvery = 5 * time.Second

func (p *progress) scenario(i, n int, name string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label = fmt.Sprintf("[%d/%d] %s", i, n, name)
	p.line("starting")
}

func (p *progress) update(format string, args ...any) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	every := 100 * time.Millisecond
	if !p.tty {
		every = plainEvery
	}
	if time.Since(p.last) < every {
		return
	}
	p.line(fmt.Sprintf(format, args...))
}

// line writes s; the caller holds mu.
func (p *progress) line(s string) {
	p.last = time.Now()
	if p.label != "" {
		s = p.label + ": " + s
	}
	if !p.tty {
		fmt.Fprintln(p.w, s)
		return
	}
	fmt.Fprintf(p.w, "\r\033[K%s", s)
}

// dump writes a heading and a block of text (a scenario's stacks) on
// their own lines, whatever the writer.
func (p *progress) dump(heading, text string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	fmt.Fprintf(p.w, "%s: %s\n%s\n", p.label, heading, text)
	p.last = time.Now()
}

func (p *progress) done() {
	if p.w != nil && p.tty {
		p.mu.Lock()
		defer p.mu.Unlock()
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
