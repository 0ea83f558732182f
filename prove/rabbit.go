package prove

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/rabbitmq"
)

// rabbitTransport is one scenario's exchange and quorum queue on RabbitMQ,
// through Ferry's broker/rabbitmq adapter. A second, prove-owned queue
// bound to the same exchange (the audit queue) receives a copy of every
// routed message: draining it is how the checker learns what the broker
// accepted, since consuming the real queue is destructive.
type rabbitTransport struct {
	url   string
	name  string // exchange and queue
	topic string // routing key

	mu   sync.Mutex
	seen []streamMsg // audit copies drained so far
}

var _ transport = (*rabbitTransport)(nil)

func (t *rabbitTransport) auditQueue() string { return t.name + "-audit" }

func newRabbitTransport(ctx context.Context, rawURL, scenario string) (*rabbitTransport, error) {
	t := &rabbitTransport{url: rawURL, name: "prove-" + scenario + "-" + randHex(4)}
	t.topic = "prove_" + randHex(4) + ".order"
	if err := rabbitmq.EnsureTopology(ctx, rawURL, rabbitmq.Topology{Exchange: t.name, Queue: t.name}); err != nil {
		return nil, fmt.Errorf("prove: rabbitmq topology: %w", err)
	}
	err := t.withChannel(func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(t.auditQueue(), true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(t.auditQueue(), "#", t.name, false, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("prove: rabbitmq audit queue: %w", err)
	}
	return t, nil
}

func (t *rabbitTransport) withChannel(f func(*amqp.Channel) error) error {
	conn, err := amqp.Dial(t.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return f(ch)
}

func (t *rabbitTransport) kind() string { return "rabbitmq" }

func (t *rabbitTransport) publisher(_ context.Context, via string) (broker.Publisher, error) {
	u := t.url
	if via != "" {
		pu, err := url.Parse(t.url)
		if err != nil {
			return nil, fmt.Errorf("prove: rabbitmq url: %w", err)
		}
		pu.Host = via
		u = pu.String()
	}
	p, err := rabbitmq.NewPublisher(u, rabbitmq.WithExchange(t.name), rabbitmq.WithSource("ferry-prove"), rabbitmq.WithDialTimeout(2*time.Second))
	if err != nil {
		return nil, fmt.Errorf("prove: rabbitmq publisher: %w", err)
	}
	return p, nil
}

func (t *rabbitTransport) consumer(context.Context, string) (broker.Consumer, error) {
	c, err := rabbitmq.NewConsumer(t.url, t.name, rabbitmq.WithPrefetch(64), rabbitmq.WithReconnectDelay(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("prove: rabbitmq consumer: %w", err)
	}
	return c, nil
}

// readAll drains the audit queue into memory and returns every copy seen
// so far. RabbitMQ keeps no arrival time, so Time is zero (lag then comes
// from the publish confirms).
func (t *rabbitTransport) readAll(context.Context) ([]streamMsg, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	err := t.withChannel(func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(t.auditQueue(), true)
			if err != nil {
				return err
			}
			if !ok {
				return nil
			}
			h := map[string]string{}
			for k, v := range d.Headers {
				h[k] = fmt.Sprint(v)
			}
			if d.ContentType != "" {
				h["content-type"] = d.ContentType
			}
			h["message-id"] = d.MessageId
			t.seen = append(t.seen, streamMsg{EventID: h["cloudEvents:id"], Headers: h, Body: d.Body, key: d.RoutingKey})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("prove: rabbitmq audit read: %w", err)
	}
	return append([]streamMsg(nil), t.seen...), nil
}

func (t *rabbitTransport) forge(ctx context.Context, headers map[string]string, body []byte, msgID string) error {
	return t.withChannel(func(ch *amqp.Channel) error {
		tbl := amqp.Table{}
		ct := ""
		for k, v := range headers {
			switch k {
			case "content-type":
				ct = v
			case "message-id":
			default:
				tbl[k] = v
			}
		}
		return ch.PublishWithContext(ctx, t.name, t.topic, false, false, amqp.Publishing{
			Headers: tbl, ContentType: ct, MessageId: msgID, Body: body, DeliveryMode: amqp.Persistent})
	})
}

func (t *rabbitTransport) replay(context.Context, string) error {
	return fmt.Errorf("prove: rabbitmq queues cannot be replayed")
}

func (t *rabbitTransport) drained(context.Context, string) (bool, error) { return false, nil }

// owed: a queue says how many messages are ready, not which; unacked
// ones held by a live consumer are not counted (a dead consumer's return
// to ready).
func (t *rabbitTransport) owed(context.Context, string, []streamMsg) (owedSet, error) {
	var n int
	err := t.withChannel(func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(t.name, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	if err != nil {
		return owedSet{}, fmt.Errorf("prove: rabbitmq queue depth: %w", err)
	}
	return owedSet{count: n}, nil
}

func (t *rabbitTransport) endpoint() string {
	u, err := url.Parse(t.url)
	if err != nil {
		return ""
	}
	return u.Host
}

func (t *rabbitTransport) job() transportJob {
	return transportJob{Kind: "rabbitmq", URL: t.url, Name: t.name, Topic: t.topic}
}

func (t *rabbitTransport) unsupported(sc *scenario) string {
	if sc.cleanup != "" {
		return "a RabbitMQ queue is consumed destructively: there is no stream to replay after a cleanup"
	}
	return ""
}

func (t *rabbitTransport) destroy(ctx context.Context) {
	_ = rabbitmq.DeleteTopology(ctx, t.url, rabbitmq.Topology{Exchange: t.name, Queue: t.name})
	_ = t.withChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(t.auditQueue(), false, false, false)
		return err
	})
}
