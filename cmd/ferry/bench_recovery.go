package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/migrate"
)

// Recovery benchmark: a consumer subprocess (`ferry bench consume worker`)
// applies a published backlog through the inbox into Postgres; when a
// fraction of it is applied the parent SIGKILLs it and starts another with
// the same identity (durable, group and instance id, queue), and measures
// from that start to the new process's first delivery and to the last
// event applied.

// recoveryBrokers are the --brokers the benchmark knows.
var recoveryBrokers = []string{"nats-embedded", "nats-system", "kafka", "rabbitmq"}

type recoveryConfig struct {
	db           string
	brokers      []string
	natsURL      string
	rabbitURL    string
	events       int
	aggregates   int
	workers      int
	rounds       int
	killAt       float64
	natsAckWait  time.Duration
	kafkaStatic  bool
	kafkaSession time.Duration
	timeout      time.Duration
	exe          []string
}

// recoveryRound is one kill and restart.
type recoveryRound struct {
	Broker        string  `json:"broker"`
	Round         int     `json:"round"`
	AppliedAtKill int64   `json:"applied_at_kill"`
	FirstDelivery float64 `json:"restart_to_first_delivery_s"`
	Drain         float64 `json:"restart_to_drained_s"`
	// FirstRedelivery is restart → the first message the broker marks as
	// delivered before (Delivery.Attempt > 1): how long the dead
	// consumer's messages were held. -1 when none was marked (Kafka counts
	// attempts per process, so a restart never marks one).
	FirstRedelivery float64 `json:"restart_to_first_redelivery_s"`
	// ApplyRate is the killed consumer's events/s from its start to the
	// kill; Overhead is Drain less the time the rest takes at that rate:
	// what the crash cost beyond the work itself.
	ApplyRate      float64 `json:"first_consumer_events_per_s"`
	Overhead       float64 `json:"recovery_overhead_s"`
	Events         int     `json:"events"`
	Applied        int64   `json:"applied"`
	DistinctEvents int64   `json:"distinct_events"`
}

// recoverySummary is the median of a broker's rounds.
type recoverySummary struct {
	Broker        string  `json:"broker"`
	Settings      string  `json:"settings"`
	Rounds        int     `json:"rounds"`
	FirstDelivery float64 `json:"median_restart_to_first_delivery_s"`
	Drain         float64 `json:"median_restart_to_drained_s"`
	Redelivery    float64 `json:"median_restart_to_first_redelivery_s"`
	Overhead      float64 `json:"median_recovery_overhead_s"`
	Error         string  `json:"error,omitempty"`
}

type recoveryReport struct {
	Summary []recoverySummary `json:"summary"`
	Rounds  []recoveryRound   `json:"rounds"`
}

func (c *recoveryConfig) check() error {
	if c.db == "" || !strings.HasPrefix(c.db, "postgres") {
		return fmt.Errorf("--recovery needs a Postgres --database-url (or FERRY_DATABASE_URL)")
	}
	if c.events < 10 || c.aggregates < 1 || c.workers < 1 || c.rounds < 1 {
		return fmt.Errorf("--recovery: --events >= 10, --aggregates, --workers and --rounds >= 1")
	}
	if c.killAt <= 0 || c.killAt >= 1 {
		return fmt.Errorf("--kill-at must be in (0, 1), got %g", c.killAt)
	}
	for _, b := range c.brokers {
		if !slices.Contains(recoveryBrokers, b) {
			return fmt.Errorf("--brokers: unknown %q (one of %s)", b, strings.Join(recoveryBrokers, ", "))
		}
	}
	return nil
}

func (c *recoveryConfig) settings(b string) string {
	switch b {
	case "kafka":
		s := fmt.Sprintf("session timeout %s, dynamic membership", c.kafkaSession)
		if c.kafkaStatic {
			s = fmt.Sprintf("session timeout %s, static membership (WithInstanceID)", c.kafkaSession)
		}
		return s + ", cooperative-sticky"
	case "rabbitmq":
		return fmt.Sprintf("prefetch %d", rabbitmq.DefaultPrefetch)
	default:
		return fmt.Sprintf("ack wait %s, max ack pending %d", c.natsAckWait, natsjs.DefaultMaxAckPending)
	}
}

