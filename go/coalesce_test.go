package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

func TestCoalescingConnKeepsOrderAndReportsFailures(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var want bytes.Buffer
	for i := range 5000 {
		fmt.Fprintf(&want, "frame %d;", i)
	}
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b := make([]byte, want.Len())
		n, _ := io.ReadFull(c, b)
		got <- b[:n]
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := newCoalescingConn(raw)
	for i := range 5000 {
		p := []byte(fmt.Sprintf("frame %d;", i))
		if n, err := c.Write(p); n != len(p) || err != nil {
			t.Fatalf("write %d: got %d, %v; want %d, nil", i, n, err, len(p))
		}
		p[0] = 'X' // the caller may reuse its buffer at once (crypto/tls does)
	}
	// Everything queued reaches the peer without a further write or a Close.
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("peer read %d bytes; want the %d written, in order", len(b), want.Len())
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: got %v; want net.ErrClosed", err)
	}
}

func TestCoalescingConnWriteErrorIsSticky(t *testing.T) {
	a, b := net.Pipe()
	c := newCoalescingConn(a)
	b.Close() // every write to a now fails
	c.Write([]byte("lost"))
	waitFor(t, "the failed flush to be recorded", 5*time.Second, func() bool {
		_, err := c.Write([]byte("x"))
		return err != nil
	})
	if _, err := c.Write([]byte("y")); err == nil {
		t.Fatalf("write after a failed flush: got %v; want the flush's error", err)
	}
	c.Close()
}

// gatedConn's Write reports each call on entered, then copies p only once release allows,
// so a test can act while a flush is in progress.
type gatedConn struct {
	net.Conn
	entered chan struct{}
	release chan struct{}
	written chan []byte
}

func (g *gatedConn) Write(p []byte) (int, error) {
	g.entered <- struct{}{}
	<-g.release
	g.written <- append([]byte(nil), p...)
	return len(p), nil
}

// A kick that finds the queue empty (its bytes left with an earlier round) must not make the
// queue and the spare one buffer: writers would then append to the bytes being written.
func TestCoalescingConnEmptyRoundKeepsTheBufferBeingWrittenApart(t *testing.T) {
	a, _ := net.Pipe()
	g := &gatedConn{Conn: a, entered: make(chan struct{}), release: make(chan struct{}),
		written: make(chan []byte, 8)}
	c := newCoalescingConn(g)
	defer c.Close()
	flush := func(p string) {
		t.Helper()
		c.Write([]byte(p))
		<-g.entered
		g.release <- struct{}{}
		if got := string(<-g.written); got != p {
			t.Fatalf("flushed %q; want %q", got, p)
		}
	}
	flush("1") // the first buffer becomes the spare
	flush("2") // the second one too, and the first backs the queue
	// An empty round, completed before anything else: the loop takes one kick at a time,
	// so the third send returns only after the first kick's round ended.
	for range 3 {
		c.kick <- struct{}{}
	}
	c.Write([]byte("3"))
	<-g.entered          // the flusher is writing "3"...
	c.Write([]byte("4")) // ...while this is queued
	g.release <- struct{}{}
	if got := string(<-g.written); got != "3" {
		t.Fatalf("flushed %q; want \"3\" (a later write changed the buffer being written)", got)
	}
	<-g.entered
	g.release <- struct{}{}
	if got := string(<-g.written); got != "4" {
		t.Fatalf("flushed %q; want \"4\"", got)
	}
}
