package main

import "syscall"

// sysPidfdOpen is pidfd_open(2): 434 on every Linux architecture (common syscall table).
const sysPidfdOpen = 434

func pidfdOpen(pid int) (int, error) {
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}
