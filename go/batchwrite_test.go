package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// checkingWriter is the connection under a batcher: it keeps what it was given and fails the
// test if a batch changes while it is being written (a writer appending into the buffer the
// flusher is writing, the bug that once corrupted TLS records).
type checkingWriter struct {
	mu      sync.Mutex
	got     bytes.Buffer
	writes  int
	changed atomic.Bool
}

func (w *checkingWriter) Write(p []byte) (int, error) {
	before := bytes.Clone(p)
	// Hold the batch while the writers run, as a slow socket would.
	for range 3 {
		runtime.Gosched()
	}
	if !bytes.Equal(before, p) {
		w.changed.Store(true)
	}
	w.mu.Lock()
	w.got.Write(p)
	w.writes++
	w.mu.Unlock()
	return len(p), nil
}

// TestWriteBatcherKeepsEveryByteInOrder: many writers, serialised as the HTTP/2 client's
// write lock serialises them, each queueing frames of its own sizes: the connection gets
// exactly the bytes in the order they were written, in fewer writes than Writes, and no
// batch changes while it is written.
func TestWriteBatcherKeepsEveryByteInOrder(t *testing.T) {
	out := &checkingWriter{}
	b := newWriteBatcher(out, func() { t.Error("fail called without a failed write") })
	var lock sync.Mutex // the HTTP/2 client's write lock
	var want bytes.Buffer
	const writers, each = 8, 500
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				p := []byte(fmt.Sprintf("<%d:%d:%s>", g, i, bytes.Repeat([]byte{'a' + byte(g)}, (i*37+g)%3000)))
				lock.Lock()
				want.Write(p)
				if _, err := b.Write(p); err != nil {
					t.Error(err)
				}
				lock.Unlock()
				if i%7 == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, "every byte written", 10*time.Second, func() bool {
		out.mu.Lock()
		defer out.mu.Unlock()
		return out.got.Len() >= want.Len()
	})
	b.close()
	<-b.done
	out.mu.Lock()
	defer out.mu.Unlock()
	if out.changed.Load() {
		t.Fatal("a batch changed while it was being written: a writer appended into it")
	}
	if !bytes.Equal(out.got.Bytes(), want.Bytes()) {
		t.Fatalf("got %d bytes; want the %d written, in order", out.got.Len(), want.Len())
	}
	if out.writes >= writers*each {
		t.Fatalf("got %d writes for %d Writes; want them batched", out.writes, writers*each)
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

// TestWriteBatcherFailedWriteEndsTheConnection: the client's Write returned before the bytes
// left, so a failed write closes the connection (waking its reader) and every later Write
// gets that error, which failure reports for the reader to return.
func TestWriteBatcherFailedWriteEndsTheConnection(t *testing.T) {
	failed := make(chan struct{})
	b := newWriteBatcher(failingWriter{syscall.EPIPE}, func() { close(failed) })
	if _, err := b.Write([]byte("frame")); err != nil {
		t.Fatalf("got %v; want the first Write queued", err)
	}
	select {
	case <-failed:
	case <-time.After(5 * time.Second):
		t.Fatal("the failed write did not close the connection")
	}
	<-b.done
	if _, err := b.Write([]byte("next")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("got %v; want the write's EPIPE", err)
	}
	if err := b.failure(); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("failure() = %v; want EPIPE", err)
	}
}

// TestWriteBatcherCloseEndsTheFlusher: close ends the flusher and later Writes fail with
// net.ErrClosed, which failure does not report as the upstream's fault.
func TestWriteBatcherCloseEndsTheFlusher(t *testing.T) {
	b := newWriteBatcher(&checkingWriter{}, func() { t.Error("fail called on close") })
	b.close()
	select {
	case <-b.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the flusher did not return after close")
	}
	if _, err := b.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("got %v; want net.ErrClosed", err)
	}
	if err := b.failure(); err != nil {
		t.Fatalf("failure() = %v after close; want nil", err)
	}
}
