package brokertest

import (
	"testing"

	"github.com/ferryhq/ferry/internal/faultproxy"
)

// NewProxy puts Ferry's fault proxy (internal/faultproxy) on a random
// loopback port in front of target (host:port), for outage tests against a
// shared broker that must not be stopped (the system NATS or RabbitMQ):
// point the adapter's clients at Addr, then Cut and Restore (or Set any
// other fault). It is closed at the end of the test.
func NewProxy(t testing.TB, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}
