package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/shadow"
)

// compareFlags are the two sides of ferry compare, per broker.
type compareFlags struct {
	brokerURL, natsURL          string
	prodStream, prodSubject     string
	shadowStream, shadowSubject string
	prodTopic, shadowTopic      string
	prodQueue, shadowQueue      string
	keyFlag, since              string
	timeout                     time.Duration
	asJSON                      bool
	show                        int
}

func newCompareCmd() *cobra.Command {
	var f compareFlags
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Compare a production stream with Ferry's shadow stream: missing, extra, reordered, differing events",
		Long: `compare reads the production side (what the old publisher sent) and the
shadow side (what ferry relay --shadow-subject-prefix sent from the outbox)
over a window and matches their messages by a key:

  --key id             the CloudEvents id (Ferry's event id; ce-id, ce_id,
                       cloudEvents:id or Nats-Msg-Id)
  --key ce:<attribute> a CloudEvents attribute or header, e.g. ce:subject
  --key json:/<ptr>    a JSON pointer into the body, e.g. json:/order_id (for an
                       old publisher that sends bare payloads)

The broker is chosen by --broker-url, as for ferry relay:

  nats://host:4222          JetStream streams --production-stream and
                            --shadow-stream (optional subject filters)
  kafka://host:9092[,host]  topics --production-topic and --shadow-topic, every
                            partition, read directly (no consumer group, nothing
                            committed) up to the last stable offset at the start
  amqp://user:pass@host/    queues --production-queue and --shadow-queue, read
                            with basic.get and no ack: every message goes back to
                            its queue. Read classic queues bound for the
                            comparison only (docs/ADOPTING.md), not the queues
                            your consumers use

It reports
  missing    in shadow, not in production: events the old code lost
  extra      in production, not in shadow: sent by the old code only (e.g. for
             a transaction that rolled back)
  reordered  in both, but out of the shadow's relative order (fewest moves; on
             Kafka within one record key only, the scope Kafka orders)
  differing  in both, bodies differ (compared as JSON when both parse)
and exits 1 when any of these (or an unreadable key) is found. Give the
relay time to drain before comparing: the shadow side trails by its lag.`,
		Example: `  ferry compare --broker-url nats://127.0.0.1:4222 --production-stream ORDERS --shadow-stream SHADOW_ORDERS \
    --key json:/order_id --since 1h
  ferry compare --broker-url kafka://127.0.0.1:9092 --production-topic order.events --shadow-topic shadow.order.events
  ferry compare --broker-url amqp://guest:guest@127.0.0.1:5672/ --production-queue compare.order.events \
    --shadow-queue compare.shadow.order.events`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			return runCompare(cmd, &f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.brokerURL, "broker-url", "", "broker: nats://…, kafka://host:port[,host:port] or amqp://user:pass@host:port/vhost (default: --nats-url)")
	fl.StringVar(&f.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server (the default broker; same as --broker-url nats://…)")
	fl.StringVar(&f.prodStream, "production-stream", "", "NATS: JetStream stream the old publisher writes to")
	fl.StringVar(&f.prodSubject, "production-subject", "", "NATS: subject filter in the production stream (default: all)")
	fl.StringVar(&f.shadowStream, "shadow-stream", "", "NATS: JetStream stream capturing the shadow subjects (may be the same stream)")
	fl.StringVar(&f.shadowSubject, "shadow-subject", "", `NATS: subject filter in the shadow stream, e.g. "shadow.>" (default: all)`)
	fl.StringVar(&f.prodTopic, "production-topic", "", "Kafka: topic the old publisher writes to")
	fl.StringVar(&f.shadowTopic, "shadow-topic", "", "Kafka: shadow topic (e.g. shadow.order.events)")
	fl.StringVar(&f.prodQueue, "production-queue", "", "RabbitMQ: queue bound to the production routing keys, for the comparison only")
	fl.StringVar(&f.shadowQueue, "shadow-queue", "", "RabbitMQ: queue bound to the shadow routing keys, for the comparison only")
	fl.StringVar(&f.keyFlag, "key", "id", "match by: id, ce:<attribute> or json:/<pointer>")
	fl.StringVar(&f.since, "since", "", "window start: a duration back from now (1h) or an RFC 3339 time (default: everything stored)")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up reading after this long (a broker that does not answer)")
	fl.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	fl.IntVar(&f.show, "show", 20, "keys listed per category")
	return cmd
}

func runCompare(cmd *cobra.Command, f *compareFlags) error {
	key, err := shadow.ParseKey(f.keyFlag)
	if err != nil {
		return fmt.Errorf("--key: %w", err)
	}
	from, err := compareSince(f.since)
	if err != nil {
		return err
	}
	if f.timeout <= 0 {
		return fmt.Errorf("--timeout %s: want a positive duration", f.timeout)
	}
	// An explicit --nats-url beats FERRY_BROKER_URL (applyEnv does not
	// mark a flag it sets from the environment as changed).
	u := f.brokerURL
	switch fl := cmd.Flags(); {
	case fl.Changed("nats-url") && fl.Changed("broker-url"):
		return errors.New("--nats-url and --broker-url both set: give one (--broker-url nats://… is the same)")
	case fl.Changed("nats-url") || u == "":
		u = f.natsURL
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	prodR, shadowR, closeFn, err := compareReaders(u, f)
	if err != nil {
		return err
	}
	defer closeFn()
	prod, err := prodR.Read(ctx, from)
	if err != nil {
		return fmt.Errorf("compare: production: %w", err)
	}
	sh, err := shadowR.Read(ctx, from)
	if err != nil {
		return fmt.Errorf("compare: shadow: %w", err)
	}
	rep := shadow.Compare(prod, sh, key)
	if err := writeCompareReport(cmd, rep, f.asJSON, f.show); err != nil {
		return err
	}
	if !rep.Clean() {
		return exitCodeError{code: 1}
	}
	return nil
}

func compareSince(since string) (time.Time, error) {
	if since == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(since); err == nil && d > 0 {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, since); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a positive duration (1h) or an RFC 3339 time", since)
}

// compareReaders opens the two readers of the broker u names (the same
// schemes as ferry relay --broker-url) and refuses the destination flags
// of another broker, naming them.
func compareReaders(u string, f *compareFlags) (prod, sh shadow.Reader, closeFn func(), err error) {
	nats := map[string]string{"--production-stream": f.prodStream, "--shadow-stream": f.shadowStream,
		"--production-subject": f.prodSubject, "--shadow-subject": f.shadowSubject}
	kafkaF := map[string]string{"--production-topic": f.prodTopic, "--shadow-topic": f.shadowTopic}
	rabbit := map[string]string{"--production-queue": f.prodQueue, "--shadow-queue": f.shadowQueue}
	// only returns an error naming a flag set for another broker, or a
	// required flag of this one that is empty.
	only := func(scheme string, mine map[string]string, required []string, others ...map[string]string) error {
		for _, o := range others {
			for _, name := range slices.Sorted(maps.Keys(o)) {
				if o[name] != "" {
					return fmt.Errorf("%s is not for a %s broker (--broker-url %s): %s", name, scheme, redactURL(u), compareFlagHint(scheme))
				}
			}
		}
		for _, name := range required {
			if mine[name] == "" {
				return fmt.Errorf("%s is required with a %s --broker-url: %s", name, scheme, compareFlagHint(scheme))
			}
		}
		return nil
	}
	nothing := func() {}
	switch {
	case strings.HasPrefix(u, "nats://"), strings.HasPrefix(u, "tls://"):
		if err := only("nats://", nats, []string{"--production-stream", "--shadow-stream"}, kafkaF, rabbit); err != nil {
			return nil, nil, nil, err
		}
		nc, err := natsjs.Connect(u)
		if err != nil {
			return nil, nil, nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, nil, fmt.Errorf("compare: jetstream: %w", err)
		}
		return shadow.NATSReader{JS: js, Stream: f.prodStream, Subject: f.prodSubject},
			shadow.NATSReader{JS: js, Stream: f.shadowStream, Subject: f.shadowSubject}, nc.Close, nil
	case strings.HasPrefix(u, "kafka://"):
		if err := only("kafka://", kafkaF, []string{"--production-topic", "--shadow-topic"}, nats, rabbit); err != nil {
			return nil, nil, nil, err
		}
		seeds := relayList(strings.TrimPrefix(u, "kafka://"))
		if len(seeds) == 0 {
			return nil, nil, nil, fmt.Errorf("--broker-url %q: no broker address after kafka:// (want kafka://host:port[,host:port])", u)
		}
		return shadow.KafkaReader{Seeds: seeds, Topic: f.prodTopic}, shadow.KafkaReader{Seeds: seeds, Topic: f.shadowTopic}, nothing, nil
	case strings.HasPrefix(u, "amqp://"), strings.HasPrefix(u, "amqps://"):
		if err := only("amqp://", rabbit, []string{"--production-queue", "--shadow-queue"}, nats, kafkaF); err != nil {
			return nil, nil, nil, err
		}
		return shadow.RabbitReader{URL: u, Queue: f.prodQueue}, shadow.RabbitReader{URL: u, Queue: f.shadowQueue}, nothing, nil
	}
	return nil, nil, nil, fmt.Errorf("--broker-url %q: want nats://…, kafka://host:port[,host:port] or amqp://…", redactURL(u))
}

func compareFlagHint(scheme string) string {
	switch scheme {
	case "nats://":
		return "compare JetStream streams with --production-stream and --shadow-stream"
	case "kafka://":
		return "compare Kafka topics with --production-topic and --shadow-topic"
	}
	return "compare RabbitMQ queues with --production-queue and --shadow-queue"
}

func writeCompareReport(cmd *cobra.Command, rep *shadow.Report, asJSON bool, show int) error {
	out := cmd.OutOrStdout()
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(out, "key %s: production %d messages, shadow %d, duplicates %d\n", rep.Key, rep.Production, rep.Shadow, rep.Duplicates)
	for _, l := range []struct {
		name string
		keys []string
	}{{"missing (lost by the old path)", rep.Missing}, {"extra (old path only)", rep.Extra}, {"reordered", rep.Reordered}, {"differing", rep.Differing}, {"key errors", rep.KeyErrors}} {
		fmt.Fprintf(out, "%-31s %d", l.name, len(l.keys))
		for i, k := range l.keys {
			if i == show {
				fmt.Fprintf(out, " …")
				break
			}
			fmt.Fprintf(out, " %s", k)
		}
		fmt.Fprintln(out)
	}
	return nil
}
