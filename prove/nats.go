package prove

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
)

// startEmbeddedNATS starts broker/natsjs's in-process JetStream server on
// a random loopback port, so the embedded stack needs nothing installed;
// its own warnings and errors go to log.
func startEmbeddedNATS(log *slog.Logger) (*natsembed.Server, error) {
	e, err := natsembed.Start(natsembed.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("prove: embedded nats: %w", err)
	}
	return e, nil
}

// natsStream is one scenario's stream: a fresh name per run so runs against
// a shared server never see each other's messages. Events go to subject
// "<name>.order"; the stream captures "<name>.>".
type natsStream struct {
	url     string
	name    string
	ackWait time.Duration
	// leaders counts the nodes that take themselves for the leader of a
	// stream (consumer "") or of one of its consumers (prove's in-process
	// cluster; nil elsewhere): the checker reads only while there is
	// exactly one.
	leaders func(stream, consumer string) int
}

var _ transport = (*natsStream)(nil)

func (s *natsStream) kind() string { return "nats" }

func (s *natsStream) publisher(_ context.Context, via string) (broker.Publisher, error) {
	url := s.url
	if via != "" {
		url = "nats://" + via
	}
	subject := s.name + ".order"
	p, err := natsjs.DialPublisher(url, natsjs.WithSource("ferry-prove"), natsjs.WithAckTimeout(2*time.Second),
		natsjs.WithSubject(func(*ferry.Event) string { return subject }))
	if err != nil {
		return nil, fmt.Errorf("prove: publisher: %w", err)
	}
	return p, nil
}

func (s *natsStream) consumer(ctx context.Context, durable string) (broker.Consumer, error) {
	c, err := natsjs.DialConsumer(ctx, s.url, s.name, durable, natsjs.WithAckWait(s.ackWait))
	if err != nil {
		return nil, fmt.Errorf("prove: consumer: %w", err)
	}
	return c, nil
}

func (s *natsStream) forge(ctx context.Context, headers map[string]string, body []byte, msgID string) error {
	return rawPublish(ctx, s.url, s.name+".order", headers, body, msgID)
}

func (s *natsStream) replay(ctx context.Context, durable string) error {
	return s.createReplayConsumer(ctx, durable)
}

func (s *natsStream) endpoint() string {
	u, err := url.Parse(s.url)
	if err != nil {
		return ""
	}
	return u.Host
}

func (s *natsStream) job() transportJob {
	return transportJob{Kind: "nats", URL: s.url, Name: s.name, AckWait: s.ackWait}
}

func (s *natsStream) unsupported(*scenario) string { return "" }

func natsConnect(url, name string, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name(name), nats.Timeout(2 * time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond),
		nats.NoCallbacksAfterClientClose()}, extra...)...)
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
// what was published, with the broker's own timestamp where it keeps one
// (zero otherwise: the lag then comes from the publish acknowledgement).
type streamMsg struct {
	EventID string
	Time    time.Time
	Headers map[string]string
	Body    []byte
	key     string // Kafka record key / AMQP routing key
	// Where the broker stored it: the Kafka partition and offset, or the
	// JetStream stream sequence (offset). RabbitMQ keeps neither.
	partition int32
	offset    int64
}

// readAll reads every stored message of the stream, from the broker, by
// sequence: this is what the checker trusts, never a relay's receipt.
func (s *natsStream) readAll(ctx context.Context) ([]streamMsg, error) {
	var out []streamMsg
	err := retryUnavailable(ctx, func() (err error) {
		out, err = s.readAllOnce(ctx)
		return err
	})
	return out, err
}

func (s *natsStream) readAllOnce(ctx context.Context) ([]streamMsg, error) {
	if err := s.oneLeader(""); err != nil {
		return nil, err
	}
	bound, err := committedBound(ctx, s.url, s.name)
	if err != nil {
		return nil, err
	}
	out, err := readThrough(ctx, s.url, s.name, bound)
	if err != nil {
		return nil, err
	}
	if err := s.oneLeader(""); err != nil {
		return nil, err
	}
	return out, nil
}

