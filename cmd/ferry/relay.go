package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
	"github.com/ferryhq/ferry/broker/kafka"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/broker/rabbitmq"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/outboxstate"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/relay/cdc"
)

// relayFlags configure `ferry relay`. Every flag also reads FERRY_<FLAG>.
type relayFlags struct {
	store          storeFlags
	shadowPrefix   string // --shadow-subject-prefix; see shadow.go
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
	workers        int
	publishRate    float64 // --publish-rate; 0 = unlimited
	publishBurst   int     // --publish-burst; 0 = --batch-size
	tenantShare    int     // --tenant-share; 0 = off
	batchBytes     int     // --max-batch-bytes
	pendingBytes   int     // --max-pending-bytes (cdc)
	sentWatermark  bool    // --sent-watermark
	shardPipeline  int     // --shard-pipeline
	source         string
	slot           string
	publication    string

	// Scheduled cleanup (off unless --cleanup-interval > 0).
	cleanupEvery     time.Duration
	cleanupRetention time.Duration
	cleanupArchive   string

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
and refuses to run otherwise; --provision creates it instead. Durability
shortfalls it can see (replication, min.insync.replicas, unclean leader
election, stream replicas) and settings it cannot read are logged as
warnings. It also compares the destinations of the unsent rows with what
the broker has and logs the missing ones (alert=destination_missing): rows
routed to a missing destination are held (never dead) until it exists,
reported by the ferry_relay_destination_missing gauge.

HTTP (--listen): /metrics (Prometheus), /healthz (process alive),
/readyz (owns a shard or the cluster has more relays than shards, and the
broker breaker is closed). SIGTERM finishes the batch in flight, releases
the leases and exits 0.`,
		Args: cobra.NoArgs,
		Example: `  # polling relay (the default --mode poll), one line per broker
  ferry relay --database-url postgres://… --broker-url nats://127.0.0.1:4222 --stream ORDERS --subjects order.events
  ferry relay --database-url postgres://… --broker-url kafka://127.0.0.1:9092 --topics order.events
  ferry relay --database-url postgres://… --broker-url amqp://guest:guest@127.0.0.1:5672/ --exchange ferry --queue orders
  ferry relay --database-url sqlite:app.db --broker-url embedded --subjects order.events --provision
  ferry relay --database-url mysql://app:secret@127.0.0.1:3306/app --broker-url nats://127.0.0.1:4222 --subjects order.events
  # log-based relay (Postgres logical replication)
  ferry relay --mode cdc --database-url postgres://… --broker-url kafka://127.0.0.1:9092 --topics order.events`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRelayCmd(cmd.Context(), cmd, f, cmd.ErrOrStderr())
		},
	}
	f.store.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.brokerURL, "broker-url", "", "broker: nats://…, kafka://host:port[,host:port], amqp://user:pass@host:port/vhost, or embedded")
	fl.StringVar(&f.mode, "mode", "poll", `how rows are found: "poll" (claim by status, LISTEN/NOTIFY wake-up) or "cdc" (Postgres logical replication, pgoutput)`)
	fl.DurationVar(&f.cleanupEvery, "cleanup-interval", 0, "run cleanup (sent outbox rows, old inbox and finished effect rows) this often; 0 disables")
	fl.DurationVar(&f.cleanupRetention, "cleanup-retention", 7*24*time.Hour, "cleanup keeps rows younger than this; refused if shorter than the replay window (ferry cleanup window)")
	fl.StringVar(&f.cleanupArchive, "cleanup-archive", "", "with --cleanup-interval: write each cleanup batch to this blob store (file:///DIR?create_dir=1, s3://…) and delete only what it confirmed (docs/ARCHIVE.md)")
	fl.StringVar(&f.slot, "slot", "ferry_cdc", "cdc: logical replication slot name")
	fl.StringVar(&f.publication, "publication", "ferry_cdc", "cdc: publication name (created for the outbox table only, inserts only)")
	fl.IntVar(&f.shards, "shards", ferry.DefaultShardCount, "shard count N; must equal the writers' N")
	fl.IntVar(&f.batch, "batch-size", relay.DefaultBatchSize, "rows per claim-publish-mark cycle")
	fl.IntVar(&f.batchBytes, "max-batch-bytes", relay.DefaultMaxBatchBytes, "poll: payload bytes per batch; events in flight stay within about workers × this whatever their sizes")
	fl.IntVar(&f.pendingBytes, "max-pending-bytes", cdc.DefaultMaxPendingBytes, "cdc: payload bytes decoded from the WAL and not yet acked by the broker; the WAL reader waits beyond it")
	fl.IntVar(&f.workers, "workers", relay.DefaultWorkers, "poll: concurrent claim-publish-mark loops")
	fl.Float64Var(&f.publishRate, "publish-rate", 0, "poll: publish at most this many events per second, across all workers (0 = unlimited)")
	fl.IntVar(&f.publishBurst, "publish-burst", 0, "poll: with --publish-rate, the largest burst in events (0 = --batch-size, at most 10000)")
	fl.IntVar(&f.shardPipeline, "shard-pipeline", 1, fmt.Sprintf("poll, Postgres, status design: batches of one shard in flight at once (1..%d; relay.WithShardPipeline): the next is claimed while one waits for its acks", relay.MaxShardPipeline))
	fl.BoolVar(&f.sentWatermark, "sent-watermark", false, "poll, Postgres: keep the relay's state out of the event row (a per-shard sent-up-to id; relay.WithSentWatermark); every relay of the deployment must use it")
	fl.IntVar(&f.tenantShare, "tenant-share", 0, "poll: a claim takes at most this many rows per tenant per shard, so one tenant's burst cannot delay the others (0 = off)")
	fl.StringVar(&f.source, "source", cloudevents.DefaultSource, `CloudEvents "source" attribute of every published event, a URI-reference, e.g. "ferry://orders-service"`)
	fl.DurationVar(&f.poll, "poll-interval", relay.DefaultPollInterval, "look for work this often when nothing woke the relay")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", relay.DefaultLeaseTTL, "shard lease lifetime; a crashed relay's shards move after it")
	fl.DurationVar(&f.backoffBase, "backoff-base", relay.DefaultBackoffBase, "retry backoff base (full jitter, doubling)")
	fl.DurationVar(&f.backoffMax, "backoff-max", relay.DefaultBackoffMax, "retry backoff cap")
	fl.DurationVar(&f.publishTimeout, "publish-timeout", relay.DefaultPublishTimeout, "bound on one batch's publish, acks included")
	fl.IntVar(&f.maxAttempts, "max-attempts", relay.DefaultMaxAttempts, "failed attempts before a row goes dead")
	fl.StringVar(&f.deadPolicy, "dead-policy", string(relay.DeadHold), `what a dead row does to its aggregate: "hold" or "skip"`)
	fl.BoolVar(&f.provision, "provision", false, "create the destination (stream/topics) if missing instead of refusing to start")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:9464", `address for /metrics, /healthz, /readyz (loopback by default; ":9464" for every interface; "" disables)`)
	fl.StringVar(&f.instanceID, "instance-id", "", "this relay's id in the lease table (default hostname-pid-random)")
	fl.StringVar(&f.notifyChannel, "notify-channel", "ferry_outbox", `Postgres LISTEN channel (writers use outbox.WithNotify); "" disables; SQLite and MySQL have no NOTIFY: the relay polls`)
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
	fl.StringVar(&f.shadowPrefix, "shadow-subject-prefix", "", `shadow mode: publish every event to this prefix + its topic (NATS subject, Kafka topic, RabbitMQ routing key), e.g. "shadow.", so Ferry runs beside the old publisher unseen by consumers; compare with ferry compare`)
	return cmd
}

