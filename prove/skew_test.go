package prove

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestRelayClockSkew runs relay-clock-skew on SQLite (leases by the host
// clock, which the injected clocks do not move) and on Postgres (leases
// by the database clock): both steps of the stepping clock are read and
// nothing is lost or reordered; a row published twice had its late mark
// fenced.
func TestRelayClockSkew(t *testing.T) {
	parallelUnlessRace(t)
	for name, stack := range map[string]func(t *testing.T) []Option{
		"sqlite":   func(*testing.T) []Option { return nil },
		"postgres": func(t *testing.T) []Option { return []Option{WithPostgres(testenv.PostgresURL(t))} },
	} {
		t.Run(name, func(t *testing.T) {
			opts := stack(t)
			rep, err := Run(context.Background(), small(append(opts, WithScenarios("relay-clock-skew"))...)...)
			if err != nil {
				t.Fatal(err)
			}
			assertMatrix(t, rep, nil)
			r, _ := rep.Result("relay-clock-skew")
			if r.Status != StatusPass || r.Figures.FaultsInjected != 2 || r.Figures.DuplicatePublishes > r.Figures.FencedWrites || r.Figures.Committed == 0 {
				t.Errorf("relay-clock-skew: %s %v %+v", r.Status, r.Violations, r.Figures)
			}
		})
	}
}

// TestCheckSkewNeedsAFenceForEveryDuplicate: duplicates matched by fenced
// marks pass; a duplicate publish without a fenced mark (two relays both
// holding a shard) is a violation.
func TestCheckSkewNeedsAFenceForEveryDuplicate(t *testing.T) {
	if v := checkSkew(nil, &Figures{FaultsInjected: 2, DuplicatePublishes: 3, FencedWrites: 3}, nil); len(v) != 0 {
		t.Errorf("3 duplicates, 3 fenced: %v", v)
	}
	if v := checkSkew(nil, &Figures{FaultsInjected: 2, DuplicatePublishes: 3, FencedWrites: 1}, nil); len(v) != 1 {
		t.Errorf("3 duplicates, 1 fenced: %v, want one violation", v)
	}
}