// oneLeader fails transiently while the cluster's nodes do not agree on a
// single stream leader. Right after a heal the cut-off leader still takes
// itself for one and, its routes back, answers every server's clients —
// stream info and message gets both — often before the real leader does,
// so no bound asked of the servers is safe from it (CI: a read after the
// heal returned the 41 messages the old leader held, of 100); only the
// nodes themselves can say it.
//
// The same holds for a consumer's info (consumer non-empty): a cut-off
// consumer leader answers with its ack floor and pending counts as they
// were, which can make owed or drained wrong.
func (s *natsStream) oneLeader(consumer string) error {
	if s.leaders == nil {
		return nil
	}
	if n := s.leaders(s.name, consumer); n != 1 {
		what := "stream " + s.name
		if consumer != "" {
			what = "consumer " + s.name + "/" + consumer
		}
		return fmt.Errorf("prove: %s: %d nodes take themselves for its leader: %w", what, n, errNotFromLeader)
	}
	return nil
}

// askTimeout bounds each request the checker sends to JetStream. A
// server without a leader to answer for it (a node cut off from the rest)
// leaves a request unanswered, and the client's request timeout is the
// context's deadline: bounded by a test's or a scenario's context alone,
// one such request waited for all of it (TestConsumerInfoThroughTheLeader
// and TestReadAllThroughTheLeader each spent their whole 6-minute context
// that way, once, the request made through the cut-off node during the
// cut), and the retries meant for a cluster in transition never ran.
const askTimeout = 2 * time.Second

// committedBound is the highest last sequence any server of url (asked
// one by one, each on a connection of its own) reports for the stream.
// Every server's store holds only messages its group committed, so the
// stream holds at least this much; asking each server alone reaches the
// majority's leader even when one server is cut off from the rest.
func committedBound(ctx context.Context, url, stream string) (uint64, error) {
	var bound uint64
	servers := strings.Split(url, ",")
	var errs []error
	for _, one := range servers {
		last, err := func() (uint64, error) {
			// That server alone, each ask bounded (askTimeout).
			ctx, cancel := context.WithTimeout(ctx, askTimeout)
			defer cancel()
			nc, js, err := natsConnect(strings.TrimSpace(one), "ferry-prove-checker", nats.NoReconnect())
			if err != nil {
				return 0, err
			}
			defer nc.Close()
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return 0, fmt.Errorf("prove: stream %s: %w", stream, err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				return 0, fmt.Errorf("prove: stream info via %s: %w", one, err)
			}
			return info.State.LastSeq, nil
		}()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		bound = max(bound, last)
	}
	if len(errs) == len(servers) {
		return 0, errors.Join(errs...)
	}
	return bound, nil
}

// readThrough walks the stream through url, message by message ("the next
// message at or after seq", which only a server that takes itself for
// the stream's leader answers, 503 while there is none), until the
// answer is that there is no more, and checks the walk reached bound.
// Neither stream info nor the answering leader is trusted on its own:
// while a group has no leader any replica answers stream info with its
// own state, and a leader cut off from the others keeps answering reads
// with what it held when it was cut off until it notices — a read bounded
// by the one, or ended by the other, came back short without an error
// (CI once judged every event of nats-partition "held by no copy"). A
// walk that ends before bound is transient: read again. (prove deletes
// no message, so the last sequence always holds one.)
func readThrough(ctx context.Context, url, stream string, bound uint64) ([]streamMsg, error) {
	nc, js, err := natsConnect(url, "ferry-prove-checker")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	sctx, cancel := context.WithTimeout(ctx, askTimeout)
	st, err := js.Stream(sctx, stream)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("prove: stream %s: %w", stream, err)
	}
	var out []streamMsg
	var last uint64
	for seq := uint64(1); ; {
		mctx, cancel := context.WithTimeout(ctx, askTimeout)
		m, err := st.GetMsg(mctx, seq, jetstream.WithGetMsgSubject(">"))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("prove: get msg at or after %d: %w", seq, err)
		}
		h := map[string]string{}
		for k, v := range m.Header {
			if len(v) > 0 {
				h[k] = v[0]
			}
		}
		out = append(out, streamMsg{EventID: m.Header.Get("ce-id"), Time: m.Time, Headers: h, Body: m.Data, offset: int64(m.Sequence)})
		last = m.Sequence
		seq = m.Sequence + 1
	}
	if last < bound {
		return nil, fmt.Errorf("prove: stream %s: the read ended at sequence %d, a server reported %d before it began: %w",
			stream, last, bound, errNotFromLeader)
	}
	return out, nil
}

