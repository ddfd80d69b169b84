package main

import (
	"context"
	"encoding/pem"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newH2Origin starts a TLS origin that negotiates only h2 (ALPN) on loopback.
func newH2Origin(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	srv.TLS.NextProtos = []string{"h2"}
	t.Cleanup(srv.Close)
	return srv
}

// caFileOf writes srv's certificate as a PEM file for -ca-file.
func caFileOf(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// logBuffer collects log lines safely from many goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// inProcessProxy is the proxy handler on a loopback listener in this process, so tests can
// read the pool's state directly.
type inProcessProxy struct {
	url  string
	addr string
	up   *upstream
	srv  *http.Server
	logs *logBuffer
	// open counts client connections the server has not closed yet.
	open *atomic.Int64
}

func startProxy(t *testing.T, originURL, caFile string, args ...string) *inProcessProxy {
	t.Helper()
	return startProxyWith(t, nil, originURL, caFile, args...)
}

// startProxyWith is startProxy with edit applied to the parsed Config before anything
// runs (e.g. an egress proxy, which is not a flag).
func startProxyWith(t *testing.T, edit func(*Config), originURL, caFile string, args ...string) *inProcessProxy {
	t.Helper()
	full := append([]string{"-upstream", originURL, "-ca-file", caFile}, args...)
	cfg, err := parseConfig(full, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("parseConfig(%q): got %v; want nil", full, err)
	}
	if edit != nil {
		edit(cfg)
	}
	logs := &logBuffer{}
	logger := log.New(logs, "", 0)
	up := newUpstream(cfg)
	up.pool = newPool(up.newClientConn, cfg.MaxConnAge)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(cfg, up, logger)
	open := &atomic.Int64{}
	srv.ConnState = countOpen(open)
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
		up.pool.close()
		up.closeNVCF()
	})
	return &inProcessProxy{url: "http://" + ln.Addr().String(), addr: ln.Addr().String(), up: up, srv: srv, logs: logs, open: open}
}

// countOpen is a ConnState hook that keeps open at the number of connections not closed.
func countOpen(open *atomic.Int64) func(net.Conn, http.ConnState) {
	return func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
}

// waitFor polls cond until it holds or the deadline passes; failures name what.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: got timeout after %s; want it to happen", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
