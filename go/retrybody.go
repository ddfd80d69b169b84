package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
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

// lostPingText is net/http's whole error for a connection it closed because a PING went
// unanswered for -ping-timeout (closeForLostPing); nothing else produces it.
const lostPingText = "http2: client connection lost"

// pingTimeoutError is a connection closed for an unanswered PING, as the 502 tells it: a
// user reading "client connection lost" cannot tell a silent upstream from a crash, and
// the flag to look at is named here. silence is set when the watcher closed it
// (framewatch.go's checkPings), err when net/http's backstop did (hardPingTimeout).
type pingTimeoutError struct {
	timeout time.Duration
	silence *lostPing
	err     error
}

func (e *pingTimeoutError) Error() string {
	if e.silence != nil {
		return fmt.Sprintf("no PING ack within %s (-ping-timeout) and nothing else from the upstream for %s, connection closed",
			e.timeout, e.silence.sinceRead.Round(time.Millisecond))
	}
	return fmt.Sprintf("no PING ack within %s (%d x -ping-timeout, other bytes kept arriving), connection closed: %v",
		hardPingTimeout(e.timeout), hardPingFactor, e.err)
}
func (e *pingTimeoutError) Unwrap() error { return e.err }

func (u *upstream) explain(err error) error {
	if err.Error() == lostPingText {
		return &pingTimeoutError{timeout: u.cfg.PingTimeout, err: err}
	}
	return err
}

// clientBodyError is a failure to read the client's request body (a malformed chunk, a
// body shorter than its Content-Length): the proxy answers it with 400, not 502.
type clientBodyError struct{ err error }

func (e *clientBodyError) Error() string {
	return "reading the request body from the client: " + e.err.Error()
}
func (e *clientBodyError) Unwrap() error { return e.err }

// RoundTrip sends req on a pooled connection and re-sends it on another one when a
// graceful GOAWAY (or REFUSED_STREAM) refused it, at once: Go's Transport backs off a
// second before its second retry, which put p99 over 1 s under GOAWAY churn.
//
// A body up to RetryBodyLimit is read into memory first (before a stream slot is taken,
// so a slow uploader does not hold one) and replayed from there; a larger body streams
// and is re-sent only if the connection failed before any of it was read.
func (u *upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	var buf []byte
	var stream *onceBody
	if req.Body != nil && req.Body != http.NoBody {
		b, rest, err := readBody(req.Body, req.ContentLength, u.cfg.RetryBodyLimit)
		if err != nil {
			return nil, &clientBodyError{err}
		}
		if rest != nil {
			stream = &onceBody{r: rest}
		} else {
			buf = b
		}
	}
	for attempt := 1; ; attempt++ {
		c, err := u.pool.acquire(req.Context())
		if err != nil {
			return nil, err
		}
		// req is ReverseProxy's own outgoing copy and is sent unchanged when it has no
		// body; a shallow copy is made only to swap in a replayable or streamed body.
		out := req
		switch {
		case stream != nil:
			out = req.WithContext(req.Context())
			out.Body = stream // ContentLength stays the client's (-1 when chunked)
			out.GetBody = nil
		case buf != nil:
			out = req.WithContext(req.Context())
			out.Body = io.NopCloser(bytes.NewReader(buf))
			out.ContentLength = int64(len(buf))
			out.GetBody = nil
		}
		resp, err := c.cc.RoundTrip(out)
		if err == nil {
			return resp, nil
		}
		err = u.explain(err)
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
		stats.retries.Add(1)
		markRetried(req.Context())
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
// connection. ReverseProxy closes the client's body itself when the handler returns.
type onceBody struct {
	r       io.Reader
	touched atomic.Bool
}

func (b *onceBody) Read(p []byte) (int, error) {
	b.touched.Store(true)
	return b.r.Read(p)
}

func (b *onceBody) Close() error { return nil }
