package main

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// connOrigin is a TLS HTTP/2 origin that runs one http.Server per accepted connection, so
// a test can gracefully shut down (GOAWAY) a single connection, and can hold back what the
// server writes on it (pause) while counting what it reads.
type connOrigin struct {
	t       *testing.T
	ln      net.Listener
	tlsConf *tls.Config
	caFile  string
	url     string
	handler http.Handler
	// shutdownAfter > 0 starts a graceful shutdown (GOAWAY) of a connection when its
	// shutdownAfter-th request arrives.
	shutdownAfter int64

	mu    sync.Mutex
	conns []*originConn
}

type originConn struct {
	srv      *http.Server
	gate     *gateConn
	requests atomic.Int64
}

func newConnOrigin(t *testing.T, h http.Handler, shutdownAfter int64) *connOrigin {
	t.Helper()
	// The httptest server only lends its certificate (127.0.0.1, example.com).
	donor := httptest.NewUnstartedServer(nil)
	donor.EnableHTTP2 = true
	donor.StartTLS()
	conf := &tls.Config{Certificates: donor.TLS.Certificates, NextProtos: []string{"h2"}}
	caFile := caFileOf(t, donor)
	donor.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &connOrigin{t: t, ln: ln, tlsConf: conf, caFile: caFile, url: "https://" + ln.Addr().String(),
		handler: h, shutdownAfter: shutdownAfter}
	go o.acceptLoop()
	t.Cleanup(o.close)
	return o
}

func (o *connOrigin) acceptLoop() {
	for {
		raw, err := o.ln.Accept()
		if err != nil {
			return
		}
		g := newGateConn(raw)
		oc := &originConn{gate: g}
		oc.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := oc.requests.Add(1)
			if o.shutdownAfter > 0 && n == o.shutdownAfter {
				go oc.srv.Shutdown(r.Context())
			}
			o.handler.ServeHTTP(w, r)
		})}
		o.mu.Lock()
		o.conns = append(o.conns, oc)
		o.mu.Unlock()
		go oc.srv.Serve(&oneConnListener{conn: tls.Server(g, o.tlsConf), done: make(chan struct{})})
	}
}

func (o *connOrigin) connections() []*originConn {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*originConn(nil), o.conns...)
}

func (o *connOrigin) close() {
	o.ln.Close()
	for _, c := range o.connections() {
		c.gate.resume()
		c.srv.Close()
	}
}

// oneConnListener hands out one connection, then blocks until closed.
type oneConnListener struct {
	once sync.Once
	conn net.Conn
	done chan struct{}
	shut sync.Once
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.conn })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.shut.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// gateConn pauses the server's writes (bytes to the client) on demand and counts the
// bytes the server read (from the client).
type gateConn struct {
	net.Conn
	read atomic.Int64

	mu      sync.Mutex
	cond    *sync.Cond
	paused  bool
	blocked int
}

func newGateConn(c net.Conn) *gateConn {
	g := &gateConn{Conn: c}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gateConn) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	g.read.Add(int64(n))
	return n, err
}

func (g *gateConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	for g.paused {
		g.blocked++
		g.cond.Broadcast()
		g.cond.Wait()
		g.blocked--
	}
	g.mu.Unlock()
	return g.Conn.Write(p)
}

func (g *gateConn) pause() {
	g.mu.Lock()
	g.paused = true
	g.mu.Unlock()
}

func (g *gateConn) resume() {
	g.mu.Lock()
	g.paused = false
	g.cond.Broadcast()
	g.mu.Unlock()
}

func (g *gateConn) blockedWriters() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blocked
}
