package prove

import (
	"context"
	"strings"
	"testing"
)

// brokerFaultStack is the part of Report.Stack naming the broker a
// broker fault runs on.
func brokerFaultStack(kind string) string {
	if strings.HasPrefix(kind, "kafka-") {
		return "kfake"
	}
	return "rabbitmq"
}

// TestBrokerFaultsNeedTheirBroker: on the embedded NATS server the Kafka
// and RabbitMQ fault scenarios say why they cannot run instead of
// passing vacuously (they run in TestKafka and TestRabbitMQ).
func TestBrokerFaultsNeedTheirBroker(t *testing.T) {
	names := []string{kafkaLeaderMove, kafkaBrokerDown, rabbitConnDrop, rabbitChannelClose, rabbitNodeKill}
	rep, err := Run(context.Background(), small(WithScenarios(names...))...)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != len(names) {
		t.Fatalf("%d results for %d scenarios", len(rep.Results), len(names))
	}
	for _, r := range rep.Results {
		want := "kafka://kfake"
		if strings.HasPrefix(r.Scenario, "rabbitmq-") {
			want = "amqp://"
		}
		if r.Status != StatusNotAvailable || !strings.Contains(r.Note, want) {
			t.Errorf("%s: %s %q", r.Scenario, r.Status, r.Note)
		}
	}
}

// TestBrokerFaultBitCanFail: the scenario's own check fails a run in
// which the fault fired less often than planned, the relay published
// nothing while it lasted, or it hit no publish awaiting a confirm (a
// connection drop) or meeting the closed channel, or no publish failed
// across the node kill.
func TestBrokerFaultBitCanFail(t *testing.T) {
	for _, kind := range []string{kafkaLeaderMove, rabbitConnDrop, rabbitChannelClose, rabbitNodeKill} {
		e := &env{sc: &scenario{brokerFault: kind}, rec: newRecorder(), faultPubStart: 7, faultPubEnd: 7}
		v := brokerFaultBit(3)(e, &Figures{FaultsInjected: 2}, nil)
		want := 2
		if kind != kafkaLeaderMove {
			want = 3
		}
		if len(v) != want {
			t.Errorf("%s: violations %q, want %d", kind, v, want)
		}
		e.faultPubEnd, e.faultPubFailed = 9, 1
		e.rec.pubIndeterminate.Store(1)
		e.rec.pubMissing.Store(1)
		if v := brokerFaultBit(3)(e, &Figures{FaultsInjected: 3}, nil); len(v) != 0 {
			t.Errorf("%s: a fault that bit: violations %q", kind, v)
		}
	}
}
