package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/deploy"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/relay"
)

// embeddedNATS starts a JetStream server of the test's own (never the
// shared one) with a stream for the test topics, and a publisher.
func embeddedNATS(t *testing.T) *natsjs.Publisher {
	t.Helper()
	_, pub := jetStream(t, "OPSTEST", 0)
	return pub
}

// jetStream starts a JetStream server of the test's own with stream over
// the subject order.events (duplicate window dup; 0: the server's
// default) and returns a connection to it and a publisher.
func jetStream(t *testing.T, stream string, dup time.Duration) (*nats.Conn, *natsjs.Publisher) {
	t.Helper()
	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatalf("embedded nats: %v", err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: stream, Subjects: []string{"order.events"}, DuplicateWindow: dup}); err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return nc, pub
}

// runRelay runs a real relay until the returned stop is called.
func runRelay(t *testing.T, e *env, r *relay.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("relay run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("relay did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRelayStoppedBacklogAlertFiresAndRecovers stops a real relay, lets
// (simulated) time pass, and evaluates the shipped alert rule against the
// ops collector's metrics: it fires while the relay is down and clears
// once a restarted relay has drained the backlog.
func TestRelayStoppedBacklogAlertFiresAndRecovers(t *testing.T) {
	if _, err := deploy.Promtool(); err != nil {
		testenv.Unavailable(t, "%v", err) // skips, or fails under FERRY_REQUIRE_SERVICES=1
	}
	both(t, func(t *testing.T, e *env) {
		o := e.ops
		reg := prometheus.NewRegistry()
		reg.MustRegister(ops.NewCollector(o))
		// backlogAlert asks promtool whether FerryOutboxBacklogStale (the
		// shipped rule) selects exactly these topics on the collector's
		// series; the other alerts are not this test's subject, so they
		// are expected as they stand (unowned shards while no relay runs).
		backlogAlert := func(stage string, topics []string, unowned bool) {
			t.Helper()
			fams, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]map[string]string{}
			for _, tp := range topics {
				want["FerryOutboxBacklogStale"] = append(want["FerryOutboxBacklogStale"], map[string]string{"topic": tp})
			}
			if unowned {
				want["FerryShardsUnowned"] = []map[string]string{{}}
			}
			if err := deploy.CheckFiring(context.Background(), deploy.AlertRulesYAML, fams, want); err != nil {
				t.Fatalf("%s: %v", stage, err)
			}
		}
		oldest := func() float64 {
			st, err := o.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return st.Outbox.OldestPendingAge
		}
		pending := func() int64 {
			return count(t, e, fmt.Sprintf(`SELECT count(*) FROM %s WHERE status = 'pending'`, tn("outbox")))
		}

		pub := embeddedNATS(t)
		relayReg := prometheus.NewRegistry()
		r, err := relay.New(e.db, pub, relay.WithShardCount(4), relay.WithPollInterval(20*time.Millisecond),
			relay.WithLeaseTTL(2*time.Second), relay.WithInstanceID("relay-a"), relay.WithRegisterer(relayReg))
		if err != nil {
			t.Fatal(err)
		}

		// Running: events are published, nothing fires.
		stop := runRelay(t, e, r)
		e.insert(t, event("1", "order.created"), event("2", "order.created"))
		waitFor(t, "first events published", func() bool { return pending() == 0 })
		backlogAlert("relay running", nil, false)

		// Stopped: the backlog ages past 60 s and the alert fires.
		stop()
		e.insert(t, event("3", "order.created"), event("4", "order.paid"))
		// 90 s pass with the relay down: the rows were committed 90 s ago.
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET created_at = $1 WHERE status = 'pending'`, tn("outbox")), time.Now().Add(-90*time.Second).UTC())
		if age := oldest(); age < 60 {
			t.Fatalf("oldest pending age %.1fs after 90 s with the relay down, want > 60", age)
		}
		backlogAlert("relay down", []string{"order.events"}, true)
		// Why the rule reads the ops gauges: a stopped relay exports nothing
		// current, so the backlog has one exporter, this Collector, and the
		// relay's registry holds no backlog series to alert on.
		relayFams, err := relayReg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range relayFams {
			if n := f.GetName(); strings.Contains(n, "pending") || strings.HasPrefix(n, "ferry_outbox_") {
				t.Fatalf("the relay exports %s; the backlog is ops.Collector's fact", n)
			}
		}

		// Restarted: the backlog drains and the alert clears.
		r2, err := relay.New(e.db, pub, relay.WithShardCount(4), relay.WithPollInterval(20*time.Millisecond),
			relay.WithLeaseTTL(2*time.Second), relay.WithInstanceID("relay-b"))
		if err != nil {
			t.Fatal(err)
		}
		runRelay(t, e, r2)
		waitFor(t, "backlog drained after restart", func() bool { return pending() == 0 })
		if age := oldest(); age != 0 {
			t.Fatalf("oldest pending age %.1f after the drain, want 0", age)
		}
		backlogAlert("recovered", nil, false)
		st, err := o.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var owned int
		for _, rs := range st.Relays {
			if rs.InstanceID == "relay-b" {
				owned = len(rs.OwnedShards)
			}
		}
		if owned != 4 {
			t.Fatalf("status relays %+v, want relay-b owning 4 shards", st.Relays)
		}
	})
}
