package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
)

// maxAttempts bounds re-sends of one request: an origin that refuses every stream (GOAWAY
// right after the preface) must end in a 502, not a loop. It is high because a refusal is
// harmless (the server did not process the stream) and churn is not: against an origin
// that sends GOAWAY after every 5 requests, 50 concurrent requests land on each fresh
// connection and 45 are refused, so one request can be refused many times in a row.
const maxAttempts = 100

// failure classes of ClientConn.RoundTrip errors. The http2 errors are unexported, so
// they are recognised by their fixed text (net/http/internal/http2/transport.go).
type failure int

const (
	// failOther: the request may have reached the server; never re-sent.
	failOther failure = iota
	// failNotSent: the connection was unusable before the stream was opened; nothing
	// of the request left the proxy.
	failNotSent
	// failRefused: the server refused the stream (graceful GOAWAY with a lower last
	// stream id, or REFUSED_STREAM) and guarantees it did not process it, but part of the
	// body may have been sent.
	failRefused
)

func classify(err error) failure {
	s := err.Error()
	switch s {
	case "http2: client conn not usable", "http2: client conn could not be established":
		return failNotSent
	case "http2: Transport received Server's graceful shutdown GOAWAY":
		return failRefused
	}
	if strings.HasPrefix(s, "stream error: ") && strings.Contains(s, "; REFUSED_STREAM") {
		return failRefused
	}
	return failOther
}

// send sends req on a pooled connection and re-sends it on another one when a graceful
// GOAWAY (or REFUSED_STREAM) refused it, at once: Go's Transport backs off a second before
// its second retry, which put p99 over 1 s under GOAWAY churn.
//
// The front end has already read a body up to RetryBodyLimit into buf (before a stream
// slot is taken, so a slow uploader does not hold one), and it is replayed from there; a
// larger body comes as stream and is re-sent only if the connection failed before any of
// it was read. req's own Body is ignored.
func (u *upstream) send(req *http.Request, buf []byte, stream *onceBody) (*http.Response, error) {
	out := req
	for attempt := 1; ; attempt++ {
		c, err := u.pool.acquire(req.Context())
		if err != nil {
			return nil, err
		}
		// The first attempt sends req itself (the front end's own outgoing request). A
		// re-send of a body gets its own copy: the refused stream may still hold the
		// request it was given.
		if attempt > 1 && (stream != nil || buf != nil) {
			out = req.WithContext(req.Context())
		}
		switch {
		case stream != nil:
			out.Body = stream // ContentLength stays the client's (-1 when chunked)
		case buf != nil:
			out.Body = io.NopCloser(bytes.NewReader(buf))
			out.ContentLength = int64(len(buf))
		default:
			out.Body = nil
			out.ContentLength = 0
		}
		out.GetBody = nil
		resp, err := c.cc.RoundTrip(out)
		if err == nil {
			return resp, nil
		}
		if attempt >= maxAttempts || req.Context().Err() != nil {
			return nil, err
		}
		switch classify(err) {
		case failNotSent:
			if stream != nil && stream.touched.Load() {
				return nil, err
			}
		case failRefused:
			if stream != nil {
				return nil, err
			}
		default:
			return nil, err
		}
		u.resent.Add(1)
	}
}

// readBody returns the whole body when it fits in limit, or (prefix, stream) where stream
// yields the prefix already read followed by the rest.
func readBody(body io.Reader, contentLength, limit int64) ([]byte, io.Reader, error) {
	if contentLength > limit {
		return nil, body, nil
	}
	if contentLength >= 0 {
		buf := make([]byte, contentLength)
		if _, err := io.ReadFull(body, buf); err != nil {
			return nil, nil, err
		}
		return buf, nil, nil
	}
	var b bytes.Buffer
	n, err := b.ReadFrom(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, nil, err
	}
	if n > limit {
		return nil, io.MultiReader(bytes.NewReader(b.Bytes()), body), nil
	}
	return b.Bytes(), nil, nil
}

// onceBody is a streamed (unbuffered) request body. It records whether the transport
// read from it, and its Close does nothing: the http2 client closes a request body when a
// stream fails, which would make a never-read body impossible to send on the next
// connection. onEOF (if set) runs once, when the body has been read to its end: the front
// end then starts watching for the client going away.
type onceBody struct {
	r       io.Reader
	touched atomic.Bool
	onEOF   func()
}

// Read is called by one transport goroutine at a time (the stream's body writer).
func (b *onceBody) Read(p []byte) (int, error) {
	b.touched.Store(true)
	n, err := b.r.Read(p)
	if err == io.EOF && b.onEOF != nil {
		b.onEOF()
		b.onEOF = nil
	}
	return n, err
}

func (b *onceBody) Close() error { return nil }
