package shadow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReadNATS reads the messages of stream on subject (a filter, wildcards
// allowed; "" = the whole stream) stored at or after since (zero: from the
// start) and up to the stream's last message when the read began, with an
// ordered ephemeral consumer (nothing is acknowledged or changed). It ends
// when the stream's last message is read or the server says nothing more
// matches and it sent nothing the read did not receive; a fetch that comes
// back empty is not the end.
func ReadNATS(ctx context.Context, js jetstream.JetStream, stream, subject string, since time.Time) ([]Message, error) {
	return readNATS(ctx, js, stream, subject, since, time.Second)
}

// readNATS is ReadNATS with fetchWait, how long one fetch waits for
// messages (tests shorten it below a delayed server's answer).
func readNATS(ctx context.Context, js jetstream.JetStream, stream, subject string, since time.Time, fetchWait time.Duration) ([]Message, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("shadow: stream %s: %w", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("shadow: stream %s: %w", stream, err)
	}
	last := info.State.LastSeq
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if subject != "" {
		cfg.FilterSubjects = []string{subject}
	}
	if !since.IsZero() {
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &since
	}
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("shadow: stream %s: consumer: %w", stream, err)
	}
	var out []Message
	var received uint64 // stream sequence of the last message received
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("shadow: stream %s: %w", stream, err)
		}
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			return nil, fmt.Errorf("shadow: stream %s: fetch: %w", stream, err)
		}
		got := 0
		done := false
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("shadow: stream %s: metadata: %w", stream, err)
			}
			received = md.Sequence.Stream
			if md.Sequence.Stream > last {
				done = true
				continue
			}
			h := map[string]string{}
			for k, v := range m.Headers() {
				if len(v) > 0 {
					h[k] = v[0]
				}
			}
			out = append(out, Message{Seq: md.Sequence.Stream, Headers: h, Body: m.Data()})
			if md.NumPending == 0 || md.Sequence.Stream == last {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("shadow: stream %s: fetch: %w", stream, err)
		}
		if done {
			return out, nil
		}
		if got > 0 {
			continue
		}
		// An empty fetch says only that nothing arrived within the wait
		// (a slow or busy server): ending the read here returned it
		// short, without an error. The consumer says what it sent. What
		// it sent after the last message received never arrived (the
		// fetch had given up; the consumer acknowledges nothing, so it
		// will not send it again): read on from there with a new
		// consumer. Otherwise the read ends when nothing matching is
		// left to send.
		ci, err := cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("shadow: stream %s: consumer info: %w", stream, err)
		}
		switch {
		case ci.Delivered.Consumer > 0 && ci.Delivered.Stream > received:
			next := cfg
			if received > 0 {
				next.DeliverPolicy, next.OptStartSeq, next.OptStartTime = jetstream.DeliverByStartSequencePolicy, received+1, nil
			}
			if cons, err = st.OrderedConsumer(ctx, next); err != nil {
				return nil, fmt.Errorf("shadow: stream %s: consumer: %w", stream, err)
			}
		case ci.NumPending == 0:
			return out, nil
		}
	}
}

// NATSReader is a [Reader] over one JetStream stream (Subject: an optional
// filter).
type NATSReader struct {
	JS      jetstream.JetStream
	Stream  string
	Subject string
}

// Read implements [Reader].
func (r NATSReader) Read(ctx context.Context, since time.Time) ([]Message, error) {
	return ReadNATS(ctx, r.JS, r.Stream, r.Subject, since)
}