// runRecovery runs every broker's rounds and prints the report.
func runRecovery(ctx context.Context, w io.Writer, progress io.Writer, c recoveryConfig, asJSON bool) error {
	if err := c.check(); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, c.db)
	if err != nil {
		return fmt.Errorf("database-url: %w", err)
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pgxv5.New(pool), ferry.Tables{}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_recovery_effects (
		run text NOT NULL, event_id uuid NOT NULL, aggregate_id text NOT NULL, seq bigint NOT NULL, PRIMARY KEY (run, event_id))`); err != nil {
		return err
	}
	var rep recoveryReport
	for _, b := range c.brokers {
		sum := recoverySummary{Broker: b, Settings: c.settings(b)}
		rounds, err := recoveryBroker(ctx, pool, c, b, progress)
		rep.Rounds = append(rep.Rounds, rounds...)
		if err != nil {
			sum.Error = err.Error()
		}
		if len(rounds) > 0 {
			var first, drain, over, redel []float64
			for _, r := range rounds {
				first, drain, over, redel = append(first, r.FirstDelivery), append(drain, r.Drain), append(over, r.Overhead), append(redel, r.FirstRedelivery)
			}
			sum.Rounds, sum.FirstDelivery, sum.Drain, sum.Overhead, sum.Redelivery = len(rounds), median(first), median(drain), median(over), median(redel)
		}
		rep.Summary = append(rep.Summary, sum)
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "broker\tround\tapplied at kill\trate before kill (ev/s)\trestart→first delivery (s)\trestart→first redelivery (s)\trestart→drained (s)\toverhead (s)\tapplied/distinct")
	for _, r := range rep.Rounds {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%d/%d\n", r.Broker, r.Round, r.AppliedAtKill, r.ApplyRate, r.FirstDelivery, r.FirstRedelivery, r.Drain, r.Overhead, r.Applied, r.DistinctEvents)
	}
	fmt.Fprintln(tw, "\nbroker\tsettings\trounds\tmedian first delivery (s)\tmedian first redelivery (s)\tmedian drained (s)\tmedian overhead (s)\terror")
	for _, s := range rep.Summary {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%s\n", s.Broker, s.Settings, s.Rounds, s.FirstDelivery, s.Redelivery, s.Drain, s.Overhead, s.Error)
	}
	return tw.Flush()
}

// recoveryEnv is one broker's setup: where the children connect and how a
// round's destination is made and filled.
type recoveryEnv struct {
	url      string
	prepare  func(ctx context.Context, run string) (dest string, cleanup func(), err error)
	publish  func(ctx context.Context, dest string, evs []ferry.Event) error
	closeEnv func()
}

func recoveryBroker(ctx context.Context, pool *pgxpool.Pool, c recoveryConfig, b string, progress io.Writer) ([]recoveryRound, error) {
	env, err := newRecoveryEnv(ctx, c, b)
	if err != nil {
		return nil, err
	}
	defer env.closeEnv()
	var out []recoveryRound
	for round := 1; round <= c.rounds; round++ {
		r, err := recoveryOnce(ctx, pool, c, b, env, round)
		if err != nil {
			return out, fmt.Errorf("round %d: %w", round, err)
		}
		fmt.Fprintf(progress, "bench recovery %s round %d: first delivery %.2fs, drained %.2fs after restart\n", b, round, r.FirstDelivery, r.Drain)
		out = append(out, r)
	}
	return out, nil
}

func newRecoveryEnv(ctx context.Context, c recoveryConfig, b string) (*recoveryEnv, error) {
	switch b {
	case "nats-embedded", "nats-system":
		url := c.natsURL
		closeEnv := func() {}
		if b == "nats-embedded" {
			emb, err := natsembed.Start()
			if err != nil {
				return nil, err
			}
			url, closeEnv = emb.ClientURL(), func() { _ = emb.Close() }
		}
		nc, err := natsjs.Connect(url)
		if err != nil {
			closeEnv()
			return nil, fmt.Errorf("nats %s: %w", url, err)
		}
		pub, err := natsjs.NewPublisher(nc)
		if err != nil {
			nc.Close()
			closeEnv()
			return nil, err
		}
		return &recoveryEnv{
			url: url,
			prepare: func(ctx context.Context, run string) (string, func(), error) {
				stream := "BENCH_RECOVERY_" + run
				if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: stream, Subjects: []string{"benchrec." + run}}); err != nil {
					return "", nil, err
				}
				return stream, func() { _ = pub.JetStream().DeleteStream(context.Background(), stream) }, nil
			},
			publish: func(ctx context.Context, dest string, evs []ferry.Event) error {
				return publishAll(ctx, pub, evs)
			},
			closeEnv: func() { _ = pub.Close(); nc.Close(); closeEnv() },
		}, nil
	case "kafka":
		topics := make([]string, c.rounds)
		for i := range topics {
			topics[i] = fmt.Sprintf("bench-recovery-%d", i+1)
		}
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topics...))
		if err != nil {
			return nil, err
		}
		addrs := cluster.ListenAddrs()
		pub, err := kafka.NewPublisher(addrs)
		if err != nil {
			cluster.Close()
			return nil, err
		}
		round := 0
		return &recoveryEnv{
			url: strings.Join(addrs, ","),
			prepare: func(context.Context, string) (string, func(), error) {
				round++
				return topics[round-1], func() {}, nil
			},
			publish: func(ctx context.Context, _ string, evs []ferry.Event) error {
				return publishAll(ctx, pub, evs)
			},
			closeEnv: func() { _ = pub.Close(); cluster.Close() },
		}, nil
	case "rabbitmq":
		url := c.rabbitURL
		pub, err := rabbitmq.NewPublisher(url, rabbitmq.WithExchange("ferry-bench-recovery"))
		if err != nil {
			return nil, err
		}
		return &recoveryEnv{
			url: url,
			prepare: func(ctx context.Context, run string) (string, func(), error) {
				top := rabbitmq.Topology{Exchange: "ferry-bench-recovery", Queue: "ferry-bench-recovery-" + run, BindingKeys: []string{"benchrec." + run}}
				if err := rabbitmq.EnsureTopology(ctx, url, top); err != nil {
					return "", nil, fmt.Errorf("rabbitmq %s: %w", redactURL(url), err)
				}
				return top.Queue, func() {
					_ = rabbitmq.DeleteTopology(context.Background(), url, rabbitmq.Topology{Exchange: top.Exchange, Queue: top.Queue})
				}, nil
			},
			publish: func(ctx context.Context, _ string, evs []ferry.Event) error {
				return publishAll(ctx, pub, evs)
			},
			closeEnv: func() { _ = pub.Close() },
		}, nil
	}
	return nil, fmt.Errorf("unknown broker %q", b)
}

func publishAll(ctx context.Context, pub broker.Publisher, evs []ferry.Event) error {
	for start := 0; start < len(evs); start += 500 {
		for _, r := range pub.Publish(ctx, evs[start:min(len(evs), start+500)]) {
			if r.Err != nil {
				return r.Err
			}
		}
	}
	return nil
}

func recoveryOnce(ctx context.Context, pool *pgxpool.Pool, c recoveryConfig, b string, env *recoveryEnv, round int) (recoveryRound, error) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	res := recoveryRound{Broker: b, Round: round, Events: c.events}
	dest, cleanup, err := env.prepare(ctx, run)
	if err != nil {
		return res, err
	}
	defer cleanup()
	topic := "benchrec." + run
	if b == "kafka" {
		topic = dest
	}
	evs := make([]ferry.Event, 0, c.events)
	now := time.Now().UTC()
	for i := range c.events {
		id, err := ferry.NewEventID()
		if err != nil {
			return res, err
		}
		evs = append(evs, ferry.Event{ID: id, TenantID: "bench", AggregateType: "order", AggregateID: fmt.Sprintf("%s-%d", run, i%c.aggregates),
			AggregateSeq: int64(i/c.aggregates + 1), EventType: "order.paid", SchemaVersion: 1, ContentType: "application/json",
			Payload: []byte(`{"qty":1}`), OccurredAt: now, Topic: topic})
	}
	if err := env.publish(ctx, dest, evs); err != nil {
		return res, fmt.Errorf("publish: %w", err)
	}
	applied := func() (n, distinct int64, err error) {
		err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM bench_recovery_effects WHERE run = $1`, run).Scan(&n, &distinct)
		return n, distinct, err
	}
	args := []string{"bench", "consume", "worker", "--broker", b, "--url", env.url, "--dest", dest, "--run", run,
		"--database-url", c.db, "--workers", strconv.Itoa(c.workers), "--nats-ack-wait", c.natsAckWait.String(),
		"--kafka-session-timeout", c.kafkaSession.String(), "--kafka-static=" + strconv.FormatBool(c.kafkaStatic)}
	started := time.Now()
	first, err := startWorker(ctx, c.exe, args)
	if err != nil {
		return res, err
	}
	defer first.stop()
	deadline := time.Now().Add(c.timeout)
	killAt := int64(float64(c.events) * c.killAt)
	for {
		n, _, err := applied()
		if err != nil {
			return res, err
		}
		if n >= killAt {
			res.AppliedAtKill = n
			res.ApplyRate = float64(n) / time.Since(started).Seconds()
			break
		}
		if first.exited() || time.Now().After(deadline) {
			return res, fmt.Errorf("first consumer applied %d of %d before the kill point %d: %s", n, c.events, killAt, first.stderrText())
		}
		time.Sleep(10 * time.Millisecond)
	}
	first.stop() // SIGKILL
	restart := time.Now()
	second, err := startWorker(ctx, c.exe, args)
	if err != nil {
		return res, err
	}
	defer second.stop()
	var firstAt time.Time
	deadline = time.Now().Add(c.timeout)
	for {
		if firstAt.IsZero() {
			firstAt = second.firstDelivery()
		}
		n, distinct, err := applied()
		if err != nil {
			return res, err
		}
		res.Applied, res.DistinctEvents = n, distinct
		if distinct >= int64(c.events) && !firstAt.IsZero() {
			res.Drain = time.Since(restart).Seconds()
			break
		}
		if second.exited() || time.Now().After(deadline) {
			return res, fmt.Errorf("restarted consumer: %d of %d applied after %s: %s", distinct, c.events, time.Since(restart).Round(time.Millisecond), second.stderrText())
		}
		time.Sleep(10 * time.Millisecond)
	}
	res.FirstDelivery = firstAt.Sub(restart).Seconds()
	res.FirstRedelivery = -1
	if at := second.firstRedelivery(); !at.IsZero() {
		res.FirstRedelivery = at.Sub(restart).Seconds()
	}
	res.Overhead = res.Drain - float64(int64(c.events)-res.AppliedAtKill)/res.ApplyRate
	return res, nil
}

