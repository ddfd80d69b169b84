package main

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// stats are the origin's counters. Hot-path counters are atomics; only the per-id map takes a
// lock, and only requests that carry an id touch it.
type stats struct {
	handshakes        atomic.Int64 // TLS ClientHellos seen (dialled connections, used or not)
	accepts           atomic.Int64 // TCP connections accepted on the TLS listener
	connsWithRequests atomic.Int64 // TLS connections that carried at least one request
	requests          atomic.Int64 // requests over TLS
	goaways           atomic.Int64 // graceful shutdowns started by -goaway-every
	relayConns        atomic.Int64 // connections accepted by the relay
	relayDrops        atomic.Int64 // relay connections dropped for idleness

	mu   sync.Mutex
	byID map[string]int64 // requests received per ?id= (lost or duplicated requests show here)
}

func newStats() *stats { return &stats{byID: map[string]int64{}} }

func (s *stats) reset() {
	for _, c := range []*atomic.Int64{
		&s.handshakes, &s.accepts, &s.connsWithRequests, &s.requests, &s.goaways,
		&s.relayConns, &s.relayDrops,
	} {
		c.Store(0)
	}
	s.mu.Lock()
	s.byID = map[string]int64{}
	s.mu.Unlock()
}

func (s *stats) snapshot() map[string]any {
	s.mu.Lock()
	ids := make(map[string]int64, len(s.byID))
	for k, v := range s.byID {
		ids[k] = v
	}
	s.mu.Unlock()
	return map[string]any{
		"handshakes":          s.handshakes.Load(),
		"accepts":             s.accepts.Load(),
		"conns_with_requests": s.connsWithRequests.Load(),
		"requests":            s.requests.Load(),
		"goaways":             s.goaways.Load(),
		"relay_conns":         s.relayConns.Load(),
		"relay_drops":         s.relayDrops.Load(),
		"by_id":               ids,
	}
}

// connState is per TLS connection, reached from every request on it through the context.
type connState struct {
	requests atomic.Int64
	// onRequest, when set (goaway mode), is called with the connection's request count.
	onRequest func(n int64)
}

type connKey struct{}

// withConnStats is an http.Server.ConnContext: it gives each TLS connection its connState.
// HTTP/2 requests inherit the connection's context, so this works for h2 as for HTTP/1.1.
func withConnStats(st *stats) func(context.Context, net.Conn) context.Context {
	return func(ctx context.Context, _ net.Conn) context.Context {
		if cs, ok := ctx.Value(connKey{}).(*connState); ok && cs != nil {
			return ctx // goaway mode set it already, with its hook
		}
		return context.WithValue(ctx, connKey{}, &connState{})
	}
}

func countRequest(r *http.Request, st *stats) {
	cs, ok := r.Context().Value(connKey{}).(*connState)
	if !ok {
		return // the plain HTTP/1.1 listener: not an upstream connection
	}
	st.requests.Add(1)
	n := cs.requests.Add(1)
	if n == 1 {
		st.connsWithRequests.Add(1)
	}
	if cs.onRequest != nil {
		cs.onRequest(n)
	}
}

func countID(r *http.Request, st *stats) {
	id := r.URL.Query().Get("id")
	if id == "" {
		return
	}
	st.mu.Lock()
	st.byID[id]++
	st.mu.Unlock()
}

var okBody = []byte("ok\n")

func newHandler(st *stats) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		countRequest(r, st)
		w.Header()["Content-Type"] = []string{"text/plain"}
		w.Header()["Content-Length"] = []string{"3"}
		_, _ = w.Write(okBody)
	})
	mux.HandleFunc("GET /wait", func(w http.ResponseWriter, r *http.Request) {
		countRequest(r, st)
		countID(r, st)
		d, err := time.ParseDuration(r.URL.Query().Get("first_byte"))
		if err != nil || d < 0 {
			http.Error(w, "first_byte: want a Go duration such as 5s", http.StatusBadRequest)
			return
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
		w.Header()["Content-Type"] = []string{"text/plain"}
		_, _ = w.Write(okBody)
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		countRequest(r, st)
		countID(r, st)
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the client went away mid-body
		}
		w.Header()["Content-Type"] = []string{"application/octet-stream"}
		w.Header()["Content-Length"] = []string{strconv.Itoa(len(body))}
		_, _ = w.Write(body)
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st.snapshot())
	})
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, _ *http.Request) {
		st.reset()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// quietLog drops net/http's own error log (TLS handshake errors from the relay's drops, client
// resets): the benchmark reads counters, and logging per failed connection would cost CPU
// that is charged to nobody.
func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// countAccepts counts TCP accepts on the TLS listener.
func countAccepts(l net.Listener, st *stats) net.Listener { return &countingListener{l, st} }

type countingListener struct {
	net.Listener
	st *stats
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.st.accepts.Add(1)
	}
	return c, err
}
