package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/cloudevents"
)

// BrokerName is the Receipt.Broker and Publisher.Name of this adapter.
const BrokerName = "nats"

// Defaults of the publisher options.
const (
	DefaultAckTimeout = 5 * time.Second
	DefaultMaxPending = 4096
)

var _ broker.Publisher = (*Publisher)(nil)

// Publisher publishes outbox events to JetStream. It is safe for concurrent
// use; every Publish call waits only for its own acknowledgements.
type Publisher struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	ownsConn bool
	source   string
	subject  func(*ferry.Event) string
	ackWait  time.Duration
	// pubOpts are the same for every message (built once: each option is
	// a closure, and this runs per event).
	pubOpts []jetstream.PublishOpt

	closeOnce sync.Once
}

// PublisherOption configures a Publisher.
type PublisherOption func(*publisherConfig) error

type publisherConfig struct {
	source     string
	ackTimeout time.Duration
	maxPending int
	subject    func(*ferry.Event) string
	ownsConn   bool
}

// WithSource sets the CloudEvents source attribute (default "ferry"), a
// URI-reference naming the producing service, e.g. "ferry://orders".
func WithSource(source string) PublisherOption {
	return func(c *publisherConfig) error {
		if source == "" {
			return errors.New("natsjs: WithSource: source must not be empty")
		}
		c.source = source
		return nil
	}
}

// WithAckTimeout bounds how long Publish waits for each PubAck after
// sending (default 5s). A message whose ack does not arrive in time fails
// with ClassIndeterminate: JetStream may have stored it, and a retry is
// absorbed by the duplicate window because the Nats-Msg-Id is the event id.
func WithAckTimeout(d time.Duration) PublisherOption {
	return func(c *publisherConfig) error {
		if d <= 0 {
			return fmt.Errorf("natsjs: WithAckTimeout: %v must be > 0", d)
		}
		c.ackTimeout = d
		return nil
	}
}

// WithMaxPending bounds the asynchronous publishes in flight on the
// connection (default 4096); Publish blocks, then fails with ClassNotSent,
// when the server does not keep up.
func WithMaxPending(n int) PublisherOption {
	return func(c *publisherConfig) error {
		if n < 1 {
			return fmt.Errorf("natsjs: WithMaxPending: %d must be >= 1", n)
		}
		c.maxPending = n
		return nil
	}
}

// WithSubject replaces the subject mapping (default: the event's Topic).
// Whatever it returns must be captured by one stream, and it must map all
// events of one aggregate to the same stream, or per-aggregate order is
// lost. A common variant is topic + "." + tenant, for per-tenant filters.
func WithSubject(f func(*ferry.Event) string) PublisherOption {
	return func(c *publisherConfig) error {
		if f == nil {
			return errors.New("natsjs: WithSubject: nil function")
		}
		c.subject = f
		return nil
	}
}

// TopicSubject is the default subject mapping: subject = event topic.
func TopicSubject(ev *ferry.Event) string { return ev.Topic }

// NewPublisher publishes through nc, which the caller keeps owning: Close
// does not close it. Connect nc with Connect (or with nats.ReconnectBufSize(-1))
// so that a publish during a disconnection fails at once as not sent,
// instead of sitting in the client's reconnect buffer.
func NewPublisher(nc *nats.Conn, opts ...PublisherOption) (*Publisher, error) {
	if nc == nil {
		return nil, errors.New("natsjs: NewPublisher: nil connection")
	}
	cfg := publisherConfig{
		source:     cloudevents.DefaultSource,
		ackTimeout: DefaultAckTimeout,
		maxPending: DefaultMaxPending,
		subject:    TopicSubject,
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.maxPending),
		// The library's own timer frees the pending-ack slot of a message
		// whose ack never comes; Publish's wait uses the same bound.
		jetstream.WithPublishAsyncTimeout(cfg.ackTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("natsjs: jetstream: %w", err)
	}
	return &Publisher{
		nc:       nc,
		js:       js,
		ownsConn: cfg.ownsConn,
		source:   cfg.source,
		subject:  cfg.subject,
		ackWait:  cfg.ackTimeout,
		pubOpts: []jetstream.PublishOpt{
			// A retry after "no responders" would re-send this message
			// after later ones: keep order, let the relay retry the whole
			// event. (It would also read the reused header map.)
			jetstream.WithRetryAttempts(0),
			// At MaxPending, wait for acks to free slots rather than
			// failing a large batch after the library's default 200ms.
			jetstream.WithStallWait(cfg.ackTimeout),
		},
	}, nil
}

