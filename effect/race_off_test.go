//go:build !race

package effect_test

const raceEnabled = false
