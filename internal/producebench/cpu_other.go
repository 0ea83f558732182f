//go:build !unix

package producebench

import "time"

func selfCPU() time.Duration { return -1 }
