package natsembed

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestWithLogger: the server's notices arrive at Debug and its errors at
// Error, tagged as the server's; a logger at Warn sees no notice. Without
// the option nothing is logged (NoLog), which is why it exists.
func TestWithLogger(t *testing.T) {
	if _, err := Start(WithLogger(nil)); err == nil || !strings.Contains(err.Error(), "WithLogger: logger must not be nil") {
		t.Fatalf("WithLogger(nil): %v", err)
	}
	var debug, warn testenv.Buffer
	for _, tc := range []struct {
		buf   *testenv.Buffer
		level slog.Level
	}{{&debug, slog.LevelDebug}, {&warn, slog.LevelWarn}} {
		s, err := Start(WithLogger(slog.New(slog.NewTextHandler(tc.buf, &slog.HandlerOptions{Level: tc.level}))))
		if err != nil {
			t.Fatal(err)
		}
		// A client that speaks no NATS: the server logs a parser error.
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.ClientURL(), "nats://"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write([]byte("NOT A NATS PROTOCOL LINE\r\n"))
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(tc.buf.String(), "level=ERROR") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		conn.Close()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for name, out := range map[string]string{"debug": debug.String(), "warn": warn.String()} {
		if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "component=nats-server") {
			t.Errorf("%s logger: the parser error is missing or untagged:\n%s", name, out)
		}
	}
	if !strings.Contains(debug.String(), "level=DEBUG") || !strings.Contains(debug.String(), "Server is ready") {
		t.Errorf("debug logger: the start notices are missing:\n%s", debug.String())
	}
	if strings.Contains(warn.String(), "level=DEBUG") || strings.Contains(warn.String(), "level=INFO") {
		t.Errorf("warn logger got lines below Warn:\n%s", warn.String())
	}
}