// worker is one consumer subprocess.
type worker struct {
	cmd    *exec.Cmd
	done   chan struct{}
	mu     sync.Mutex
	first  time.Time
	redel  time.Time
	stderr strings.Builder
	once   sync.Once
}

func startWorker(ctx context.Context, exe, args []string) (*worker, error) {
	cmd := exec.CommandContext(ctx, exe[0], append(slices.Clone(exe[1:]), args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: &w.stderr, mu: &w.mu}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start consumer: %w", err)
	}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			kind, ns, ok := strings.Cut(sc.Text(), " ")
			v, err := strconv.ParseInt(ns, 10, 64)
			if !ok || err != nil {
				continue
			}
			w.mu.Lock()
			switch kind {
			case "FIRST-DELIVERY":
				w.first = time.Unix(0, v)
			case "FIRST-REDELIVERY":
				w.redel = time.Unix(0, v)
			}
			w.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	return w, nil
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (w *worker) firstDelivery() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.first
}

func (w *worker) firstRedelivery() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.redel
}

func (w *worker) exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *worker) stderrText() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := strings.TrimSpace(w.stderr.String())
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	if s == "" {
		return "(no output)"
	}
	return s
}

// stop SIGKILLs the process and waits for it.
func (w *worker) stop() {
	w.once.Do(func() {
		_ = w.cmd.Process.Kill()
		<-w.done
	})
}

