//go:build unix

package prove

import (
	"os"
	"syscall"
)

// pauseProc freezes another process (SIGSTOP) until resume: the soak's
// relay pause past its lease.
func pauseProc(p *os.Process) { _ = p.Signal(syscall.SIGSTOP) }
