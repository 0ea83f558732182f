package prove

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"
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
	goleak.VerifyTestMain(m,
		// nats-server and pgx keep package-level background goroutines.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"),
		// nats.go v1.55 race: the first PublishAsync starts this goroutine,
		// which reads publisher.connStatusCh under the lock only once it
		// runs; a CleanupPublisher (broker/natsjs Close) in between sets the
		// channel to nil and the goroutine blocks on a nil channel forever.
		// Seen once in a full run; the goroutine is nats.go's own.
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	)
}
