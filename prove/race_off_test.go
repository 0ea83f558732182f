//go:build !race

package prove

const raceEnabled = false
