package outbox

import (
	"os"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("outbox", testenv.Postgres, testenv.MySQL)
	os.Exit(m.Run())
}
