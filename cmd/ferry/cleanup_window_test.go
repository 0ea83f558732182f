package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
)

// `ferry cleanup window --set` compares --broker-dedup-window with the
// real stream's duplicate window (an embedded JetStream server, stream
// created with 2 minutes): 1s is refused naming both numbers, stored only
// with --allow-below-broker (and a warning); 5m is accepted; Kafka and
// RabbitMQ say they have nothing to compare; no --broker-url says so.
func TestCleanupWindowComparesWithStream(t *testing.T) {
	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}, DuplicateWindow: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	url := "sqlite:" + filepath.Join(t.TempDir(), "window.db")
	if out, err := runCLI(t, "migrate", "up", "--database-url", url); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	set := func(window string, extra ...string) (string, error) {
		return runCLI(t, append([]string{"cleanup", "window", "--set", "--database-url", url, "--broker-dedup-window", window,
			"--approve", "--reason", "match the stream"}, extra...)...)
	}
	stored := func() string {
		out, err := runCLI(t, "cleanup", "window", "--database-url", url)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	nats := []string{"--broker-url", emb.ClientURL(), "--stream", "ORDERS"}

	out, err := set("1s", nats...)
	want := `ops: refusing broker dedup window 1s: the duplicate window of JetStream stream "ORDERS" (Duplicates) is 2m0s; ` +
		`the stored window stands for the broker's and must be at least 2m0s (a shorter one lets cleanup delete rows the broker's redelivery still needs); ` +
		`pass --allow-below-broker to store it anyway`
	if err == nil || err.Error() != want {
		t.Fatalf("--broker-dedup-window 1s against a 2m stream: %v\n%s\nwant error %s", err, out, want)
	}
	if got := stored(); !strings.Contains(got, "broker dedup window 2m0s") {
		t.Fatalf("a refused --set changed the stored window: %s", got)
	}

	out, err = set("1s", append(nats, "--allow-below-broker")...)
	if err != nil || !strings.Contains(out, "WARNING: ops: refusing broker dedup window 1s") || !strings.Contains(out, "storing it anyway (--allow-below-broker)") ||
		!strings.Contains(out, "stored broker dedup window 1s") {
		t.Fatalf("--allow-below-broker: %v\n%s", err, out)
	}
	if got := stored(); !strings.Contains(got, "broker dedup window 1s") {
		t.Fatalf("stored window after --allow-below-broker: %s", got)
	}

	out, err = set("5m", nats...)
	if err != nil || !strings.Contains(out, `the duplicate window of JetStream stream "ORDERS" (Duplicates) is 2m0s: --broker-dedup-window 5m0s covers it`) {
		t.Fatalf("--broker-dedup-window 5m: %v\n%s", err, out)
	}

	if _, err := set("1m", "--broker-url", emb.ClientURL(), "--stream", "NOPE"); err == nil || !strings.Contains(err.Error(), "--stream NOPE: read the duplicate window") {
		t.Fatalf("unknown stream: %v", err)
	}
	for url, note := range map[string]string{
		"kafka://127.0.0.1:9092": "note: Kafka has no broker-side dedup window",
		"amqp://127.0.0.1:5672":  "note: RabbitMQ has no dedup window",
		"":                       "note: --broker-dedup-window not compared with the broker",
	} {
		args := []string{}
		if url != "" {
			args = []string{"--broker-url", url}
		}
		if out, err := set("1s", args...); err != nil || !strings.Contains(out, note) {
			t.Errorf("--broker-url %q: %v\n%s", url, err, out)
		}
	}
}
