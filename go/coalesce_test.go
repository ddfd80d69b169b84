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
