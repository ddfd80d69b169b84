package main

// batchwrite.go owns batching the HTTP/2 client's writes to one upstream connection.
//
// Why it exists (issue 38, bench/cpu_compare.py, bench/README.md): net/http's HTTP/2 client
// flushes once per request, from a goroutine it starts for that request, so each request
// paid one TLS record, one write(2) and the growth of a fresh goroutine's stack to the depth
// of crypto/tls and the socket write. At 128 connections that was a quarter of the proxy's
// CPU (perf: TLS record writes and write(2) 15 %, stack growth 7 %, and the GC scanning
// those stacks). Here the client's Write only queues its bytes; one flusher goroutine per
// connection, whose stack stays grown, writes everything queued into the TLS connection at
// once, as Go's own HTTP/2 server does (its frames go to a buffered writer above TLS,
// flushed when its write queue is empty).
//
// Must not: reorder bytes (one queue, one flusher), or write a buffer that writers may still
// append to: the bytes being written are a buffer no writer can reach until the write
// returns (an earlier coalescer broke that rule once and corrupted TLS records;
// TestWriteBatcherKeepsEveryByteInOrder holds it, under -race too).

import (
	"io"
	"net"
	"runtime"
	"sync"
)

const (
	// maxBatched bounds the bytes queued for the flusher; a writer beyond it waits. HTTP/2
	// flow control already bounds request bodies in flight, so this is a safety net.
	maxBatched = 1 << 20
	// keepBatchBuffer is the largest buffer kept for reuse: one a large request body grew
	// is left to the GC rather than held by an idle connection.
	keepBatchBuffer = 64 << 10
)

// writeBatcher queues writes to out and writes them from its own goroutine.
type writeBatcher struct {
	out io.Writer
	// fail closes the connection under out after a failed write, so the HTTP/2 client's
	// read loop wakes and ends the connection: its own Write already returned nil.
	fail func()

	mu      sync.Mutex
	room    sync.Cond // broadcast when the queue was taken or the batcher failed
	pending []byte    // queued bytes; only Write appends to it
	spare   []byte    // an empty buffer for the next queue, never the one being written
	err     error     // sticky: the first write error, or net.ErrClosed after close
	kick    chan struct{}
	done    chan struct{} // closed when the flusher has returned
}

func newWriteBatcher(out io.Writer, fail func()) *writeBatcher {
	b := &writeBatcher{out: out, fail: fail, kick: make(chan struct{}, 1), done: make(chan struct{})}
	b.room.L = &b.mu
	go b.flushLoop()
	return b
}

// Write queues p (copied) and returns. The error is the batcher's sticky one: the bytes of
// a Write that returned nil are lost only with the connection itself.
func (b *writeBatcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	for b.err == nil && len(b.pending) > 0 && len(b.pending)+len(p) > maxBatched {
		b.room.Wait()
	}
	if b.err != nil {
		err := b.err
		b.mu.Unlock()
		return 0, err
	}
	wasEmpty := len(b.pending) == 0
	b.pending = append(b.pending, p...)
	b.mu.Unlock()
	if wasEmpty {
		b.wake()
	}
	return len(p), nil
}

func (b *writeBatcher) wake() {
	select {
	case b.kick <- struct{}{}:
	default: // a wake-up is already due; it will see these bytes
	}
}

func (b *writeBatcher) flushLoop() {
	defer close(b.done)
	for range b.kick {
		// Yield once: requests made runnable by the same network poll queue their frames
		// before this write goes out. This is what batches with one P (tuning.go).
		runtime.Gosched()
		b.mu.Lock()
		if b.err != nil {
			b.mu.Unlock()
			return
		}
		if len(b.pending) == 0 {
			// An earlier round took these bytes already. Swapping here would make the
			// spare the queue while it is still the spare.
			b.mu.Unlock()
			continue
		}
		batch := b.pending
		b.pending, b.spare = b.spare[:0], nil
		b.room.Broadcast()
		b.mu.Unlock()

		_, err := b.out.Write(batch)

		b.mu.Lock()
		if cap(batch) <= keepBatchBuffer {
			b.spare = batch[:0]
		}
		if err != nil && b.err == nil {
			b.err = err
			b.room.Broadcast()
		}
		b.mu.Unlock()
		if err != nil {
			b.fail()
			return
		}
	}
}

// failure is the write error that ended the connection, if a write failed.
func (b *writeBatcher) failure() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == net.ErrClosed {
		return nil
	}
	return b.err
}

// close drops what is still queued and ends the flusher. The HTTP/2 client closes a
// connection only when it is done with it (idle, retired, failed, drained): a frame lost
// then (its GOAWAY) changes nothing the peer relies on.
func (b *writeBatcher) close() {
	b.mu.Lock()
	if b.err == nil {
		b.err = net.ErrClosed
	}
	b.room.Broadcast()
	b.mu.Unlock()
	b.wake()
}
