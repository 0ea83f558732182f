package logattr_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/logattr"
)

func TestErr(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	l.Info("x", logattr.Err(errors.New("boom")), logattr.Err(nil))
	if got := buf.String(); !strings.Contains(got, ` err=boom`) || strings.Count(got, "err=") != 1 {
		t.Fatalf("line %q: want one err=boom and nothing for the nil error", got)
	}
}

func TestOrDefault(t *testing.T) {
	if logattr.OrDefault(nil) != slog.Default() {
		t.Fatal("OrDefault(nil) is not slog.Default()")
	}
	l := slog.New(slog.DiscardHandler)
	if logattr.OrDefault(l) != l {
		t.Fatal("OrDefault(l) is not l")
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://ferry:s3cret@db:5432/app?sslmode=disable", "postgres://ferry:xxxxx@db:5432/app?sslmode=disable"},
		{"amqp://guest:s3cret@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"postgres://db/app?password=s3cret&user=ferry", "postgres://db/app?password=xxxxx&user=ferry"},
		{"host=db user=ferry password=s3cret dbname=app", "host=db user=ferry password=xxxxx dbname=app"},
		{"ferry:s3cret@db:5432", "xxxxx@db:5432"},
		{"postgres://ferry@db/app", "postgres://ferry@db/app"},
		{"sqlite:/tmp/ferry.db", "sqlite:/tmp/ferry.db"},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
	} {
		got := logattr.RedactURL(tc.in)
		if got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q keeps the secret", tc.in, got)
		}
	}
}
