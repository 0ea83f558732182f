package dualwrite_test

import (
	"os/exec"
	"path/filepath"
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

// TestLibraries: the matchers for GORM, sqlx, segmentio/kafka-go and the
// AWS SDK v2 SNS client, against the real libraries (the libs fixture
// module, with its own go.mod and go.sum): a true positive per library and
// shape, and read-only or write-free neighbours that must not be reported
// (analysistest fails on any diagnostic without a want).
func TestLibraries(t *testing.T) {
	dir := filepath.Join(analysistest.TestData(), "libs")
	// analysistest loads the fixture module with GOPROXY=off, so its
	// dependencies (GORM, sqlx, kafka-go, the AWS SDK: its own go.mod, not
	// Ferry's) must be in the module cache first. A machine that never
	// built them has an empty cache: download them through the configured
	// proxy, as any build would.
	cmd := exec.Command("go", "mod", "download")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod download in %s (the fixtures' dependencies): %v\n%s", dir, err, out)
	}
	analysistest.Run(t, dir, dualwrite.Analyzer, "./...")
}
