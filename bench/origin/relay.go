package main

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// serveRelay forwards each accepted connection to target and closes both sides once neither
// direction has carried a byte for idle: AWS Global Accelerator's 340 s rule, scaled down.
// TCP keepalives carry no payload and so never reach the copy loops: only application data
// (HTTP/2 PINGs included) keeps a connection alive, as on the real path.
func serveRelay(l net.Listener, target string, idle time.Duration, st *stats) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		st.relayConns.Add(1)
		go relayConn(c, target, idle, st)
	}
}

func relayConn(down net.Conn, target string, idle time.Duration, st *stats) {
	up, err := net.Dial("tcp", target)
	if err != nil {
		down.Close()
		return
	}
	var last atomic.Int64 // unix nanos of the last byte either way
	last.Store(time.Now().UnixNano())
	var closeOnce sync.Once
	done := make(chan struct{})
	closeBoth := func() {
		closeOnce.Do(func() {
			close(done)
			down.Close()
			up.Close()
		})
	}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		closeBoth()
	}
	go pipe(up, down)
	go pipe(down, up)

	// Check ten times per idle period: a drop lands within idle*1.1 of the last byte.
	tick := time.NewTicker(idle / 10)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-tick.C:
			if now.UnixNano()-last.Load() >= int64(idle) {
				st.relayDrops.Add(1)
				closeBoth()
				return
			}
		}
	}
}
