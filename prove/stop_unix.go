//go:build unix

package prove

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// stopSelf freezes the whole process (every goroutine, the lease heartbeat
// included) until someone sends SIGCONT: a GC pause or a frozen VM, the
// situation fencing exists for.
func stopSelf() { _ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) }

// canStop reports whether process pauses can be injected here.
const canStop = true

// isStopped reports whether pid is stopped (Linux /proc; false elsewhere).
func isStopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

func resume(p *os.Process) { _ = p.Signal(syscall.SIGCONT) }

func terminate(p *os.Process) { _ = p.Signal(syscall.SIGTERM) }
