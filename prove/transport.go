package prove

import (
	"context"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// transport is one scenario's destination on one broker, and everything
// prove needs from it: Ferry's real adapter for publishing and consuming,
// and prove's own reader of what the broker stored (the ground truth).
type transport interface {
	// kind is "nats", "kafka" or "rabbitmq".
	kind() string
	// publisher returns the broker adapter's publisher; via, when not
	// empty, is a host:port (a fault proxy) to connect through.
	publisher(ctx context.Context, via string) (broker.Publisher, error)
	// consumer returns the adapter's consumer for group (a durable, a
	// consumer group; ignored where the broker has one queue).
	consumer(ctx context.Context, group string) (broker.Consumer, error)
	// readAll returns every message the broker stored for the scenario, in
	// storage order, including duplicates.
	readAll(ctx context.Context) ([]streamMsg, error)
	// forge publishes a raw message (copies, forgeries, junk) around the
	// relay. headers use the binding's names.
	forge(ctx context.Context, headers map[string]string, body []byte, msgID string) error
	// replay prepares group to re-read everything retained; drained says
	// whether group has consumed and acked all of it.
	replay(ctx context.Context, group string) error
	drained(ctx context.Context, group string) (bool, error)
	// owed says which of msgs (from readAll) the broker still holds for
	// group — not yet acknowledged by its consumer, so they will be
	// delivered (again) — or, where it cannot name them, how many.
	owed(ctx context.Context, group string, msgs []streamMsg) (owedSet, error)
	// endpoint is the single host:port clients dial, or "" when clients
	// learn other addresses from the broker (no proxy possible).
	endpoint() string
	// job describes the transport for a worker subprocess.
	job() transportJob
	// topicTemplate is the outbox writer's topic template: the adapter
	// routes by the event's topic ("" keeps the default).
	topicTemplate() ferry.TopicTemplate
	// unsupported says why sc cannot run on this broker ("" if it can).
	unsupported(sc *scenario) string
	destroy(ctx context.Context)
}

// transportJob rebuilds a transport in a worker subprocess (publishing only).
type transportJob struct {
	Kind  string `json:"kind"`
	URL   string `json:"url"`
	Name  string `json:"name"`
	Topic string `json:"topic,omitempty"`
	// AckWait is the NATS consumer's redelivery delay.
	AckWait time.Duration `json:"ack_wait,omitempty"`
	// KafkaDynamic: the Kafka consumer joins without an instance id.
	KafkaDynamic bool `json:"kafka_dynamic,omitempty"`
}

func transportFromJob(j transportJob) transport {
	switch j.Kind {
	case "kafka":
		return &kafkaTransport{seeds: splitSeeds(j.URL), topic: j.Topic, dynamic: j.KafkaDynamic}
	case "rabbitmq":
		return &rabbitTransport{url: j.URL, name: j.Name, topic: j.Topic}
	default:
		return &natsStream{url: j.URL, name: j.Name, ackWait: j.AckWait}
	}
}

func (s *natsStream) topicTemplate() ferry.TopicTemplate { return "" }

func (t *kafkaTransport) topicTemplate() ferry.TopicTemplate { return ferry.TopicTemplate(t.topic) }

func (t *rabbitTransport) topicTemplate() ferry.TopicTemplate { return ferry.TopicTemplate(t.topic) }
