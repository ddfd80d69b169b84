package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// idleRelay is Global Accelerator scaled down: a TCP relay that drops any connection that
// carried no bytes either way for idle.
type idleRelay struct {
	ln    net.Listener
	drops atomic.Int64
}

func startIdleRelay(t *testing.T, target string, idle time.Duration) *idleRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &idleRelay{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.relay(c, target, idle)
		}
	}()
	return r
}

func (r *idleRelay) relay(client net.Conn, target string, idle time.Duration) {
	server, err := net.Dial("tcp", target)
	if err != nil {
		client.Close()
		return
	}
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 16<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				dst.Write(buf[:n])
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	tick := time.NewTicker(idle / 20)
	defer tick.Stop()
	defer client.Close()
	defer server.Close()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			if time.Since(time.Unix(0, last.Load())) > idle {
				r.drops.Add(1)
				return
			}
		}
	}
}

// pingCountingFront terminates TLS (ALPN h2), forwards the plaintext HTTP/2 to an h2c
// origin and parses the frame headers the client sends, counting PINGs (not ACKs).
// With holdPings set, each PING reaches the origin that much later: an upstream that
// answers PINGs late.
type pingCountingFront struct {
	ln        net.Listener
	caFile    string
	pings     atomic.Int64
	holdPings time.Duration
	held      atomic.Int64 // PINGs held back and not yet forwarded
	dropPings atomic.Bool  // swallow PINGs: no ack ever comes
}

func startPingCountingFront(t *testing.T, origin string) *pingCountingFront {
	t.Helper()
	donor := httptest.NewUnstartedServer(nil)
	donor.EnableHTTP2 = true
	donor.StartTLS()
	conf := &tls.Config{Certificates: donor.TLS.Certificates, NextProtos: []string{"h2"}}
	f := &pingCountingFront{caFile: caFileOf(t, donor)}
	donor.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	f.ln = ln
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.forward(c, origin)
		}
	}()
	return f
}

func (f *pingCountingFront) forward(client net.Conn, origin string) {
	defer client.Close()
	server, err := net.Dial("tcp", origin)
	if err != nil {
		return
	}
	defer server.Close()
	go func() { io.Copy(client, server); client.Close() }()
	br := bufio.NewReader(client)
	preface := make([]byte, 24) // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	if _, err := io.ReadFull(br, preface); err != nil {
		return
	}
	server.Write(preface)
	var wmu sync.Mutex // whole frames only: a held-back PING is written between frames
	write := func(frame []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		_, err := server.Write(frame)
		return err
	}
	hdr := make([]byte, 9)
	for {
		if _, err := io.ReadFull(br, hdr); err != nil {
			return
		}
		length := int(binary.BigEndian.Uint32(append([]byte{0}, hdr[:3]...)))
		const typePing, flagAck = 0x6, 0x1
		payload := make([]byte, length)
		if _, err := io.ReadFull(br, payload); err != nil {
			return
		}
		frame := append(append([]byte(nil), hdr...), payload...)
		if hdr[3] == typePing && hdr[4]&flagAck == 0 {
			f.pings.Add(1)
			if f.dropPings.Load() {
				continue
			}
			if f.holdPings > 0 {
				f.held.Add(1)
				time.AfterFunc(f.holdPings, func() { write(frame); f.held.Add(-1) })
				continue
			}
		}
		if err := write(frame); err != nil {
			return
		}
	}
}

