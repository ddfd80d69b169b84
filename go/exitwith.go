package main

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// pollInterval is the fallback check when pidfd is unavailable (kernel < 5.3, not Linux).
const pollInterval = 500 * time.Millisecond

// watchPID closes the returned channel once process pid is gone. On Linux it waits on a
// pidfd through the runtime's poller: exact and free while waiting. A pid number alone can
// be reused, but the pidfd refers to the process that had it when we opened it; the
// launcher passes its own pid, which exists when we start, so the window is only between
// its exec of us and our pidfd_open.
func watchPID(pid int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if waitPidfd(pid) {
			return
		}
		for processAlive(pid) {
			time.Sleep(pollInterval)
		}
	}()
	return done
}

// processAlive reports whether signal 0 can reach pid; EPERM means it exists but is not
// ours to signal, which still counts as alive.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// waitPidfd blocks until pid exits and returns true, or returns false when pidfds are not
// supported so the caller falls back to polling.
func waitPidfd(pid int) bool {
	fd, err := pidfdOpen(pid)
	if errors.Is(err, syscall.ESRCH) {
		return true
	}
	if err != nil {
		return false
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return false
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	// A pidfd becomes readable when the process exits. The first callback returns false
	// to park on the poller; the second runs after readiness.
	calls := 0
	err = rc.Read(func(uintptr) bool {
		calls++
		return calls > 1
	})
	return err == nil
}
