package prove

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	if IsWorker() {
		// Re-executed as a relay subprocess by the relay-sigkill scenario.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := RunWorker(ctx)
		signalled := ctx.Err() != nil // before stop, which cancels ctx
		stop()
		if err != nil && !signalled {
			// The parent keeps this output (a node's log file) for its error.
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Announce("prove", testenv.Postgres, testenv.MySQL, testenv.NATS, testenv.RabbitMQ)
	widenParallel()
	goleak.VerifyTestMain(m, append(testenv.KnownLibraryLeaks(),
		// nats-server and pgx keep package-level background goroutines.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"),
	)...)
}

// parallelUnlessRace runs t beside the package's other parallel tests
// (go test's -parallel, GOMAXPROCS by default), except under the race
// detector. These tests mostly wait — on lease expiries, kills, restarts
// and settle loops (the package used about 0.8 of one core over a
// sequential run) — and run one after another they took 11 minutes, more
// than go test's default 10-minute limit for `go test ./...`. Under -race
// they use the CPU they wait on, so CI's -race run keeps them sequential
// (with its own -timeout). A test that sets the environment (t.Setenv) or
// counts directories other tests make stays sequential: those run before
// any parallel one starts.
func parallelUnlessRace(t *testing.T) {
	if !raceEnabled {
		t.Parallel()
	}
}

// proveParallel is how many of the package's parallel tests run at once
// without -race, unless the caller sets -parallel. They wait on lease
// expiries, kills, restarts and settle loops; with go test's default of
// GOMAXPROCS (2 here) the package took 468–567 s of `go test ./...`'s
// 10-minute limit per package.
const proveParallel = 4

// widenParallel raises -test.parallel to proveParallel when the caller left
// it at its default (TestMain may parse the testing flags itself).
func widenParallel() {
	if raceEnabled {
		return
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	p := flag.Lookup("test.parallel")
	if set || p == nil {
		return
	}
	if n, err := strconv.Atoi(p.Value.String()); err == nil && n < proveParallel {
		_ = flag.Set("test.parallel", strconv.Itoa(proveParallel))
	}
}
