package prove

import (
	"context"
	"os"
	"os/signal"
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
		stop()
		if err != nil && ctx.Err() == nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Announce("prove", testenv.Postgres, testenv.MySQL, testenv.NATS, testenv.RabbitMQ)
	goleak.VerifyTestMain(m, append(testenv.KnownLibraryLeaks(),
		// nats-server and pgx keep package-level background goroutines.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"),
	)...)
}