// firstDeliveryConsumer reports the first delivery on out as
// "FIRST-DELIVERY <unix ns>" and the first redelivery (Attempt > 1: the
// broker delivered it before, to the killed process) as
// "FIRST-REDELIVERY <unix ns>".
type firstDeliveryConsumer struct {
	broker.Consumer
	out         io.Writer
	once, again sync.Once
}

func (f *firstDeliveryConsumer) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	return f.Consumer.Consume(ctx, func(ctx context.Context, d *broker.Delivery) {
		f.once.Do(func() { fmt.Fprintf(f.out, "FIRST-DELIVERY %d\n", time.Now().UnixNano()) })
		if d.Attempt > 1 {
			f.again.Do(func() { fmt.Fprintf(f.out, "FIRST-REDELIVERY %d\n", time.Now().UnixNano()) })
		}
		handle(ctx, d)
	})
}

// newBenchConsumeWorkerCmd is the consumer subprocess of --recovery.
func newBenchConsumeWorkerCmd() *cobra.Command {
	var (
		kind, url, dest, run, db string
		workers                  int
		ackWait, session         time.Duration
		static                   bool
	)
	cmd := &cobra.Command{
		Use:    "worker",
		Short:  "Consumer subprocess of bench consume --recovery",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			cfg, err := pgxpool.ParseConfig(db)
			if err != nil {
				return fmt.Errorf("database-url: %w", err)
			}
			cfg.MaxConns = int32(workers + 2)
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				return err
			}
			defer pool.Close()
			handler := func(ctx context.Context, tx pgx.Tx, ev ferry.Event) error {
				_, err := tx.Exec(ctx, `INSERT INTO bench_recovery_effects (run, event_id, aggregate_id, seq) VALUES ($1, $2, $3, $4)`,
					run, ev.ID.String(), ev.AggregateID, ev.AggregateSeq)
				return err
			}
			ib, err := inbox.New[pgx.Tx](pgxv5.New(pool), "bench-recovery-"+run, handler, inbox.WithWorkers(workers),
				inbox.WithLogger(slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))))
			if err != nil {
				return err
			}
			var c broker.Consumer
			switch kind {
			case "nats-embedded", "nats-system":
				c, err = natsjs.DialConsumer(ctx, url, dest, "bench-recovery", natsjs.WithAckWait(ackWait))
			case "kafka":
				opts := []kafka.Option{kafka.WithSessionTimeout(session), kafka.WithHeartbeatInterval(min(kafka.DefaultHeartbeatInterval, session/3))}
				if static {
					opts = append(opts, kafka.WithInstanceID("bench-recovery-1"))
				}
				c, err = kafka.NewConsumer(strings.Split(url, ","), "bench-recovery-"+run, []string{dest}, opts...)
			case "rabbitmq":
				c, err = rabbitmq.NewConsumer(url, dest)
			default:
				err = fmt.Errorf("--broker: unknown %q", kind)
			}
			if err != nil {
				return err
			}
			defer c.Close()
			err = ib.Run(ctx, &firstDeliveryConsumer{Consumer: c, out: cmd.OutOrStdout()})
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&kind, "broker", "", "one of "+strings.Join(recoveryBrokers, ", "))
	fl.StringVar(&url, "url", "", "broker URL (Kafka: comma-separated seeds)")
	fl.StringVar(&dest, "dest", "", "stream, topic or queue")
	fl.StringVar(&run, "run", "", "run id")
	fl.StringVar(&db, "database-url", "", "Postgres URL")
	fl.IntVar(&workers, "workers", 8, "inbox workers")
	fl.DurationVar(&ackWait, "nats-ack-wait", natsjs.DefaultAckWait, "JetStream ack wait")
	fl.DurationVar(&session, "kafka-session-timeout", kafka.DefaultSessionTimeout, "Kafka session timeout")
	fl.BoolVar(&static, "kafka-static", true, "Kafka static membership (WithInstanceID)")
	return cmd
}
