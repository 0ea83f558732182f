package testenv

import (
	"net"
	"strings"
	"testing"
)

func TestUnavailableNamesPackageServerAndWhere(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := "postgres://u:secret@" + l.Addr().String() + "/db"
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	down := "nats://" + l2.Addr().String()
	l2.Close() // nothing listens there now
	defer l.Close()
	t.Setenv("FERRY_TEST_POSTGRES_URL", up)
	t.Setenv("FERRY_TEST_NATS_URL", down)
	got := unavailable("relay", []Server{Postgres, NATS})
	if len(got) != 1 {
		t.Fatalf("lines %q, want one for NATS", got)
	}
	for _, want := range []string{"ferry relay:", "need NATS", down, "FERRY_TEST_NATS_URL"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("%q lacks %q", got[0], want)
		}
	}
	t.Setenv("FERRY_TEST_POSTGRES_URL", "postgres://u:secret@"+l2.Addr().String()+"/db")
	got = unavailable("ops", []Server{Postgres})
	if len(got) != 1 || strings.Contains(got[0], "secret") {
		t.Fatalf("password not redacted or line missing: %q", got)
	}
}
