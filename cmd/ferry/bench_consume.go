package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/migrate"
)

func newBenchConsumeCmd() *cobra.Command {
	var (
		sf         storeFlags
		natsURL    string
		events     int
		aggregates int
		workers    int
		batches    []int
		asJSON     bool
		recovery   bool
		rc         recoveryConfig
	)
	cmd := &cobra.Command{
		Use:   "consume",
		Short: "Consumer apply rate: NATS JetStream → inbox → Postgres or MySQL, tx per message vs batch",
		Long: `Publishes --events events over --aggregates aggregates into a JetStream
stream (an embedded server unless --nats-url is given), then runs an inbox
consumer over them with a handler that writes one row, once per --batch
value (1 = one transaction per message), and reports events applied per
second from the first delivery to the last commit. Each run uses its own
stream and consumer name. Creates bench_consume_effects and Ferry's tables
in the connection's search_path.

--recovery measures instead how fast a consumer comes back after a crash,
per broker (--brokers): it publishes --events, runs a consumer subprocess
(the inbox over Postgres, --workers), SIGKILLs it once --kill-at of the
events are applied, starts another with the same identity (durable,
group and instance id, queue) and reports restart → first delivery and
restart → every event applied, for --rounds rounds and their median.
Kafka runs on kfake in this process, NATS embedded or the server at
--nats-url, RabbitMQ at --rabbitmq-url.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			ctx := cmd.Context()
			if recovery {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("bench consume --recovery: locate own executable: %w", err)
				}
				rc.db, rc.exe = sf.url, []string{exe}
				if natsURL != "" {
					rc.natsURL = natsURL
				}
				rc.events, rc.aggregates, rc.workers = events, aggregates, workers
				return runRecovery(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), rc, asJSON)
			}
			if sf.url == "" {
				return fmt.Errorf("no database: set --database-url or FERRY_DATABASE_URL (Postgres or MySQL)")
			}
			if events < 1 || aggregates < 1 || workers < 1 {
				return fmt.Errorf("--events, --aggregates and --workers must be >= 1")
			}
			var run func(b int, url string) (float64, error)
			if strings.HasPrefix(sf.url, "mysql://") {
				drv, drop, err := benchMySQLScratch(ctx, sf.url, "ferry_bench_consume_"+benchRandHex(), workers+4)
				if err != nil {
					return err
				}
				defer drop()
				if _, err := drv.Executor().Exec(ctx, `CREATE TABLE bench_consume_effects (
				event_id char(36) PRIMARY KEY, aggregate_id varchar(200) NOT NULL, seq bigint NOT NULL)`); err != nil {
					return err
				}
				handler := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO bench_consume_effects (event_id, aggregate_id, seq) VALUES (?, ?, ?)`,
						ev.ID.String(), ev.AggregateID, ev.AggregateSeq)
					return err
				}
				run = func(b int, url string) (float64, error) {
					return benchConsumeOnce(ctx, drv, handler, ferry.Tables{}, url, events, aggregates, workers, b)
				}
			}
			if run == nil {
				cfg, err := pgxpool.ParseConfig(sf.url)
				if err != nil {
					return fmt.Errorf("database-url: %w", err)
				}
				cfg.MaxConns = int32(workers + 4)
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				if err != nil {
					return err
				}
				defer pool.Close()
				drv := pgxv5.New(pool)
				if _, err := migrate.Up(ctx, drv, sf.tables()); err != nil {
					return err
				}
				if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_consume_effects (
				event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, seq bigint NOT NULL)`); err != nil {
					return err
				}
				handler := func(ctx context.Context, tx pgx.Tx, ev ferry.Event) error {
					_, err := tx.Exec(ctx, `INSERT INTO bench_consume_effects (event_id, aggregate_id, seq) VALUES ($1, $2, $3)`,
						ev.ID.String(), ev.AggregateID, ev.AggregateSeq)
					return err
				}
				run = func(b int, url string) (float64, error) {
					return benchConsumeOnce(ctx, drv, handler, sf.tables(), url, events, aggregates, workers, b)
				}
			}
			url := natsURL
			if url == "" {
				emb, err := natsembed.Start()
				if err != nil {
					return err
				}
				defer emb.Close()
				url = emb.ClientURL()
			}
			type row struct {
				Batch     int     `json:"batch"`
				Events    int     `json:"events"`
				Seconds   float64 `json:"seconds"`
				PerSecond float64 `json:"events_per_sec"`
			}
			var out []row
			for _, b := range batches {
				secs, err := run(b, url)
				if err != nil {
					return err
				}
				out = append(out, row{Batch: b, Events: events, Seconds: secs, PerSecond: float64(events) / secs})
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "batch\tevents\tseconds\tevents/s")
			for _, r := range out {
				fmt.Fprintf(tw, "%d\t%d\t%.2f\t%.0f\n", r.Batch, r.Events, r.Seconds, r.PerSecond)
			}
			return tw.Flush()
		},
	}
	sf.register(cmd)
	cmd.Flags().StringVar(&natsURL, "nats-url", "", "NATS server with JetStream (default: an embedded server)")
	cmd.Flags().IntVar(&events, "events", 20000, "events to publish and apply per run")
	cmd.Flags().IntVar(&aggregates, "aggregates", 1000, "aggregates the events are spread over")
	cmd.Flags().IntVar(&workers, "workers", 8, "inbox workers (parallel aggregates)")
	cmd.Flags().IntSliceVar(&batches, "batch", []int{1, 100}, "batch sizes to run (1 = one transaction per message)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	fl := cmd.Flags()
	fl.BoolVar(&recovery, "recovery", false, "measure recovery after a SIGKILLed consumer instead of the apply rate")
	fl.StringSliceVar(&rc.brokers, "brokers", recoveryBrokers, "--recovery: brokers to measure ("+strings.Join(recoveryBrokers, ", ")+")")
	fl.StringVar(&rc.rabbitURL, "rabbitmq-url", "amqp://guest:guest@127.0.0.1:5672/", "--recovery: RabbitMQ URL")
	fl.IntVar(&rc.rounds, "rounds", 3, "--recovery: kills per broker (the median is reported)")
	fl.Float64Var(&rc.killAt, "kill-at", 0.3, "--recovery: fraction of the events applied when the consumer is killed")
	fl.DurationVar(&rc.natsAckWait, "nats-ack-wait", natsjs.DefaultAckWait, "--recovery: JetStream ack wait")
	fl.BoolVar(&rc.kafkaStatic, "kafka-static", true, "--recovery: Kafka static membership (kafka.WithInstanceID)")
	fl.DurationVar(&rc.kafkaSession, "kafka-session-timeout", 10*time.Second, "--recovery: Kafka session timeout (kafka.WithSessionTimeout)")
	fl.DurationVar(&rc.timeout, "round-timeout", 2*time.Minute, "--recovery: limit on each phase of a round")
	rc.natsURL = "nats://127.0.0.1:4222"
	cmd.AddCommand(newBenchConsumeWorkerCmd())
	return cmd
}

// benchConsumeOnce publishes events into a fresh stream and times one
// inbox consumer applying them all.
func benchConsumeOnce[TTx any](ctx context.Context, drv driver.Driver[TTx], handler inbox.Handler[TTx], tables ferry.Tables, url string, events, aggregates, workers, batch int) (float64, error) {
	run := fmt.Sprintf("b%d", time.Now().UnixNano())
	nc, err := natsjs.Connect(url)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	stream, subject := "BENCH_"+run, "bench."+run
	if _, err := natsjs.EnsureStream(ctx, pub.JetStream(), natsjs.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		return 0, err
	}
	defer func() { _ = pub.JetStream().DeleteStream(context.WithoutCancel(ctx), stream) }()
	evs := make([]ferry.Event, 0, 1000)
	now := time.Now().UTC()
	for i := range events {
		id, err := ferry.NewEventID()
		if err != nil {
			return 0, err
		}
		evs = append(evs, ferry.Event{ID: id, TenantID: "bench", AggregateType: "order", AggregateID: fmt.Sprintf("%s-%d", run, i%aggregates),
			AggregateSeq: int64(i/aggregates + 1), EventType: "order.paid", SchemaVersion: 1, ContentType: "application/json",
			Payload: []byte(`{"qty":1}`), OccurredAt: now, Topic: subject})
		if len(evs) == cap(evs) || i == events-1 {
			for _, r := range pub.Publish(ctx, evs) {
				if r.Err != nil {
					return 0, r.Err
				}
			}
			evs = evs[:0]
		}
	}
	ib, err := inbox.New[TTx](drv, "bench-"+run, handler, inbox.WithTables(tables),
		inbox.WithWorkers(workers), inbox.WithBatch(batch, 2*time.Millisecond), inbox.WithQueue(256),
		inbox.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return 0, err
	}
	consumer, err := natsjs.NewConsumer(ctx, nc, stream, "bench", natsjs.WithMaxAckPending(4096))
	if err != nil {
		return 0, err
	}
	defer consumer.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- ib.Run(runCtx, consumer) }()
	for ib.Stats().Applied < int64(events) {
		select {
		case err := <-done:
			return 0, fmt.Errorf("consumer stopped early: %w", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	stop()
	if err := <-done; err != nil {
		return 0, err
	}
	return elapsed.Seconds(), nil
}
