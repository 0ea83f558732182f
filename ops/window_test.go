package ops_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ferryhq/ferry/ops"
)

// CheckBrokerWindow refuses a broker dedup window shorter than the
// broker's own, naming both, and accepts an equal or longer one.
func TestCheckBrokerWindow(t *testing.T) {
	src := `the duplicate window of JetStream stream "ORDERS" (Duplicates)`
	err := ops.CheckBrokerWindow(ops.Window{BrokerDedupWindow: time.Second}, 2*time.Minute, src)
	var bwe *ops.BrokerWindowError
	if !errors.Is(err, ops.ErrWindowBelowBroker) || !errors.As(err, &bwe) || bwe.Requested != time.Second || bwe.Broker != 2*time.Minute || bwe.Source != src {
		t.Fatalf("1s against 2m: %v", err)
	}
	for _, d := range []time.Duration{2 * time.Minute, time.Hour} {
		if err := ops.CheckBrokerWindow(ops.Window{BrokerDedupWindow: d}, 2*time.Minute, src); err != nil {
			t.Errorf("%s against 2m: %v", d, err)
		}
	}
}
