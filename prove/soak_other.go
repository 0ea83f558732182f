//go:build !unix

package prove

import "os"

// pauseProc: no process pauses here (canStop is false, so the soak does
// not schedule them).
func pauseProc(*os.Process) {}
