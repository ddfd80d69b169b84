package main

// proxy.go owns the client side: net/http's Server (HTTP/1.1 only) with an
// httputil.ReverseProxy handler whose Transport is the upstream (retrybody.go, pool.go).
// Both are the standard library's on purpose: they parse, frame and forward every raw
// request exactly as a reference net/http proxy does (go/differential_test.go checks it),
// where our own front end once lost and forged request bytes. Here live the server's
// settings, the outgoing request (origin rewrite, upstream Host), the one-line 502 and the
// 400 for a client body that cannot be read.
//
// Must not: log request headers (Authorization) or the query, hijack client connections,
// or set a read/write timeout that would end a request waiting for its first byte.

import (
	"bytes"
	"context"
	"errors"
	"log"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"
)

const (
	// readHeaderTimeout bounds reading one request head. Clients are local and send a
	// head at once; it only frees a connection whose head never ends. It does not apply
	// to the wait for the response (no ReadTimeout or WriteTimeout is set: waiting for
	// the first byte for many minutes is the point) nor to idle keep-alive connections.
	readHeaderTimeout = time.Minute
	// copyBufSize is the response copy buffer, pooled: ReverseProxy otherwise allocates
	// 32 KiB per response, which the response burst of thousands of waits all at once
	// turned into RSS. The HTTP/2 flow-control window buffers upstream data anyway.
	copyBufSize = 8 << 10
)

// newServer returns the client-facing server: HTTP/1.1 only (no h2c), net/http's limits
// (MaxHeaderBytes 1 MiB, 431 above; 400 for malformed heads), no timeout on the wait.
func newServer(cfg *Config, up *upstream, logger *log.Logger) *http.Server {
	var protos http.Protocols
	protos.SetHTTP1(true)
	return &http.Server{
		Handler:           newProxy(cfg, up, logger),
		Protocols:         &protos,
		ReadHeaderTimeout: readHeaderTimeout,
		MaxHeaderBytes:    http.DefaultMaxHeaderBytes,
		ErrorLog:          log.New(&dropClientGone{logger: logger}, "", 0),
	}
}

// newProxy returns the handler: the client's method, path, query, headers and body go to
// the upstream origin, which sees its own host name as :authority. ReverseProxy removes
// hop-by-hop and client-sent forwarding headers and adds none (Rewrite), adds no Go
// User-Agent, forwards 1xx and trailers, and flushes every write of a text/event-stream or
// unknown-length response, so SSE events reach the client as they arrive.
//
// A client that goes away cancels the request's context (net/http's background read
// after the body), which resets the upstream stream; ErrorHandler then stays silent.
func newProxy(cfg *Config, up *upstream, logger *log.Logger) http.Handler {
	origin := *cfg.Upstream
	upstreamName := cfg.Upstream.String()
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = origin.Scheme
			pr.Out.URL.Host = origin.Host
			// Empty Host: the transport sends URL.Host, the upstream's own name, not the
			// loopback address the client called.
			pr.Out.Host = ""
			// net/http's Server has already answered Expect: 100-continue when the body
			// was read (upstream.RoundTrip reads it before sending); forwarded, it would
			// make the upstream send a second 100 Continue that ReverseProxy passes on.
			pr.Out.Header.Del("Expect")
		},
		// A response with trailers must go out chunked: with the upstream's
		// Content-Length the server would write a fixed-length body and drop them.
		ModifyResponse: func(res *http.Response) error {
			if len(res.Trailer) > 0 {
				res.Header.Del("Content-Length")
			}
			return nil
		},
		Transport:  newTransport(cfg, up, logger), // nvcf.go: up itself unless NVCF's 202s are followed
		BufferPool: &bufferPool{},
		ErrorLog:   log.New(&dropClientGone{logger: logger}, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			proxyAnswered(w, err)
			if r.Method == http.MethodConnect {
				// Not proxied; the status net/http's own ReverseProxy default gives.
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
				// The client went away (or half-closed, which net/http takes for the
				// same): nothing failed, so nothing is logged. A half-closed client may
				// still read this; without it the Server would send an empty 200.
				http.Error(w, "h2-ping-sidecar: request cancelled: the client closed its connection", http.StatusBadGateway)
				return
			}
			var cbe *clientBodyError
			if errors.As(err, &cbe) {
				// The client's own body is broken (bad chunk, short body): its fault, not
				// the upstream's, so a 400 as net/http gives for a bad head, and the
				// connection closes since the rest of its input cannot be framed.
				w.Header().Set("Connection", "close")
				http.Error(w, "400 Bad Request: malformed request body", http.StatusBadRequest)
				return
			}
			logger.Printf("%s %s: 502: %s", r.Method, r.URL.Path, oneLine(err.Error()))
			h := w.Header()
			h.Set("Content-Type", "text/plain; charset=utf-8")
			h.Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusBadGateway)
			w.Write([]byte("h2-ping-sidecar: upstream " + upstreamName + ": " + oneLine(err.Error()) + "\n"))
		},
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBufSize)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// dropClientGone filters log lines of net/http and ReverseProxy: a copy that ends
// because the client disconnected ("context canceled") is not an upstream error.
type dropClientGone struct{ logger *log.Logger }

func (d *dropClientGone) Write(p []byte) (int, error) {
	if !bytes.Contains(p, []byte("context canceled")) {
		d.logger.Print(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}
