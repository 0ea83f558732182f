package natsjs

import (
	"context"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/brokertest"
)

const conformanceAckWait = 2 * time.Second

func natsCaps(oversized int) brokertest.Capabilities {
	return brokertest.Capabilities{
		DedupByEventID:    true,
		DedupWindow:       time.Minute,
		ReportsDuplicate:  true,
		OrderedByKey:      true,
		Redelivers:        true,
		AttemptCounted:    true,
		OversizedPayload:  oversized,
		RedeliveryTimeout: conformanceAckWait + 8*time.Second,
	}
}

// natsEnv builds a brokertest.Env for clients connecting to clientURL,
// with stream management through admin (a connection that survives the
// outage hook).
func natsEnv(t *testing.T, admin *nats.Conn, clientURL string, outage func(t *testing.T) func()) *brokertest.Env {
	stream, prefix := newStream(t, admin)
	durable := randName("durable_")
	topic := prefix + ".events"
	return &brokertest.Env{
		Topic: topic,
		NewPublisher: func(t *testing.T) broker.Publisher {
			p, err := DialPublisher(clientURL, WithSource("ferry://conformance"), WithAckTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		NewConsumer: func(t *testing.T) broker.Consumer {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := DialConsumer(ctx, clientURL, stream, durable, WithAckWait(conformanceAckWait), WithMaxAckPending(500))
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		PublishRaw: func(t *testing.T, headers map[string]string, body []byte) {
			js, err := jetstream.New(admin)
			if err != nil {
				t.Fatal(err)
			}
			msg := nats.NewMsg(topic)
			for k, v := range headers {
				msg.Header.Set(k, v)
			}
			msg.Data = body
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
		},
		Outage: outage,
	}
}

// TestConformanceEmbedded runs the suite against a current nats-server
// running in-process, one per test; the outage stops and restarts it on
// the same store directory.
func TestConformanceEmbedded(t *testing.T) {
	const maxPayload = 64 << 10
	brokertest.Run(t, brokertest.Harness{
		Capabilities: natsCaps(maxPayload + 1),
		Setup: func(t *testing.T) *brokertest.Env {
			emb := startEmbedded(t, natsembed.WithMaxPayload(maxPayload))
			admin := connect(t, emb.ClientURL())
			return natsEnv(t, admin, emb.ClientURL(), func(t *testing.T) func() {
				emb.Shutdown()
				return func() {
					if err := emb.Restart(); err != nil {
						t.Fatalf("restart embedded server: %v", err)
					}
				}
			})
		},
	})
}

// TestConformanceSystem runs the suite against the machine's NATS server
// (2.9.10 here); the outage cuts a TCP proxy the test owns, never the
// shared server.
func TestConformanceSystem(t *testing.T) {
	sys := systemURL(t)
	if sys == "" {
		t.Skip("system NATS unavailable")
	}
	u, err := url.Parse(sys)
	if err != nil {
		t.Fatal(err)
	}
	brokertest.Run(t, brokertest.Harness{
		Capabilities: natsCaps(1<<20 + 1), // default max_payload 1 MiB
		Setup: func(t *testing.T) *brokertest.Env {
			admin := connect(t, sys)
			proxy := brokertest.NewProxy(t, u.Host)
			return natsEnv(t, admin, "nats://"+proxy.Addr(), func(t *testing.T) func() {
				proxy.Cut()
				return proxy.Restore
			})
		},
	})
}
