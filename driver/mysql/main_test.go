package mysql_test

import (
	"os"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Announce("driver/mysql", testenv.MySQL)
	os.Exit(m.Run())
}
