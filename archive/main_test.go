package archive_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("archive", testenv.Postgres, testenv.MySQL)
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}
