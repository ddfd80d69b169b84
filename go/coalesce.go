package main

// coalesce.go owns the write coalescing under upstream TLS connections (coalescingConn).
// Must not: reorder bytes, or write a buffer that writers may still append to (that once
// corrupted the upstream TLS stream; TestCoalescingConnEmptyRoundKeepsTheBufferBeingWrittenApart).
//
// Why it is kept (paired bench/proxy.py run, builds alternated, bench/results/proxy.md):
// without it, c=16 served 0.75x the requests/s (3,398 vs 4,551) at 1.28x the CPU per
// request, with 2.5x the p99 latency.

import (
	"net"
	"runtime"
	"sync"
)

// maxPending bounds the bytes a coalescingConn holds for its flusher; a writer beyond it
// waits. HTTP/2 flow control already bounds what is in flight, so this is a safety net.
const maxPending = 1 << 20

// keepBuffer is the largest queue buffer kept for reuse; a bigger one (a large request
// body went through) is left to the GC rather than held by an idle connection.
const keepBuffer = 64 << 10

// coalescingConn is the TCP connection under an upstream TLS connection. Go's HTTP/2
// client flushes once per request (its HEADERS frame), which made one TLS record and one
// write(2) per request: at concurrency 16 the writes were the largest single cost of the
// proxy (pprof: network syscalls 44 % of its CPU, TLS record writes 20 %). Here a Write
// only queues the bytes and a flusher goroutine sends everything queued in one write(2)
// after yielding once, so the requests that became runnable together (one netpoll
// wake-up) leave in one segment. Order is kept (one queue, one writer); a failed write
// closes the connection, which the HTTP/2 client then sees on its next read or write.
type coalescingConn struct {
	net.Conn

	mu      sync.Mutex
	room    *sync.Cond // signalled when the queue was taken (writers over maxPending)
	pending []byte
	spare   []byte
	err     error // sticky: the first write error, or net.ErrClosed after Close
	kick    chan struct{}
}

func newCoalescingConn(c net.Conn) *coalescingConn {
	cc := &coalescingConn{Conn: c, kick: make(chan struct{}, 1)}
	cc.room = sync.NewCond(&cc.mu)
	go cc.flushLoop()
	return cc
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	for c.err == nil && len(c.pending) > 0 && len(c.pending)+len(p) > maxPending {
		c.room.Wait()
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	wasEmpty := len(c.pending) == 0
	c.pending = append(c.pending, p...)
	c.mu.Unlock()
	if wasEmpty {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func (c *coalescingConn) flushLoop() {
	for range c.kick {
		// Yield once: the goroutines that are runnable now (other requests woken by the
		// same netpoll) add their frames before this write goes out.
		runtime.Gosched()
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		if len(c.pending) == 0 {
			// A kick whose bytes an earlier round already sent (a writer queued them just
			// as that round took the queue). Swapping buffers here would hand the spare to
			// the queue while still keeping it as the spare: the next round would then
			// write a buffer that writers append to during the write.
			c.mu.Unlock()
			continue
		}
		out := c.pending
		c.pending = c.spare[:0]
		c.spare = nil // it backs the queue now; out becomes the spare once written
		c.room.Broadcast()
		c.mu.Unlock()
		_, err := c.Conn.Write(out)
		c.mu.Lock()
		if cap(out) <= keepBuffer {
			c.spare = out[:0]
		}
		if err != nil && c.err == nil {
			c.err = err
			c.room.Broadcast()
		}
		c.mu.Unlock()
		if err != nil {
			c.Conn.Close()
			return
		}
	}
}

// Close drops what is still queued: the HTTP/2 client closes a connection only when it
// is done with it (idle, retired, failed), and a frame lost then (a GOAWAY) changes
// nothing the peer relies on.
func (c *coalescingConn) Close() error {
	c.mu.Lock()
	if c.err == nil {
		c.err = net.ErrClosed
	}
	c.room.Broadcast()
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}: // wake the flusher so it sees err and exits
	default:
	}
	return c.Conn.Close()
}
