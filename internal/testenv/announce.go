package testenv

import (
	"fmt"
	"io"
	"os"
)

// A Server is a service some of a package's tests need.
type Server struct {
	Name    string // e.g. "Postgres"
	Env     string // the variable that points at it
	Default string // its URL when Env is unset
}

// The servers tests find through FERRY_TEST_*_URL.
var (
	Postgres = Server{Name: "Postgres", Env: "FERRY_TEST_POSTGRES_URL", Default: DefaultPostgresURL}
	NATS     = Server{Name: "NATS", Env: "FERRY_TEST_NATS_URL", Default: DefaultNATSURL}
	RabbitMQ = Server{Name: "RabbitMQ", Env: "FERRY_TEST_RABBITMQ_URL", Default: DefaultRabbitMQURL}
)

// Announce is called first in a package's TestMain. For each server the
// package's tests need that does not answer, it prints one line saying
// which tests will skip and why. `go test ./...` shows a passing package's
// output only with -v, so the line goes to the terminal (/dev/tty) when
// there is one, and to stderr otherwise (-v and failures show it). With
// FERRY_REQUIRE_SERVICES=1 it prints nothing: the tests fail instead.
func Announce(pkg string, servers ...Server) {
	if Required() {
		return
	}
	missing := unavailable(pkg, servers)
	if len(missing) == 0 {
		return
	}
	var w io.Writer = os.Stderr
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		w = tty
	}
	for _, m := range missing {
		fmt.Fprintln(w, m)
	}
}

// unavailable returns one line for each of servers that does not answer.
func unavailable(pkg string, servers []Server) []string {
	var missing []string
	for _, s := range servers {
		u := URL(s.Env, s.Default)
		if err := Reachable(u); err != nil {
			missing = append(missing, fmt.Sprintf("ferry %s: skipping the tests that need %s at %s (%s): %v", pkg, s.Name, redact(u), s.Env, err))
		}
	}
	return missing
}