// DialPublisher connects to url with Connect and returns a Publisher that
// owns the connection (Close closes it).
func DialPublisher(url string, opts ...PublisherOption) (*Publisher, error) {
	nc, err := Connect(url)
	if err != nil {
		return nil, err
	}
	p, err := NewPublisher(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.ownsConn = true
	return p, nil
}

// Connect dials NATS with the settings Ferry's adapters expect: endless
// reconnection (the relay's circuit breaker decides when to give up, not
// the client), and no reconnect buffer, so that a publish while
// disconnected fails immediately as definitely-not-sent rather than being
// queued and flushed, unacknowledged, after reconnection. Extra options
// are applied after these.
func Connect(url string, opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{
		nats.Name("ferry"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.RetryOnFailedConnect(false),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		return nil, fmt.Errorf("natsjs: connect: %w", err)
	}
	return nc, nil
}

// Name returns "nats".
func (p *Publisher) Name() string { return BrokerName }

// JetStream returns the JetStream context the publisher uses (for
// provisioning with EnsureStream / CheckStream).
func (p *Publisher) JetStream() jetstream.JetStream { return p.js }

type inflight struct {
	subject string
	paf     jetstream.PubAckFuture
}

// Publish sends all events pipelined (PublishMsgAsync, Nats-Msg-Id = event
// id, no client-side retry so nothing is re-sent out of order), then waits
// for every PubAck, bounded by ctx and the ack timeout. Events go out in
// slice order on one connection, so a stream stores them in that order.
//
// If an event of an aggregate cannot even be sent, later events of the
// same aggregate in this call are not sent either (they fail as
// ClassNotSent), so the broker never holds a later event without the
// earlier one because of this call. Failures after sending (no ack in
// time, disconnection) cannot be undone: later events of that aggregate may
// already be stored, and the relay's retry of the failed one arrives after
// them; the consumer's sequence check (gap → park) handles that.
//
// Error classes: a client-side rejection before sending (connection
// closed or disconnected, too many pending) is ClassNotSent; a message
// larger than the server's max_payload, an invalid subject, or a stream's
// max_msg_size is ClassPermanent; a subject no stream captures is
// ClassNotSent marked broker.ErrDestinationMissing (a configuration fault
// the relay holds until a stream captures it, never dead); an error
// returned by the stream (insufficient resources etc.) is ClassNotSent;
// no ack in time, a disconnection while waiting, or ctx ending is
// ClassIndeterminate.
func (p *Publisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	res := make([]broker.Result, len(events))
	fl := make([]inflight, len(events))
	hs := newHeaderScratch()
	var hb broker.HoldBack
	for i := range events {
		ev := &events[i]
		if err := hb.Held("natsjs", ev); err != nil {
			res[i].Err = err
			continue
		}
		subject := p.subject(ev)
		fl[i].subject = subject
		paf, err := p.send(ctx, ev, subject, hs)
		if err != nil {
			res[i].Err = err
			hb.Fail(ev)
			continue
		}
		fl[i].paf = paf
	}

	timer := time.NewTimer(p.ackWait)
	defer timer.Stop()
	expired := false
	for i := range events {
		if fl[i].paf == nil {
			continue
		}
		res[i] = p.await(ctx, timer, &expired, fl[i])
	}
	return res
}

// idHeader is the CloudEvents id header of the NATS binding.
var idHeader = cloudevents.NATS.Header(cloudevents.AttrID)

// maxHeaders bounds the headers one message carries: what
// cloudevents.EncodeTo writes (twelve required, the traceparent twice, five
// optional) and Nats-Msg-Id.
const maxHeaders = 20

// headerScratch is one message's header map and the backing array of its
// values, reused for every message of a Publish call. The client encodes
// the headers into its write buffer inside PublishMsgAsync and reads the
// map no more (it would only for a retry after "no responders", or for
// the async callbacks, and this publisher sets neither), so one map serves
// the whole batch. A fresh map per message was a quarter of the relay's
// allocations per event (1.5 KB of the map's groups), held until the
// batch's acks came back.
type headerScratch struct {
	h    nats.Header
	vals []string
}

func newHeaderScratch() *headerScratch {
	return &headerScratch{h: make(nats.Header, maxHeaders), vals: make([]string, 0, maxHeaders)}
}

func (p *Publisher) send(ctx context.Context, ev *ferry.Event, subject string, hs *headerScratch) (jetstream.PubAckFuture, error) {
	if err := ctx.Err(); err != nil {
		return nil, broker.NewError(broker.ClassNotSent, fmt.Errorf("natsjs: not sent: %w", err))
	}
	if err := checkSubject(subject); err != nil {
		return nil, broker.NewError(broker.ClassPermanent, err)
	}
	// Straight into the reused header map: every header's value is a
	// one-element window on one backing array.
	clear(hs.h)
	hs.vals = hs.vals[:0]
	set := func(k, v string) {
		hs.vals = append(hs.vals, v)
		hs.h[k] = hs.vals[len(hs.vals)-1 : len(hs.vals) : len(hs.vals)]
	}
	msg := &nats.Msg{Subject: subject, Header: hs.h}
	msg.Data = cloudevents.EncodeTo(cloudevents.NATS, ev, cloudevents.EncodeOptions{Source: p.source}, func(k, v string) {
		set(k, v)
		if k == idHeader {
			// JetStream's dedup key is the event id, as Encode formatted
			// it (what jetstream.WithMsgID would set).
			set(jetstream.MsgIDHeader, v)
		}
	})
	paf, err := p.js.PublishMsgAsync(msg, p.pubOpts...)
	// The message the future keeps must not show the next message's
	// headers.
	msg.Header = nil
	if err != nil {
		return nil, classifySendError(err)
	}
	return paf, nil
}

// checkSubject rejects what NATS would refuse or misroute: empty tokens,
// whitespace, and wildcards (a publish subject must be literal).
func checkSubject(s string) error {
	if s == "" {
		return fmt.Errorf("natsjs: empty subject (event has no topic)")
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("natsjs: invalid subject %q", s)
		}
	}
	return nil
}

func classifySendError(err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return broker.NewError(broker.ClassPermanent, fmt.Errorf("natsjs: message too large: %w", err))
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, jetstream.ErrInvalidSubject):
		return broker.NewError(broker.ClassPermanent, fmt.Errorf("natsjs: %w", err))
	}
	// Everything PublishMsgAsync returns synchronously happened before
	// the message was written: closed, draining, reconnecting without a
	// buffer, stalled on max pending.
	return broker.NewError(broker.ClassNotSent, fmt.Errorf("natsjs: not sent: %w", err))
}

