package ferrytest

import (
	"os"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("ferrytest", testenv.Postgres)
	os.Exit(m.Run())
}
