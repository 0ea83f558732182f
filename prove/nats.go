package prove

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

// embeddedNATS is an in-process JetStream server on a random loopback port,
// so the embedded stack needs nothing installed and an outage test can stop
// a broker nobody else uses.
type embeddedNATS struct {
	srv *server.Server
	dir string
}

func startEmbeddedNATS() (*embeddedNATS, error) {
	dir, err := os.MkdirTemp("", "ferry-prove-nats-")
	if err != nil {
		return nil, fmt.Errorf("prove: nats store dir: %w", err)
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		NoLog: true, NoSigs: true, MaxPayload: 1 << 20,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("prove: embedded nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		_ = os.RemoveAll(dir)
		return nil, errors.New("prove: embedded nats did not become ready")
	}
	return &embeddedNATS{srv: srv, dir: dir}, nil
}

func (e *embeddedNATS) URL() string { return e.srv.ClientURL() }

func (e *embeddedNATS) Close() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	_ = os.RemoveAll(e.dir)
}

// natsStream is one scenario's stream: a fresh name per run so runs against
// a shared server never see each other's messages.
type natsStream struct {
	url     string
	name    string
	subject string // "<name>.>" captures every event of the run
	ackWait time.Duration
}

func natsConnect(url, name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.Timeout(2*time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond),
		nats.NoCallbacksAfterClientClose())
	if err != nil {
		return nil, nil, fmt.Errorf("prove: connect nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("prove: jetstream: %w", err)
	}
	return nc, js, nil
}

// create makes the stream and the consumer's durable.
func (s *natsStream) create(ctx context.Context) error {
	nc, js, err := natsConnect(s.url, "ferry-prove-admin")
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: s.name, Subjects: []string{s.name + ".>"}, Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return fmt.Errorf("prove: create stream %s: %w", s.name, err)
	}
	_, err = st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "prove", AckPolicy: jetstream.AckExplicitPolicy, AckWait: s.ackWait,
		MaxAckPending: 10000, MaxDeliver: -1, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("prove: create consumer: %w", err)
	}
	return nil
}

func (s *natsStream) destroy(ctx context.Context) {
	nc, js, err := natsConnect(s.url, "ferry-prove-admin")
	if err != nil {
		return
	}
	defer nc.Close()
	_ = js.DeleteStream(ctx, s.name)
}

// streamMsg is one message as the broker stores it: the ground truth of
// what was published, with the broker's own timestamp.
type streamMsg struct {
	Seq     uint64
	EventID string
	Time    time.Time
	Headers map[string]string
	Body    []byte
}

// readAll reads every stored message of the stream, from the broker, by
// sequence: this is what the checker trusts, never a relay's receipt.
func (s *natsStream) readAll(ctx context.Context) ([]streamMsg, error) {
	nc, js, err := natsConnect(s.url, "ferry-prove-checker")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	st, err := js.Stream(ctx, s.name)
	if err != nil {
		return nil, fmt.Errorf("prove: stream %s: %w", s.name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("prove: stream info: %w", err)
	}
	out := make([]streamMsg, 0, info.State.Msgs)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("prove: get msg %d: %w", seq, err)
		}
		h := map[string]string{}
		for k, v := range m.Header {
			if len(v) > 0 {
				h[k] = v[0]
			}
		}
		out = append(out, streamMsg{Seq: m.Sequence, EventID: m.Header.Get("ce-id"), Time: m.Time, Headers: h, Body: m.Data})
	}
	return out, nil
}

// natsPublisher publishes events with Nats-Msg-Id = event id and the
// CloudEvents NATS binding. It implements broker.Publisher.
type natsPublisher struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	subject string
	timeout time.Duration
}

var _ broker.Publisher = (*natsPublisher)(nil)

func newNATSPublisher(url, stream string) (*natsPublisher, error) {
	nc, js, err := natsConnect(url, "ferry-prove-relay")
	if err != nil {
		return nil, err
	}
	return &natsPublisher{nc: nc, js: js, subject: stream, timeout: time.Second}, nil
}

func (p *natsPublisher) Name() string { return "nats" }