func (p *Publisher) await(ctx context.Context, timer *time.Timer, expired *bool, f inflight) broker.Result {
	if !*expired {
		select {
		case ack := <-f.paf.Ok():
			return broker.Result{Receipt: receipt(ack, f.subject)}
		case err := <-f.paf.Err():
			return broker.Result{Err: p.classifyAckError(ctx, err, f.subject)}
		case <-ctx.Done():
			*expired = true
		case <-timer.C:
			*expired = true
		}
	}
	// Past the deadline: take what has already arrived, nothing more.
	select {
	case ack := <-f.paf.Ok():
		return broker.Result{Receipt: receipt(ack, f.subject)}
	case err := <-f.paf.Err():
		return broker.Result{Err: p.classifyAckError(ctx, err, f.subject)}
	default:
	}
	cause := context.Cause(ctx)
	if cause == nil {
		cause = fmt.Errorf("no ack within %v", p.ackWait)
	}
	return broker.Result{Err: broker.NewError(broker.ClassIndeterminate,
		fmt.Errorf("natsjs: sent, outcome unknown: %w", cause))}
}

func receipt(ack *jetstream.PubAck, subject string) broker.Receipt {
	return broker.Receipt{
		Broker:      BrokerName,
		Destination: ack.Stream,
		Key:         subject,
		Offset:      int64(ack.Sequence),
		Duplicate:   ack.Duplicate,
	}
}

// classifyAckError maps what came back instead of a PubAck.
func (p *Publisher) classifyAckError(ctx context.Context, err error, subject string) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		// "No responders": nothing received the message. Either no stream
		// captures the subject (a missing destination: held until one
		// does) or JetStream is momentarily unavailable (not sent: retry).
		// Ask which.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, lerr := p.js.StreamNameBySubject(lctx, subject)
		if errors.Is(lerr, jetstream.ErrStreamNotFound) {
			return broker.DestinationMissing(fmt.Sprintf("nats subject %q", subject),
				fmt.Errorf("natsjs: no stream captures subject %q: %w", subject, err))
		}
		return broker.NewError(broker.ClassNotSent, fmt.Errorf("natsjs: not stored: %w", err))
	case errors.As(err, &apiErr):
		if apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum {
			return broker.NewError(broker.ClassPermanent, fmt.Errorf("natsjs: message exceeds the stream's max_msg_size: %w", err))
		}
		// The stream answered with an error: it did not store the message.
		return broker.NewError(broker.ClassNotSent, fmt.Errorf("natsjs: rejected by stream: %w", err))
	}
	// ErrAsyncPublishTimeout, nats.ErrDisconnected, ErrInvalidJSAck,
	// ErrJetStreamPublisherClosed: sent, fate unknown.
	return broker.NewError(broker.ClassIndeterminate, fmt.Errorf("natsjs: sent, outcome unknown: %w", err))
}

// Ping checks that the server answers and JetStream is enabled for the
// account (an AccountInfo round trip).
func (p *Publisher) Ping(ctx context.Context) error {
	if p.nc.IsClosed() {
		return fmt.Errorf("natsjs: ping: %w", nats.ErrConnectionClosed)
	}
	if !p.nc.IsConnected() {
		return fmt.Errorf("natsjs: ping: not connected (status %s)", p.nc.Status())
	}
	if _, err := p.js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("natsjs: ping: %w", err)
	}
	return nil
}

// Close releases the publisher's reply subscription (failing acks still
// awaited) and closes the connection if the publisher owns it.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.js.CleanupPublisher()
		if p.ownsConn {
			p.nc.Close()
		}
	})
	return nil
}
