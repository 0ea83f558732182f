//go:build unix

// Package ownerdir gives temporary directories an owner that is alive for
// as long as a lock is held: a process that makes a scratch directory
// (a throwaway database cluster, an in-process NATS cluster's stores)
// locks it, and a later run removes the directories whose owner died —
// SIGKILLed before it could clean up — without touching those of runs
// still going. The lock is flock(2): on systems without it (Windows) Lock
// only creates the file and Sweep removes nothing (ownerdir_other.go).
package ownerdir

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockName is the lock file inside an owned directory.
const lockName = "owner.lock"

// unlockedGrace is how long a directory that never got its lock (its
// owner died between creating it and locking it, or is just doing so) is
// left alone.
const unlockedGrace = time.Minute

// Lock takes an exclusive flock on dir's lock file. It is held until the
// returned file is closed or the process dies.
func Lock(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ownerdir: lock %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("ownerdir: lock %s: %w", dir, err)
	}
	return f, nil
}

// Sweep removes the directories matching pattern (a filepath.Glob
// pattern) whose owner is dead: its lock is free, or it was never locked
// and is older than a minute. Before removing one it calls cleanup (may be
// nil) with the directory, e.g. to kill a server the owner left running.
// It returns the directories it removed.
func Sweep(pattern string, cleanup func(dir string)) []string {
	dirs, _ := filepath.Glob(pattern)
	var removed []string
	for _, dir := range dirs {
		f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR, 0)
		if err != nil {
			if st, serr := os.Stat(dir); serr == nil && st.IsDir() && time.Since(st.ModTime()) > unlockedGrace {
				if os.RemoveAll(dir) == nil {
					removed = append(removed, dir)
				}
			}
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			_ = f.Close()
			continue // its owner is alive
		}
		if cleanup != nil {
			cleanup(dir)
		}
		if os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
		_ = f.Close()
	}
	return removed
}

// Held reports whether some live process holds dir's lock (a directory
// without a lock file is not held). A process that holds the lock itself
// on another descriptor also sees it held.
func Held(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return true
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}
