//go:build !linux

package main

import "os"

// redirectStdio is a no-op off Linux: the log still goes to the file through the logger,
// but a runtime panic's trace goes to the stderr the process was given.
func redirectStdio(*os.File) error { return nil }
