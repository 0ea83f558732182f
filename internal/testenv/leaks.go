package testenv

import "go.uber.org/goleak"

// KnownLibraryLeaks are goroutines goleak must not count against Ferry:
// bugs in libraries Ferry uses, each with the reason. Packages whose tests
// publish through broker/natsjs pass them to goleak.VerifyTestMain.
func KnownLibraryLeaks() []goleak.Option {
	return []goleak.Option{
		// nats.go v1.55 race: the first PublishAsync starts this goroutine,
		// which reads publisher.connStatusCh under the lock only once it
		// runs; a CleanupPublisher (natsjs.Publisher.Close) in between sets
		// the field to nil and the goroutine blocks on a nil channel forever.
		// It is nats.go's own and holds nothing of Ferry's.
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
	}
}