func (p *natsPublisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	out := make([]broker.Result, len(events))
	futures := make([]jetstream.PubAckFuture, len(events))
	for i, ev := range events {
		h, body := cloudevents.Encode(cloudevents.NATS, ev, cloudevents.EncodeOptions{Source: "ferry-prove"})
		msg := nats.NewMsg(p.subject + "." + ev.AggregateType)
		for k, v := range h {
			msg.Header.Set(k, v)
		}
		msg.Data = body
		f, err := p.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID.String()))
		if err != nil {
			out[i].Err = broker.NewError(broker.ClassNotSent, err)
			continue
		}
		futures[i] = f
	}
	tctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			out[i].Receipt = broker.Receipt{Broker: "nats", Destination: ack.Stream, Key: events[i].AggregateID, Offset: int64(ack.Sequence), Duplicate: ack.Duplicate}
		case err := <-f.Err():
			out[i].Err = broker.NewError(broker.ClassIndeterminate, err)
		case <-tctx.Done():
			out[i].Err = broker.NewError(broker.ClassIndeterminate, tctx.Err())
		}
	}
	return out
}

func (p *natsPublisher) Ping(ctx context.Context) error {
	if !p.nc.IsConnected() {
		return errors.New("prove: nats not connected")
	}
	_, err := p.js.AccountInfo(ctx)
	return err
}

func (p *natsPublisher) Close() error { p.nc.Close(); return nil }

// natsConsumer pulls from the run's durable consumer. It implements
// broker.Consumer; deliveries of a crashed consumer are simply never acked
// and come back after AckWait, as they would after a process death.
type natsConsumer struct {
	nc     *nats.Conn
	cons   jetstream.Consumer
	closed atomic.Bool
	mu     sync.Mutex
}

var _ broker.Consumer = (*natsConsumer)(nil)

func newNATSConsumer(ctx context.Context, url, stream, durable string) (*natsConsumer, error) {
	nc, js, err := natsConnect(url, "ferry-prove-consumer")
	if err != nil {
		return nil, err
	}
	c, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("prove: consumer: %w", err)
	}
	return &natsConsumer{nc: nc, cons: c}, nil
}

func (c *natsConsumer) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	for ctx.Err() == nil {
		batch, err := c.cons.Fetch(64, jetstream.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		for m := range batch.Messages() {
			if ctx.Err() != nil {
				break // unacked: redelivered after AckWait
			}
			handle(ctx, toDelivery(m))
		}
	}
	return nil
}

func toDelivery(m jetstream.Msg) *broker.Delivery {
	h := map[string]string{}
	for k, v := range m.Headers() {
		if len(v) > 0 {
			h[k] = v[0]
		}
	}
	d := &broker.Delivery{Raw: broker.RawMessage{Destination: m.Subject(), Headers: h, Body: m.Data()}}
	d.Event, d.DecodeErr = cloudevents.Decode(cloudevents.NATS, h, m.Data())
	if md, err := m.Metadata(); err == nil {
		d.Attempt = int(md.NumDelivered)
	}
	d.Ack = func(context.Context) error { return m.Ack() }
	d.Nack = func(_ context.Context, delay time.Duration) error { return m.NakWithDelay(delay) }
	return d
}

func (c *natsConsumer) Close() error { c.nc.Close(); return nil }

// rawPublish publishes arbitrary headers and body (forged and malformed
// messages for the collision and schema scenarios).
func rawPublish(ctx context.Context, url, subject string, headers map[string]string, body []byte, msgID string) error {
	nc, js, err := natsConnect(url, "ferry-prove-forger")
	if err != nil {
		return err
	}
	defer nc.Close()
	msg := nats.NewMsg(subject)
	for k, v := range headers {
		msg.Header.Set(k, v)
	}
	msg.Data = body
	_, err = js.PublishMsg(ctx, msg, jetstream.WithMsgID(msgID))
	return err
}

// createReplayConsumer makes a second durable that starts from the first
// stored message: a replay of the whole retained stream.
func (s *natsStream) createReplayConsumer(ctx context.Context, durable string) error {
	nc, js, err := natsConnect(s.url, "ferry-prove-admin")
	if err != nil {
		return err
	}
	defer nc.Close()
	_, err = js.CreateOrUpdateConsumer(ctx, s.name, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: s.ackWait,
		MaxAckPending: 10000, MaxDeliver: -1, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("prove: replay consumer: %w", err)
	}
	return nil
}

// drained reports whether durable has nothing pending or unacked.
func (s *natsStream) drained(ctx context.Context, durable string) (bool, error) {
	nc, js, err := natsConnect(s.url, "ferry-prove-checker")
	if err != nil {
		return false, err
	}
	defer nc.Close()
	c, err := js.Consumer(ctx, s.name, durable)
	if err != nil {
		return false, fmt.Errorf("prove: consumer %s: %w", durable, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("prove: consumer info: %w", err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}
