package producebench

import (
	"os"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("internal/producebench", testenv.Postgres)
	os.Exit(m.Run())
}
