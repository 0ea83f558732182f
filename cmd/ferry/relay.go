package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/relay"
)

// relayFlags configure `ferry relay`. Every flag also reads FERRY_<FLAG>.
type relayFlags struct {
	store          storeFlags
	brokerURL      string
	mode           string
	shards         int
	batch          int
	poll           time.Duration
	leaseTTL       time.Duration
	backoffBase    time.Duration
	backoffMax     time.Duration
	publishTimeout time.Duration
	maxAttempts    int
	deadPolicy     string
	provision      bool
	listen         string
	instanceID     string
	notifyChannel  string
	logLevel       string
	slot           string
	publication    string

	// Scheduled cleanup (off unless --cleanup-interval > 0).
	cleanupEvery     time.Duration
	cleanupRetention time.Duration

	// Destinations.
	stream      string
	subjects    string
	embeddedDir string
	topics      string
	partitions  int
	replication int
	exchange    string
	queue       string
	bindingKeys string
}

func newRelayCmd() *cobra.Command {
	f := &relayFlags{}
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox events to a broker (sharded, leased, at least once, per-aggregate order)",
		Long: `Relay publishes committed outbox rows to a broker and marks them sent only
after the broker acknowledged them. Run as many relays as you like: they
share the shards through leases in the database (each takes about
shards/relays), and a relay's writes are fenced so one that lost its lease
cannot overwrite the new owner's work.

Broker URLs:
  nats://host:4222          NATS JetStream (stream --stream capturing --subjects)
  kafka://host:9092[,host]  Kafka (topics --topics)
  amqp://user:pass@host/    RabbitMQ (topic exchange --exchange, quorum queue --queue)
  embedded                  an in-process NATS JetStream server (store in --embedded-dir)

At start the relay checks that the destination exists and is durable
(JetStream: file storage and a duplicate window; Kafka: the topics exist;
RabbitMQ: a durable exchange and, with --queue, a quorum queue bound to it)
and refuses to run otherwise; --provision creates it instead.

HTTP (--listen): /metrics (Prometheus), /healthz (process alive),
/readyz (owns a shard or the cluster has more relays than shards, and the
broker breaker is closed). SIGTERM finishes the batch in flight, releases
the leases and exits 0.`,
		Args: cobra.NoArgs,
		Example: `  ferry relay --database-url postgres://… --broker-url nats://127.0.0.1:4222 --subjects order.events
  ferry relay --mode cdc --database-url postgres://… --broker-url kafka://127.0.0.1:9092 --topics order.events`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRelayCmd(cmd.Context(), cmd, f, cmd.ErrOrStderr())
		},
	}
	f.store.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.brokerURL, "broker-url", "", "broker: nats://…, kafka://host:port[,host:port], or embedded")
	fl.StringVar(&f.mode, "mode", "poll", `how rows are found: "poll" (claim by status, LISTEN/NOTIFY wake-up) or "cdc" (Postgres logical replication, pgoutput)`)
	fl.DurationVar(&f.cleanupEvery, "cleanup-interval", 0, "run cleanup (sent outbox rows, old inbox and finished effect rows) this often; 0 disables")
	fl.DurationVar(&f.cleanupRetention, "cleanup-retention", 7*24*time.Hour, "cleanup keeps rows younger than this; refused if shorter than the replay window (ferry cleanup window)")
	fl.StringVar(&f.slot, "slot", "ferry_cdc", "cdc: logical replication slot name")
	fl.StringVar(&f.publication, "publication", "ferry_cdc", "cdc: publication name (created for the outbox table only, inserts only)")
	fl.IntVar(&f.shards, "shards", ferry.DefaultShardCount, "shard count N; must equal the writers' N")
	fl.IntVar(&f.batch, "batch-size", relay.DefaultBatchSize, "rows per claim-publish-mark cycle")
	fl.DurationVar(&f.poll, "poll-interval", relay.DefaultPollInterval, "look for work this often when nothing woke the relay")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", relay.DefaultLeaseTTL, "shard lease lifetime; a crashed relay's shards move after it")
	fl.DurationVar(&f.backoffBase, "backoff-base", relay.DefaultBackoffBase, "retry backoff base (full jitter, doubling)")
	fl.DurationVar(&f.backoffMax, "backoff-max", relay.DefaultBackoffMax, "retry backoff cap")
	fl.DurationVar(&f.publishTimeout, "publish-timeout", relay.DefaultPublishTimeout, "bound on one batch's publish, acks included")
	fl.IntVar(&f.maxAttempts, "max-attempts", relay.DefaultMaxAttempts, "failed attempts before a row goes dead")
	fl.StringVar(&f.deadPolicy, "dead-policy", string(relay.DeadHold), `what a dead row does to its aggregate: "hold" or "skip"`)
	fl.BoolVar(&f.provision, "provision", false, "create the destination (stream/topics) if missing instead of refusing to start")
	fl.StringVar(&f.listen, "listen", ":9464", `address for /metrics, /healthz, /readyz ("" disables)`)
	fl.StringVar(&f.instanceID, "instance-id", "", "this relay's id in the lease table (default hostname-pid-random)")
	fl.StringVar(&f.notifyChannel, "notify-channel", "ferry_outbox", `Postgres LISTEN channel (writers use outbox.WithNotify); "" disables`)
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.stream, "stream", "FERRY", "NATS: JetStream stream name")
	fl.StringVar(&f.subjects, "subjects", "", `NATS: comma-separated subjects the stream captures, covering every event topic, e.g. "order.events,payment.events" (required)`)
	fl.StringVar(&f.embeddedDir, "embedded-dir", "ferry-nats", "embedded: JetStream store directory")
	fl.StringVar(&f.topics, "topics", "", "Kafka: comma-separated topics to check (or create with --provision)")
	fl.IntVar(&f.partitions, "partitions", 16, "Kafka --provision: partitions per topic")
	fl.IntVar(&f.replication, "replication", 1, "Kafka --provision: replication factor")
	fl.StringVar(&f.exchange, "exchange", "ferry", "RabbitMQ: durable topic exchange (routing key = event topic)")
	fl.StringVar(&f.queue, "queue", "", "RabbitMQ: quorum queue bound to the exchange, checked or provisioned (optional)")
	fl.StringVar(&f.bindingKeys, "binding-keys", "#", "RabbitMQ: comma-separated binding keys of --queue")
	return cmd
}