// TestPingsKeepARequestAliveThroughAnIdleDroppingPath is the sidecar's reason to exist: a
// path that drops connections silent for L kills a request whose first byte comes after
// 3L unless PINGs cross it, and the sidecar sends them.
func TestPingsKeepARequestAliveThroughAnIdleDroppingPath(t *testing.T) {
	const idle = time.Second
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wait, _ := time.ParseDuration(r.URL.Query().Get("first_byte"))
		select {
		case <-time.After(wait):
			io.WriteString(w, "worth the wait")
		case <-r.Context().Done():
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h2c.Serve(ln)
	t.Cleanup(func() { h2c.Close() })
	front := startPingCountingFront(t, ln.Addr().String())
	relay := startIdleRelay(t, front.ln.Addr().String(), idle)
	upstreamURL := "https://127.0.0.1:" + strconv.Itoa(relay.ln.Addr().(*net.TCPAddr).Port)
	path := "/slow?first_byte=" + (3 * idle).String()

	var wg sync.WaitGroup
	var directErr error
	wg.Go(func() {
		// A plain Go HTTP/2 client: no ReadIdleTimeout, so no PINGs.
		pem, _ := os.ReadFile(front.caFile)
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(pem)
		client := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: roots}}}
		resp, err := client.Get(upstreamURL + path)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.ProtoMajor != 2 {
				t.Errorf("direct client protocol: got %s; want HTTP/2", resp.Proto)
			}
		}
		directErr = err
	})

	p := runSidecar(t, "-upstream", upstreamURL, "-ca-file", front.caFile, "-ping-interval", (idle / 4).String(), "-ping-timeout", "5s")
	code, body := get(t, p.url()+path)
	wg.Wait()
	if directErr == nil {
		t.Fatalf("direct request without PINGs: got success; want the idle path to drop it")
	}
	if code != 200 || body != "worth the wait" {
		t.Fatalf("through the sidecar: got %d %q; want 200 \"worth the wait\"", code, body)
	}
	if n := front.pings.Load(); n < 3 {
		t.Fatalf("PINGs seen by the origin side: got %d; want at least 3", n)
	}
	if n := relay.drops.Load(); n != 1 {
		t.Fatalf("connections dropped by the relay: got %d; want 1 (the direct one)", n)
	}
	t.Logf("direct: %v; sidecar: %d PINGs", directErr, front.pings.Load())
}

// TestALatePingAckIsNotALostConnectionWhileTheUpstreamSends: PINGs answered after twice
// -ping-timeout do not end a stream whose upstream keeps sending (it is alive and only
// slow to answer), while once the upstream answers nothing at all (PINGs swallowed, no
// response) a request still gets its 502 at -ping-timeout.
func TestALatePingAckIsNotALostConnectionWhileTheUpstreamSends(t *testing.T) {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/silent" {
			select {
			case <-time.After(3 * time.Second):
			case <-r.Context().Done():
			}
			return
		}
		for range 12 { // one line every 150 ms, gaps longer than -ping-interval
			io.WriteString(w, "tick\n")
			w.(http.Flusher).Flush()
			time.Sleep(150 * time.Millisecond)
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h2c.Serve(ln)
	t.Cleanup(func() { h2c.Close() })
	front := startPingCountingFront(t, ln.Addr().String())
	front.holdPings = 800 * time.Millisecond
	upstreamURL := "https://" + front.ln.Addr().String()
	p := runSidecar(t, "-upstream", upstreamURL, "-ca-file", front.caFile, "-ping-interval", "100ms", "-ping-timeout", "400ms")

	code, body := get(t, p.url()+"/ticks")
	if want := strings.Repeat("tick\n", 12); code != 200 || body != want {
		t.Fatalf("streaming through late PING acks: got %d %q; want 200 and 12 ticks", code, body)
	}
	if n := front.pings.Load(); n < 2 {
		t.Fatalf("PINGs sent during the stream: got %d; want at least 2 (else nothing was late)", n)
	}
	front.dropPings.Store(true)
	// The late acks still on their way are signs of life; the silence starts after them.
	for deadline := time.Now().Add(5 * time.Second); front.held.Load() > 0; {
		if time.Now().After(deadline) {
			t.Fatal("held-back PINGs not forwarded within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	code, body = get(t, p.url()+"/silent")
	took := time.Since(start)
	if want := "no PING ack within 400ms (-ping-timeout) and nothing else from the upstream"; code != 502 || !strings.Contains(body, want) {
		t.Fatalf("silent upstream: got %d %q; want 502 containing %q", code, body, want)
	}
	if took > 1500*time.Millisecond {
		t.Fatalf("silent upstream: 502 after %v; want it by -ping-interval + -ping-timeout (500ms) and a margin", took)
	}
}
