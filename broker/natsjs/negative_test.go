package natsjs

import (
	"context"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/brokertest"
)

// TestConformanceCanFail proves the conformance suite catches broken
// adapters: it runs the suite, in a child process, against the real NATS
// adapter with one fault injected (or one capability misdeclared) and
// expects exactly the case guarding that property to fail.
func TestConformanceCanFail(t *testing.T) {
	if os.Getenv(negativeEnv) != "" {
		t.Skip("inside a negative-control child")
	}
	for _, c := range []struct{ mode, subtest, why string }{
		{"reorder", "PublishConsumeOrderAndReceipts", "a publisher that reverses each batch breaks per-aggregate order"},
		{"dropack", "AckedNotRedelivered", "a consumer whose Ack reports success without acking gets redeliveries"},
		{"nodedup", "DuplicateEventID", "declaring no dedup on a deduplicating broker is a false declaration"},
		{"permanent", "OutageClassifiedAndRecovers", "a publisher calling an outage permanent would dead-letter rows"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestBrokenAdapter$/^"+c.subtest+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), negativeEnv+"="+c.mode)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "--- FAIL: TestBrokenAdapter/"+c.subtest) {
				t.Fatalf("%s: the suite did not fail (err %v):\n%s", c.why, err, out)
			}
		})
	}
}

const negativeEnv = "FERRY_BROKERTEST_NEGATIVE"

// TestBrokenAdapter is the child side of TestConformanceCanFail.
func TestBrokenAdapter(t *testing.T) {
	mode := os.Getenv(negativeEnv)
	if mode == "" {
		t.Skip("run by TestConformanceCanFail")
	}
	caps := natsCaps(64<<10 + 1)
	if mode == "nodedup" {
		caps.DedupByEventID, caps.ReportsDuplicate = false, false
	}
	brokertest.Run(t, brokertest.Harness{
		Capabilities: caps,
		Setup: func(t *testing.T) *brokertest.Env {
			emb := startEmbedded(t, natsembed.WithMaxPayload(64<<10))
			admin := connect(t, emb.ClientURL())
			env := natsEnv(t, admin, emb.ClientURL(), func(t *testing.T) func() {
				emb.Shutdown()
				return func() {
					if err := emb.Restart(); err != nil {
						t.Fatal(err)
					}
				}
			})
			newPub, newCons := env.NewPublisher, env.NewConsumer
			switch mode {
			case "reorder":
				env.NewPublisher = func(t *testing.T) broker.Publisher { return reversing{newPub(t)} }
			case "permanent":
				env.NewPublisher = func(t *testing.T) broker.Publisher { return allPermanent{newPub(t)} }
			case "dropack":
				env.NewConsumer = func(t *testing.T) broker.Consumer { return fakeAck{newCons(t)} }
			}
			return env
		},
	})
}

// reversing publishes each batch in reverse order.
type reversing struct{ broker.Publisher }

func (r reversing) Publish(ctx context.Context, evs []ferry.Event) []broker.Result {
	rev := slices.Clone(evs)
	slices.Reverse(rev)
	res := r.Publisher.Publish(ctx, rev)
	slices.Reverse(res)
	return res
}

// allPermanent classifies every failure as permanent.
type allPermanent struct{ broker.Publisher }

func (a allPermanent) Publish(ctx context.Context, evs []ferry.Event) []broker.Result {
	res := a.Publisher.Publish(ctx, evs)
	for i := range res {
		if res[i].Err != nil {
			res[i].Err = broker.NewError(broker.ClassPermanent, res[i].Err)
		}
	}
	return res
}

// fakeAck reports acks as done without sending them.
type fakeAck struct{ broker.Consumer }

func (f fakeAck) Consume(ctx context.Context, handle func(context.Context, *broker.Delivery)) error {
	return f.Consumer.Consume(ctx, func(ctx context.Context, d *broker.Delivery) {
		d.Ack = func(context.Context) error { return nil }
		handle(ctx, d)
	})
}
