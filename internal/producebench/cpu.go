package producebench

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// CPUClock is CPU time consumed so far. Client is this process (user +
// system); Server is every process named "postgres" on this host, i.e. the
// whole local Postgres instance: backends, WAL writer, checkpointer,
// autovacuum. Either is -1 when it cannot be read (not Linux, or Postgres
// is on another host, or /proc is not readable).
//
// The server figure is only meaningful when nothing else uses that Postgres
// instance during the measurement; it is what shows, on a CPU-bound
// machine, where a difference in throughput comes from.
type CPUClock struct {
	Client time.Duration
	Server time.Duration
}

// ReadCPU reads the clocks.
func ReadCPU() CPUClock {
	return CPUClock{Client: selfCPU(), Server: postgresCPU()}
}

// clockTicks is USER_HZ, the unit of utime/stime in /proc/PID/stat; it is
// 100 on every Linux architecture Go supports.
const clockTicks = 100

func postgresCPU() time.Duration {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil || len(stats) == 0 {
		return -1
	}
	var ticks int64
	found := false
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the process ended
		}
		t, ok := parseStat(b, "postgres")
		if ok {
			ticks += t
			found = true
		}
	}
	if !found {
		return -1
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// parseStat returns utime+stime from a /proc/PID/stat line when the
// process's command name is comm. The name is in parentheses and may itself
// contain spaces and parentheses, so fields are counted from the last ")".
func parseStat(b []byte, comm string) (int64, bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open || string(b[open+1:end]) != comm {
		return 0, false
	}
	f := bytes.Fields(b[end+1:])
	// After the name: state(0) ppid(1) … utime(11) stime(12).
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	s, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + s, true
}
