package encrypt_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/internal/testenv"
)

// Relays, embedded NATS servers, inboxes and pools started by the tests
// must all be gone when the tests end.
func TestMain(m *testing.M) {
	testenv.Announce("encrypt", testenv.Postgres, testenv.MySQL)
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}
