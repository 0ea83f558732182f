package statebench

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("internal/statebench", testenv.Postgres)
	if code := m.Run(); code != 0 {
		os.Exit(code)
	}
	if err := goleak.Find(); err != nil {
		os.Stderr.WriteString("goleak: " + err.Error() + "\n")
		os.Exit(1)
	}
}
