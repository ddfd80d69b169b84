package main

import (
	"net"
	"syscall"
	"unsafe"
)

// unreadBytes is how many bytes have arrived on conn's socket and not been read yet
// (ioctl SIOCINQ), or -1 when that cannot be told. At a lost PING it says which side was
// late: bytes waiting mean the upstream answered and this process had not read it yet.
func unreadBytes(conn net.Conn) int {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	raw.Control(func(fd uintptr) {
		var v int32
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&v))); errno == 0 {
			n = int(v)
		}
	})
	return n
}
