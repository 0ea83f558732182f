package dualwrite_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/ferryhq/ferry/vet/dualwrite"
	"github.com/ferryhq/ferry/vet/dualwrite/dualwritetest"
)

// The fixtures live in a module of their own (testdata, loaded through a copy
// made by dualwritetest.Fixture) that replaces github.com/ferryhq/ferry with
// this checkout, so they import the real nats.go, jetstream, franz-go,
// amqp091, sarama and pgx from the module cache.
func TestShapes(t *testing.T) {
	dir := dualwritetest.Fixture(t)
	analysistest.Run(t, dir, dualwrite.Analyzer, "./shapes")
}

func TestNoFalsePositives(t *testing.T) {
	dir := dualwritetest.Fixture(t)
	res := analysistest.Run(t, dir, dualwrite.Analyzer, "./clean")
	for _, r := range res {
		if len(r.Diagnostics) != 0 {
			t.Errorf("clean: %d diagnostics, want 0", len(r.Diagnostics))
		}
	}
}
