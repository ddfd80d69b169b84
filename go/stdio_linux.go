package main

import (
	"os"
	"syscall"
)

// redirectStdio points this process's stdout and stderr at f (dup3), so what the Go
// runtime writes there itself (a panic's trace, a fatal error) lands in the log file too.
func redirectStdio(f *os.File) error {
	for _, fd := range []int{1, 2} {
		if err := syscall.Dup3(int(f.Fd()), fd, 0); err != nil {
			return err
		}
	}
	return nil
}
