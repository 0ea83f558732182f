package main

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// childEnv makes the test binary run the CLI instead of the tests: commands
// that start themselves as a subprocess (bench consume --recovery) do so
// through os.Executable, which under `go test` is this binary.
const childEnv = "FERRY_TEST_RUN_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		cmd := newRootCmd()
		cmd.SetArgs(os.Args[1:])
		if err := cmd.ExecuteContext(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, errorLine(err))
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Announce("cmd/ferry", testenv.Postgres, testenv.MySQL, testenv.NATS, testenv.RabbitMQ)
	os.Exit(m.Run())
}