// errNotFromLeader marks a read answered by a server that is not the
// stream's current leader (a stale leader, a replica): transient in a
// cluster in transition, so the checker's reads retry it
// (brokerUnavailable).
var errNotFromLeader = errors.New("answer not from the current leader")

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

// owed: the messages above durable's ack floor. Some of them may have been
// acked individually (the floor is the end of the contiguous acked
// prefix), so this can only overstate what is still owed, never hide a
// message the consumer skipped for good: once everything is acked the
// floor is the last sequence.
func (s *natsStream) owed(ctx context.Context, durable string, msgs []streamMsg) (owedSet, error) {
	var out owedSet
	err := retryUnavailable(ctx, func() (err error) {
		out, err = s.owedOnce(ctx, durable, msgs)
		return err
	})
	return out, err
}

func (s *natsStream) owedOnce(ctx context.Context, durable string, msgs []streamMsg) (owedSet, error) {
	info, err := s.consumerInfo(ctx, durable)
	if err != nil {
		return owedSet{}, err
	}
	ids := map[string]bool{}
	for _, m := range msgs {
		if m.EventID != "" && uint64(m.offset) > info.AckFloor.Stream {
			ids[m.EventID] = true
		}
	}
	return owedSet{ids: ids}, nil
}

// drained reports whether durable has nothing pending or unacked.
func (s *natsStream) drained(ctx context.Context, durable string) (bool, error) {
	var out bool
	err := retryUnavailable(ctx, func() (err error) {
		out, err = s.drainedOnce(ctx, durable)
		return err
	})
	return out, err
}

func (s *natsStream) drainedOnce(ctx context.Context, durable string) (bool, error) {
	info, err := s.consumerInfo(ctx, durable)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}

// consumerInfo is durable's info, taken while exactly one node takes
// itself for the consumer's leader (checked before and after; on prove's
// in-process cluster) — transient otherwise, like the stream's read.
func (s *natsStream) consumerInfo(ctx context.Context, durable string) (*jetstream.ConsumerInfo, error) {
	if err := s.oneLeader(durable); err != nil {
		return nil, err
	}
	nc, js, err := natsConnect(s.url, "ferry-prove-checker")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	c, err := js.Consumer(ctx, s.name, durable)
	if err != nil {
		return nil, fmt.Errorf("prove: consumer %s: %w", durable, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("prove: consumer info: %w", err)
	}
	if err := s.oneLeader(durable); err != nil {
		return nil, err
	}
	return info, nil
}

// unavailableRetry bounds how long the checker's broker reads retry a
// JetStream that answers "temporarily unavailable" (503) or times out: on
// a cluster that just healed a node, a read may land on a server whose
// meta layer has not caught up yet. A broker that stays unavailable
// longer still fails the run.
const unavailableRetry = 20 * time.Second

func retryUnavailable(ctx context.Context, read func() error) error {
	deadline := time.Now().Add(unavailableRetry)
	for {
		err := read()
		if err == nil || !brokerUnavailable(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// brokerUnavailable reports the transient answers of a JetStream cluster in
// transition; anything else (no such stream, bad request) is final.
func brokerUnavailable(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 503 {
		return true
	}
	return errors.Is(err, errNotFromLeader) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, context.DeadlineExceeded)
}
