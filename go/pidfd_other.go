//go:build !linux

package main

import "syscall"

func pidfdOpen(int) (int, error) { return -1, syscall.ENOSYS }
