//go:build race

package prove

// raceEnabled: the race detector slows prove's subprocesses and SQLite
// roughly tenfold on this kind of machine.
const raceEnabled = true
