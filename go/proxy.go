package main

import (
	"bytes"
	"context"
	"errors"
	"log"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
)

// copyBufSize is the response copy buffer. Small on purpose: thousands of requests may be
// in flight, and the HTTP/2 flow-control window already buffers upstream data.
const copyBufSize = 8 << 10

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, copyBufSize)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// newProxy returns the client-facing handler: the client's method, path, query, headers
// and body go to the upstream origin, which sees its own host name as :authority.
//
// Streaming: httputil.ReverseProxy flushes every write for text/event-stream and for
// responses of unknown length (FlushInterval 0), so SSE events reach the client as they
// arrive while fixed-length responses are written without a flush per chunk.
func newProxy(cfg *Config, up *upstream, logger *log.Logger) http.Handler {
	origin := *cfg.Upstream
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = origin.Scheme
			pr.Out.URL.Host = origin.Host
			// Empty Host: the client uses URL.Host, the upstream's own name, not the
			// loopback address the client called.
			pr.Out.Host = ""
		},
		Transport:    up,
		BufferPool:   &bufferPool{},
		ErrorLog:     log.New(&dropClientGone{logger: logger}, "", 0),
		ErrorHandler: errorHandler(cfg, logger),
	}
}

// errorHandler answers an upstream failure with 502 and one line naming the error. A
// client that went away is not a failure: nothing is logged and nobody reads the answer.
// Only method and path are logged: headers (Authorization) and the query never are.
func errorHandler(cfg *Config, logger *log.Logger) func(http.ResponseWriter, *http.Request, error) {
	upstreamName := cfg.Upstream.String()
	return func(w http.ResponseWriter, r *http.Request, err error) {
		if r.Context().Err() != nil && errors.Is(err, context.Canceled) {
			return
		}
		msg := "h2-ping-sidecar: upstream " + upstreamName + ": " + oneLine(err.Error())
		logger.Printf("%s %s: 502: %s", r.Method, r.URL.Path, oneLine(err.Error()))
		h := w.Header()
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte(msg + "\n"))
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// dropClientGone filters ReverseProxy's own log lines: a body copy that ends because the
// client disconnected ("context canceled") is not an upstream error.
type dropClientGone struct{ logger *log.Logger }

func (d *dropClientGone) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("context canceled")) {
		return len(p), nil
	}
	d.logger.Print(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}
