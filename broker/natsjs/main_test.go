package natsjs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("broker/natsjs", testenv.NATS)
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

// server is one NATS server a test runs against.
type testServer struct {
	name string
	url  string
	emb  *natsembed.Server // nil for the system server
}

// servers returns the system NATS (2.9.10 on the dev machine; skipped when
// absent) and a fresh embedded current server, so every behaviour is
// checked on both.
func servers(t *testing.T) []testServer {
	t.Helper()
	emb := startEmbedded(t)
	out := []testServer{{name: "embedded", url: emb.ClientURL(), emb: emb}}
	if u := systemURL(t); u != "" {
		out = append(out, testServer{name: "system", url: u})
	}
	return out
}

// systemURL returns the system server's URL, or "" (with a log line) when
// it is absent and services are not required.
func systemURL(t *testing.T) string {
	t.Helper()
	u := testenv.URL("FERRY_TEST_NATS_URL", testenv.DefaultNATSURL)
	if err := testenv.Reachable(u); err != nil {
		if testenv.Required() {
			t.Fatalf("system NATS at %s unreachable (FERRY_REQUIRE_SERVICES=1): %v", u, err)
		}
		t.Logf("system NATS at %s unreachable, testing the embedded server only: %v", u, err)
		return ""
	}
	return u
}

// startEmbedded starts an embedded server whose warnings and errors go to
// stderr (not t.Log: the server may log after the test ended), so a
// failure the server explains only in its log — CI's rare "error creating
// store for stream" — comes with its cause.
func startEmbedded(t *testing.T, opts ...natsembed.Option) *natsembed.Server {
	t.Helper()
	warn := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	emb, err := natsembed.Start(append([]natsembed.Option{natsembed.WithLogger(warn)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := emb.Close(); err != nil {
			t.Error(err)
		}
	})
	return emb
}

func connect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func randName(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// newStream creates a uniquely named stream capturing "<name>.>" (deleted
// at cleanup) and returns its name and the subject prefix.
func newStream(t *testing.T, nc *nats.Conn, mod ...func(*StreamConfig)) (stream, prefix string) {
	t.Helper()
	stream = randName("FERRYTEST_")
	prefix = randName("ft")
	cfg := StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}, DuplicateWindow: time.Minute}
	for _, m := range mod {
		m(&cfg)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := EnsureStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if nc.IsClosed() {
			return
		}
		_ = js.DeleteStream(ctx, stream)
	})
	return stream, prefix
}
