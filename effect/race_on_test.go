//go:build race

package effect_test

// raceEnabled scales the heaviest workloads down under the race detector,
// which slows this package ~10x; the full-size runs happen without -race.
const raceEnabled = true
