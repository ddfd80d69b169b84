package main

import (
	"crypto/tls"
	"io"
	"net"
	"net/http/httptest"
	"testing"
	"time"
)

// gatedConn is the TCP side under a TLS client whose Write, once its bytes are out, runs
// gate before returning: what the peer answers can then be read before the writer's
// Write returns, as a loaded scheduler can arrange any time.
type gatedConn struct {
	net.Conn
	gate func()
}

func (g *gatedConn) Write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	if g.gate != nil {
		g.gate()
	}
	return n, err
}

// TestAPingAckReadBeforeItsWriteReturnsIsMatched: the HTTP/2 client's read loop can read
// a PING's ack before the goroutine that wrote the PING is back from Write. The watcher
// records the PING before its bytes leave, so the ack finds it: counted, and no PING left
// pending (a pending one would be judged lost -ping-timeout after the last read, closing
// a connection whose every PING was answered).
func TestAPingAckReadBeforeItsWriteReturnsIsMatched(t *testing.T) {
	frame := func(typ, flags byte, payload ...byte) []byte {
		n := len(payload)
		return append([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags, 0, 0, 0, 0}, payload...)
	}
	cert := httptest.NewTLSServer(nil)
	t.Cleanup(cert.Close)
	near, far := net.Pipe()
	t.Cleanup(func() { near.Close(); far.Close() })
	server := tls.Server(far, &tls.Config{Certificates: cert.TLS.Certificates})
	gated := &gatedConn{Conn: near}
	client := tls.Client(gated, &tls.Config{InsecureSkipVerify: true})
	go server.Handshake()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	// The far side: skip the preface, answer every PING with its ack.
	go func() {
		io.ReadFull(server, make([]byte, clientPrefaceLen))
		for {
			header := make([]byte, 9)
			if _, err := io.ReadFull(server, header); err != nil {
				return
			}
			payload := make([]byte, int(header[0])<<16|int(header[1])<<8|int(header[2]))
			if _, err := io.ReadFull(server, payload); err != nil {
				return
			}
			if header[3] == framePing && header[4]&flagAck == 0 {
				server.Write(frame(framePing, flagAck, payload...))
			}
		}
	}()
	m := &meters{}
	c := m.watch(client, time.Minute)
	go io.Copy(io.Discard, c) // the client's read loop
	if _, err := c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	gated.gate = func() {
		deadline := time.Now().Add(5 * time.Second)
		for m.pingAcks.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	if _, err := c.Write(frame(framePing, 0, 1, 2, 3, 4, 5, 6, 7, 8)); err != nil {
		t.Fatal(err)
	}
	// Write only queued the PING (batchwrite.go): the ack comes while the flusher's write
	// of it is held in the gate.
	waitFor(t, "the PING's ack", 5*time.Second, func() bool { return m.pingAcks.Load() > 0 })
	c.pingMu.Lock()
	pending := len(c.pings)
	c.pingMu.Unlock()
	if sent, acked := m.pingsSent.Load(), m.pingAcks.Load(); sent != 1 || acked != 1 || pending != 0 {
		t.Fatalf("got %d sent, %d acked, %d pending; want 1, 1, 0: the ack was read before its PING was recorded", sent, acked, pending)
	}
}
