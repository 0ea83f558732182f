package brokertest_test

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/broker/brokertest"
)

// Example shows the shape of an adapter's conformance test (compiled, not
// run: it needs a broker). Setup makes a unique destination per test.
func Example() {
	_ = func(t *testing.T) {
		brokertest.Run(t, brokertest.Harness{
			Capabilities: brokertest.Capabilities{
				DedupByEventID:    true,
				DedupWindow:       2 * time.Minute,
				ReportsDuplicate:  true,
				OrderedByKey:      true,
				Redelivers:        true,
				AttemptCounted:    true,
				OversizedPayload:  1<<20 + 1,
				RedeliveryTimeout: 10 * time.Second,
			},
			Setup: func(t *testing.T) *brokertest.Env {
				// Create a unique stream/topic/queue here and register
				// its deletion with t.Cleanup.
				return &brokertest.Env{
					Topic: "conformance-xyz.events",
					// NewPublisher, NewConsumer, PublishRaw, Outage: ...
				}
			},
		})
	}
}
