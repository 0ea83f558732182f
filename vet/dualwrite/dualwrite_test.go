package dualwrite_test

import (
	"path/filepath"
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/ferryhq/ferry/vet/dualwrite"
)

// The fixtures live in a module of their own (testdata/go.mod) that replaces
// github.com/ferryhq/ferry with this checkout, so they import the real nats.go,
// jetstream, franz-go, amqp091, sarama and pgx from the module cache.
func TestShapes(t *testing.T) {
	dir, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	analysistest.Run(t, dir, dualwrite.Analyzer, "./shapes")
}

func TestNoFalsePositives(t *testing.T) {
	dir, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	res := analysistest.Run(t, dir, dualwrite.Analyzer, "./clean")
	for _, r := range res {
		if len(r.Diagnostics) != 0 {
			t.Errorf("clean: %d diagnostics, want 0", len(r.Diagnostics))
		}
	}
}