func runRelayCmd(ctx context.Context, cmd *cobra.Command, f *relayFlags, stderr io.Writer) error {
	if err := applyEnv(cmd); err != nil {
		return err
	}
	if f.mode != "poll" && f.mode != "cdc" {
		return fmt.Errorf(`--mode must be "poll" or "cdc", got %q`, f.mode)
	}
	if f.mode == "cdc" {
		// Refused before anything connects: only Postgres has the logical
		// replication the CDC relay reads.
		if d, _, err := parseDatabaseURL(f.store.url); err == nil && d != driver.Postgres {
			return fmt.Errorf("--mode cdc needs a Postgres --database-url (logical replication); got a %s URL: use --mode poll", d)
		}
		if err := cdc.CheckOptions(cdcOptions(f)...); err != nil {
			return relayFlagError(err)
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if err := checkSource(f.source); err != nil {
		return err
	}
	if f.cleanupEvery < 0 {
		return fmt.Errorf("--cleanup-interval must be >= 0 (0 disables), got %s", f.cleanupEvery)
	}
	if f.cleanupRetention <= 0 {
		return fmt.Errorf("--cleanup-retention must be positive, got %s", f.cleanupRetention)
	}
	// Every relay option is checked before anything is connected, and a
	// refusal names the flag the user typed.
	if err := relay.CheckOptions(pollOptions(f, f.store.tables())...); err != nil {
		return relayFlagError(err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))

	// A connection per worker, the lease loop, LISTEN and scheduled
	// cleanup: pgxpool's default (max(4, CPUs)) would leave workers
	// waiting for connections on a small machine.
	f.store.minConns = f.workers + 3
	st, err := f.store.open(ctx, cmd)
	if err != nil {
		return err
	}
	defer st.Close()

	rows, err := unsentTopics(ctx, st, f.sentWatermark)
	if err != nil {
		// Only a start-up cross-check: publishing still holds and
		// reports a missing destination.
		log.WarnContext(ctx, "could not compare the destinations of unsent rows with the broker", logattr.Err(err))
	}
	pub, closePub, err := openDestination(ctx, f, log, shadowTopics(f, rows))
	if err != nil {
		return err
	}
	defer closePub()
	if pub, err = shadowPublisher(ctx, f, log, pub); err != nil {
		return err
	}

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
	opts := append(pollOptions(f, st.tables), relay.WithLogger(log), relay.WithRegisterer(reg))
	if f.notifyChannel != "" && st.pool != nil {
		opts = append(opts, relay.WithListener(st.pool, f.notifyChannel))
	}
	r, err := relay.New(st, pub, opts...)
	if err != nil {
		return relayFlagError(err)
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
		log.InfoContext(ctx, "serving /metrics /healthz /readyz", "addr", ln.Addr().String())
	}
	log.InfoContext(ctx, "relay starting", "instance", r.InstanceID(), "broker", pub.Name(), "shards", f.shards)
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

// checkSource validates --source: the CloudEvents "source" attribute is a
// non-empty URI-reference (RFC 3986), e.g. "ferry://orders-service",
// "/orders" or "urn:orders".
func checkSource(src string) error {
	if src == "" {
		return errors.New(`--source must not be empty (the CloudEvents "source" attribute, a URI-reference such as "ferry://orders-service")`)
	}
	if strings.ContainsFunc(src, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return fmt.Errorf("--source %q: not a URI-reference: contains white space or control characters", src)
	}
	if _, err := url.Parse(src); err != nil {
		return fmt.Errorf("--source %q: not a URI-reference: %w", src, err)
	}
	return nil
}

// maxCheckedTopics bounds the start-up comparison of unsent rows'
// destinations with the broker's.
const maxCheckedTopics = 1000

// unsentTopics returns the distinct topics of the pending outbox rows (at
// most maxCheckedTopics), for comparing with what the broker has. Rows
// written later are not covered: a destination missing at publish time is
// held and reported by the relay (ferry_relay_destination_missing).
//
// In the watermark design (--sent-watermark) sent rows stay 'pending': the
// unsent ones are the 'retry' rows and each shard's pending rows above its
// watermark (outboxstate), not every pending row of the table.
func unsentTopics(ctx context.Context, st *store, watermark bool) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	outbox := st.tables.Name("outbox")
	q := fmt.Sprintf(`SELECT DISTINCT topic FROM %s WHERE status = 'pending' ORDER BY topic LIMIT %d`, outbox, maxCheckedTopics)
	if watermark {
		q = fmt.Sprintf(`WITH RECURSIVE %s
SELECT DISTINCT topic FROM (SELECT topic FROM %s WHERE status = 'retry' UNION ALL SELECT x.topic FROM %s) u ORDER BY topic LIMIT %d`,
			outboxstate.ShardsWithPending(st.tables, "true"), outbox, outboxstate.AboveWatermark(st.tables, "x.topic"), maxCheckedTopics)
	}
	rows, err := st.Executor().Query(cctx, q)
	if err != nil {
		return nil, fmt.Errorf("read the destinations of unsent rows: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, fmt.Errorf("read the destinations of unsent rows: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the destinations of unsent rows: %w", err)
	}
	return out, nil
}

// warnMissing logs the destinations of unsent rows the broker does not
// have: those rows are held (never dead) until the destination exists.
func warnMissing(log *slog.Logger, brokerName, kind string, missing []string, hint string) {
	if len(missing) == 0 {
		return
	}
	log.Warn("unsent events route to destinations the broker does not have; they are held (not dead) until these exist",
		"alert", "destination_missing", "broker", brokerName, "kind", kind, "missing", missing, "hint", hint)
}

// openDestination connects the publisher for --broker-url and checks (or,
// with --provision, creates) the destination, comparing it with rows, the
// destinations of the unsent outbox rows.
func openDestination(ctx context.Context, f *relayFlags, log *slog.Logger, rows []string) (broker.Publisher, func(), error) {
	u := f.brokerURL
	switch {
	case u == "":
		return nil, nil, errors.New("no broker: set --broker-url or FERRY_BROKER_URL")
	case u == "embedded":
		emb, err := natsembed.Start(natsembed.WithStoreDir(f.embeddedDir), natsembed.WithLogger(log))
		if err != nil {
			return nil, nil, err
		}
		log.InfoContext(ctx, "embedded NATS JetStream started", "url", emb.ClientURL(), "store", emb.StoreDir())
		log.WarnContext(ctx, "destination durability", "broker", "nats", "stream", f.stream, "setting", "sync_interval", "value", "2m",
			"warning", "the embedded server fsyncs every 2 minutes: a machine crash can lose acknowledged events; run a NATS server with sync_interval: always for production")
		pub, err := natsPublisher(ctx, emb.ClientURL(), f, true, log, rows)
		if err != nil {
			_ = emb.Close()
			return nil, nil, err
		}
		return pub, func() { _ = pub.Close(); _ = emb.Close() }, nil
	case strings.HasPrefix(u, "nats://"), strings.HasPrefix(u, "tls://"):
		pub, err := natsPublisher(ctx, u, f, f.provision, log, rows)
		if err != nil {
			return nil, nil, err
		}
		log.WarnContext(ctx, "destination setting could not be read", "broker", "nats", "stream", f.stream, "setting", "sync_interval",
			"warning", "a client cannot read the server's sync_interval (default 2m: a machine crash can lose acknowledged events on a single server); set jetstream { sync_interval: always } or use R3 streams")
		return pub, func() { _ = pub.Close() }, nil
	case strings.HasPrefix(u, "kafka://"):
		seeds := relayList(strings.TrimPrefix(u, "kafka://"))
		pub, err := kafka.NewPublisher(seeds, kafka.WithLogger(log), kafka.WithSource(f.source))
		if err != nil {
			return nil, nil, err
		}
		if err := kafkaDestination(ctx, pub, f, log, rows); err != nil {
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
		rabbitWarnings(log, top, rows)
		pub, err := rabbitmq.NewPublisher(u, rabbitmq.WithExchange(f.exchange), rabbitmq.WithLogger(log), rabbitmq.WithSource(f.source))
		if err != nil {
			return nil, nil, err
		}
		return pub, func() { _ = pub.Close() }, nil
	}
	return nil, nil, fmt.Errorf("--broker-url %q: want nats://…, kafka://host:port, amqp://… or embedded", u)
}

// rabbitWarnings logs what the AMQP check cannot prove: bindings cannot be
// listed over AMQP 0-9-1, so unsent rows' routing keys are compared with
// --binding-keys of --queue only (another queue may be bound to them), and
// a quorum queue's replica count cannot be read.
func rabbitWarnings(log *slog.Logger, top rabbitmq.Topology, rows []string) {
	if top.Queue == "" {
		log.Warn("destination setting could not be read", "broker", "rabbitmq", "exchange", top.Exchange, "setting", "queue",
			"warning", "no --queue given: whether a durable quorum queue is bound is not checked; an unbound routing key is held (not dead) at publish and reported by ferry_relay_destination_missing")
		return
	}
	log.Warn("destination setting could not be read", "broker", "rabbitmq", "queue", top.Queue, "setting", "quorum replicas",
		"warning", "AMQP does not report a quorum queue's replica count; check with rabbitmq-queues quorum_status (fewer than 3 members survive no node loss)")
	var unbound []string
	for _, t := range rows {
		if !slices.ContainsFunc(top.BindingKeys, func(k string) bool { return amqpTopicMatch(k, t) }) {
			unbound = append(unbound, t)
		}
	}
	warnMissing(log, "rabbitmq", "routing key not matched by --binding-keys of --queue (another queue may bind it; AMQP cannot list bindings)",
		unbound, "bind a queue to them, or add them to --binding-keys with --provision")
}

// amqpTopicMatch reports whether a topic exchange routes key to a binding
// with pattern: words separated by '.', '*' is exactly one word, '#' zero
// or more.
func amqpTopicMatch(pattern, key string) bool {
	var match func(p, k []string) bool
	match = func(p, k []string) bool {
		if len(p) == 0 {
			return len(k) == 0
		}
		if p[0] == "#" {
			for i := 0; i <= len(k); i++ {
				if match(p[1:], k[i:]) {
					return true
				}
			}
			return false
		}
		if len(k) == 0 || (p[0] != "*" && p[0] != k[0]) {
			return false
		}
		return match(p[1:], k[1:])
	}
	return match(strings.Split(pattern, "."), strings.Split(key, "."))
}

func natsPublisher(ctx context.Context, url string, f *relayFlags, provision bool, log *slog.Logger, rows []string) (*natsjs.Publisher, error) {
	if len(relayList(f.subjects)) == 0 {
		// No default: the writers' default topics ({aggregate_type}.events)
		// can only be captured by a leading wildcard, which JetStream
		// refuses because it overlaps its own $JS API subjects.
		return nil, errors.New(`--subjects is required for NATS: the subjects of your events' topics, e.g. "order.events,payment.events"`)
	}
	pub, err := natsjs.DialPublisher(url, natsjs.WithSource(f.source))
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
	js := pub.JetStream()
	if s, err := js.Stream(cctx, f.stream); err != nil {
		log.WarnContext(ctx, "destination setting could not be read", "broker", "nats", "stream", f.stream, "setting", "replicas", logattr.Err(err))
	} else if r := s.CachedInfo().Config.Replicas; r < kafka.RecommendedReplication {
		log.WarnContext(ctx, "destination durability", "broker", "nats", "stream", f.stream, "setting", "replicas", "value", r,
			"warning", fmt.Sprintf("replicas %d < %d: a server loss can lose acknowledged events or stop writes", r, kafka.RecommendedReplication))
	}
	var missing []string
	for _, subj := range rows {
		if _, err := js.StreamNameBySubject(cctx, subj); errors.Is(err, jetstream.ErrStreamNotFound) {
			missing = append(missing, subj)
		} else if err != nil {
			log.WarnContext(ctx, "could not check the destinations of unsent events", "broker", "nats", "subject", subj, logattr.Err(err))
			break
		}
	}
	warnMissing(log, "nats", "subject no stream captures", missing, "add them to --subjects (with --provision) or to a stream's subjects")
	return pub, nil
}

func kafkaDestination(ctx context.Context, pub *kafka.Publisher, f *relayFlags, log *slog.Logger, rows []string) error {
	topics := relayList(f.topics)
	if len(topics) == 0 {
		return errors.New("kafka: --topics is required (the relay checks they exist before publishing)")
	}
	adm := kadm.NewClient(pub.Client())
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var extra []string // destinations of unsent rows not in --topics
	for _, t := range rows {
		if !slices.Contains(topics, t) {
			extra = append(extra, t)
		}
	}
	if f.provision {
		// --provision creates the destinations of unsent rows too.
		if err := kafka.EnsureTopics(cctx, adm, append(slices.Clone(topics), extra...), int32(f.partitions), int16(f.replication)); err != nil {
			return err
		}
	}
	// CheckTopics' error names the missing topics and the --provision hint.
	sts, err := kafka.CheckTopics(cctx, adm, topics)
	if err != nil {
		return err
	}
	if len(extra) > 0 {
		more, err := kafka.CheckTopics(cctx, adm, extra)
		var mt *kafka.MissingTopicsError
		switch {
		case errors.As(err, &mt):
			warnMissing(log, "kafka", "topic", mt.Topics, "create them, or restart the relay with --provision")
		case err != nil:
			log.WarnContext(ctx, "could not check the destinations of unsent events", "broker", "kafka", logattr.Err(err))
		}
		sts = append(sts, more...)
	}
	logKafkaDurability(log, sts)
	return nil
}

// logKafkaDurability logs each topic's durability shortfalls, and each
// setting the broker did not report, as structured warnings.
func logKafkaDurability(log *slog.Logger, sts []kafka.TopicStatus) {
	for _, s := range sts {
		for _, w := range s.DurabilityWarnings {
			log.Warn("destination durability", "broker", "kafka", "topic", s.Topic, "replication_factor", s.ReplicationFactor,
				"min_insync_replicas", s.MinInsyncReplicas, "unclean_leader_election", s.UncleanLeaderElection, "warning", w)
		}
		for _, name := range s.Unread {
			log.Warn("destination setting could not be read", "broker", "kafka", "topic", s.Topic, "setting", name,
				"warning", "the broker did not report it, so it was not checked")
		}
	}
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

// pollOptions are the relay options the flags set (logger, registry and
// listener are added by the caller).
func pollOptions(f *relayFlags, tables ferry.Tables) []relay.Option {
	opts := []relay.Option{
		relay.WithTables(tables), relay.WithShardCount(f.shards), relay.WithBatchSize(f.batch), relay.WithMaxBatchBytes(f.batchBytes),
		relay.WithPollInterval(f.poll), relay.WithLeaseTTL(f.leaseTTL), relay.WithBackoff(f.backoffBase, f.backoffMax),
		relay.WithPublishTimeout(f.publishTimeout), relay.WithMaxAttempts(f.maxAttempts),
		relay.WithDeadPolicy(relay.DeadPolicy(f.deadPolicy)), relay.WithWorkers(f.workers),
	}
	if f.instanceID != "" {
		opts = append(opts, relay.WithInstanceID(f.instanceID))
	}
	if f.publishRate != 0 || f.publishBurst != 0 {
		burst := f.publishBurst
		if burst == 0 && f.publishRate > 0 {
			burst = min(f.batch, relay.MaxBatchSize)
		}
		opts = append(opts, relay.WithPublishRate(f.publishRate, burst))
	}
	if f.tenantShare != 0 {
		opts = append(opts, relay.WithTenantShare(f.tenantShare))
	}
	if f.sentWatermark {
		opts = append(opts, relay.WithSentWatermark())
	}
	if f.shardPipeline != 1 {
		opts = append(opts, relay.WithShardPipeline(f.shardPipeline))
	}
	return opts
}

// relayOptionFlags names the flag behind each relay option field.
var relayOptionFlags = map[string]string{
	"shard_count":       "--shards",
	"batch_size":        "--batch-size",
	"max_batch_bytes":   "--max-batch-bytes",
	"max_pending_bytes": "--max-pending-bytes",
	"slot_name":         "--slot",
	"publication_name":  "--publication",
	"poll_interval":     "--poll-interval",
	"lease_ttl":         "--lease-ttl",
	"backoff":           "--backoff-base/--backoff-max",
	"publish_timeout":   "--publish-timeout",
	"max_attempts":      "--max-attempts",
	"dead_policy":       "--dead-policy",
	"workers":           "--workers",
	"publish_rate":      "--publish-rate",
	"publish_burst":     "--publish-burst",
	"tenant_share":      "--tenant-share",
	"sent_watermark":    "--sent-watermark",
	"shard_pipeline":    "--shard-pipeline",
	"instance_id":       "--instance-id",
	"listener":          "--notify-channel",
	"tables.schema":     "--schema",
	"tables.prefix":     "--table-prefix",
	// ferry migrate up / sql
	"partitioned_outbox": "--partition-outbox",
	"partitioned_inbox":  "--partition-inbox",
}

// relayFlagError restates a relay configuration error in terms of the flag
// the user typed ("--shards must be in 1..4096, got -1").
func relayFlagError(err error) error {
	var ce *ferry.ConfigError
	if errors.As(err, &ce) {
		if fl, ok := relayOptionFlags[ce.Field]; ok {
			return fmt.Errorf("%s %s", fl, ce.Reason)
		}
	}
	return err
}