func runRelayCmd(ctx context.Context, cmd *cobra.Command, f *relayFlags, stderr io.Writer) error {
	applyEnv(cmd)
	if f.mode != "poll" && f.mode != "cdc" {
		return fmt.Errorf(`--mode must be "poll" or "cdc", got %q`, f.mode)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	st, err := f.store.open(ctx, cmd)
	if err != nil {
		return err
	}
	defer st.Close()

	pub, closePub, err := openDestination(ctx, f, log)
	if err != nil {
		return err
	}
	defer closePub()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	stopCleanup, err := startScheduledCleanup(ctx, f, st, log)
	if err != nil {
		return err
	}
	defer stopCleanup()
	if f.mode == "cdc" {
		return runCDCRelay(ctx, f, st, pub, reg, log)
	}
	opts := []relay.Option{
		relay.WithTables(st.tables), relay.WithShardCount(f.shards), relay.WithBatchSize(f.batch),
		relay.WithPollInterval(f.poll), relay.WithLeaseTTL(f.leaseTTL), relay.WithBackoff(f.backoffBase, f.backoffMax),
		relay.WithPublishTimeout(f.publishTimeout), relay.WithMaxAttempts(f.maxAttempts),
		relay.WithDeadPolicy(relay.DeadPolicy(f.deadPolicy)), relay.WithLogger(log), relay.WithRegisterer(reg),
	}
	if f.instanceID != "" {
		opts = append(opts, relay.WithInstanceID(f.instanceID))
	}
	if f.notifyChannel != "" && st.pool != nil {
		opts = append(opts, relay.WithListener(st.pool, f.notifyChannel))
	}
	r, err := relay.New(st, pub, opts...)
	if err != nil {
		return err
	}

	if f.listen != "" {
		ln, err := net.Listen("tcp", f.listen)
		if err != nil {
			return fmt.Errorf("--listen %s: %w", f.listen, err)
		}
		srv := &http.Server{Handler: relayHTTP(r, reg), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.Info("serving /metrics /healthz /readyz", "addr", ln.Addr().String())
	}
	log.Info("relay starting", "instance", r.InstanceID(), "broker", pub.Name(), "shards", f.shards)
	if err := r.Run(ctx); err != nil {
		return err
	}
	return nil
}

// relayHTTP serves metrics and the health endpoints.
func relayHTTP(r *relay.Relay, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !r.Status().Running {
			http.Error(w, "relay not running", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := r.Status()
		if !st.Ready() {
			http.Error(w, fmt.Sprintf("not ready: running=%t owned_shards=%d live_relays=%d shards=%d breaker=%s",
				st.Running, len(st.OwnedShards), st.LiveInstances, st.ShardCount, st.Breaker), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ready: owned_shards=%d\n", len(st.OwnedShards))
	})
	return mux
}

// openDestination connects the publisher for --broker-url and checks (or,
// with --provision, creates) the destination.
func openDestination(ctx context.Context, f *relayFlags, log *slog.Logger) (broker.Publisher, func(), error) {
	u := f.brokerURL
	switch {
	case u == "":
		return nil, nil, errors.New("no broker: set --broker-url or FERRY_BROKER_URL")
	case u == "embedded":
		emb, err := natsjs.StartEmbedded(natsjs.WithStoreDir(f.embeddedDir))
		if err != nil {
			return nil, nil, err
		}
		log.Info("embedded NATS JetStream started", "url", emb.ClientURL(), "store", emb.StoreDir())
		pub, err := natsPublisher(ctx, emb.ClientURL(), f, true)
		if err != nil {
			_ = emb.Close()
			return nil, nil, err
		}
		return pub, func() { _ = pub.Close(); _ = emb.Close() }, nil
	case strings.HasPrefix(u, "nats://"), strings.HasPrefix(u, "tls://"):
		pub, err := natsPublisher(ctx, u, f, f.provision)
		if err != nil {
			return nil, nil, err
		}
		return pub, func() { _ = pub.Close() }, nil
	case strings.HasPrefix(u, "kafka://"):
		seeds := relayList(strings.TrimPrefix(u, "kafka://"))
		pub, err := kafka.NewPublisher(seeds, kafka.WithLogger(log))
		if err != nil {
			return nil, nil, err
		}
		if err := kafkaDestination(ctx, pub, f); err != nil {
			_ = pub.Close()
			return nil, nil, err
		}
		return pub, func() { _ = pub.Close() }, nil
	case strings.HasPrefix(u, "amqp://"), strings.HasPrefix(u, "amqps://"):
		top := rabbitmq.Topology{Exchange: f.exchange, Queue: f.queue, BindingKeys: relayList(f.bindingKeys)}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		var err error
		if f.provision {
			err = rabbitmq.EnsureTopology(cctx, u, top)
		} else if err = rabbitmq.CheckTopology(cctx, u, top); err != nil {
			err = fmt.Errorf("%w (create it with --provision)", err)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("destination exchange %s: %w", f.exchange, err)
		}
		pub, err := rabbitmq.NewPublisher(u, rabbitmq.WithExchange(f.exchange), rabbitmq.WithLogger(log))
		if err != nil {
			return nil, nil, err
		}
		return pub, func() { _ = pub.Close() }, nil
	}
	return nil, nil, fmt.Errorf("--broker-url %q: want nats://…, kafka://host:port, amqp://… or embedded", u)
}

func natsPublisher(ctx context.Context, url string, f *relayFlags, provision bool) (*natsjs.Publisher, error) {
	if len(relayList(f.subjects)) == 0 {
		// No default: the writers' default topics ({aggregate_type}.events)
		// can only be captured by a leading wildcard, which JetStream
		// refuses because it overlaps its own $JS API subjects.
		return nil, errors.New(`--subjects is required for NATS: the subjects of your events' topics, e.g. "order.events,payment.events"`)
	}
	pub, err := natsjs.DialPublisher(url)
	if err != nil {
		return nil, err
	}
	cfg := natsjs.StreamConfig{Name: f.stream, Subjects: relayList(f.subjects)}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if provision {
		_, err = natsjs.EnsureStream(cctx, pub.JetStream(), cfg)
	} else {
		err = natsjs.CheckStream(cctx, pub.JetStream(), cfg)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			err = fmt.Errorf("%w (create it with --provision)", err)
		}
	}
	if err != nil {
		_ = pub.Close()
		return nil, fmt.Errorf("destination stream %s: %w", f.stream, err)
	}
	return pub, nil
}

func kafkaDestination(ctx context.Context, pub *kafka.Publisher, f *relayFlags) error {
	topics := relayList(f.topics)
	if len(topics) == 0 {
		return errors.New("kafka: --topics is required (the relay checks they exist before publishing)")
	}
	adm := kadm.NewClient(pub.Client())
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if f.provision {
		return kafka.EnsureTopics(cctx, adm, topics, int32(f.partitions), int16(f.replication))
	}
	sts, err := kafka.CheckTopics(cctx, adm, topics)
	if err != nil {
		return fmt.Errorf("%w (create them with --provision)", err)
	}
	for _, s := range sts {
		for _, w := range s.DurabilityWarnings {
			fmt.Fprintf(os.Stderr, "ferry relay: kafka topic %s: %s\n", s.Topic, w)
		}
	}
	return nil
}

func relayList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
