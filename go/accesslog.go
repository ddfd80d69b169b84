package main

// accesslog.go owns -access-log: one JSON line per finished request (SPEC, "Access log"):
//
//	{"time":"2026-12-01T20:00:00.123Z","method":"POST","path":"/v1/chat/completions",
//	 "status":200,"ttfb_s":0.412000,"duration_s":3.100000,"bytes_in":812,"bytes_out":2048,
//	 "retried":false,"error":null,"nvcf_reqid":null,"nvcf_polls":0}
//
// time is when the request was received (RFC 3339, UTC, ms); status the status the client
// got (0 when it went away before any); ttfb_s the wait for the upstream's response head
// (null when none came: a 502, or the client left first); bytes are body bytes; error the
// 502's upstream failure kind (dial, tls, alpn, ping_timeout, reset, other), else null;
// nvcf_reqid the NVCF request id of a followed 202 (null for none) and nvcf_polls its
// status polls (nvcf.go).
//
// The request path is cheap: the line is formatted into a stack buffer and appended to an
// in-memory buffer under a mutex held for a copy; a goroutine writes the buffer out every
// second (at once past 64 KiB) and at exit after the drain. What a crash (SIGKILL, OOM
// kill) loses is the lines of at most the last second. A disk that cannot keep up never
// blocks a request: past 4 MiB waiting, lines are dropped and the drop is logged.
//
// Must not: write a header value, the query string or URL userinfo (only the method and
// the path are taken from the request), or block a request's end on the disk.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"
)

const (
	accessFlushEvery    = time.Second
	accessFlushBytes    = 64 << 10
	accessMaxBuffered   = 4 << 20
	accessMaxPathLength = 2048 // a longer path is cut (a line stays well under a page)
)

// accessFields is the part of a request's line collected while it is served; it lives in
// the request's countingWriter (no allocation of its own).
type accessFields struct {
	bytesOut int64
	retried  bool
	body     countingBody
	slot     *connSlot
	// nvcfReqID and nvcfPolls are a followed NVCF 202's id and status polls (nvcf.go).
	nvcfReqID string
	nvcfPolls int
}

// proxyAnswer is the error the proxy's ErrorHandler answered instead of an upstream
// response (nil: the upstream's response, or none yet).
type proxyAnswer struct{ err error }

// proxyAnswered tells the request's countingWriter, if w is one, that the status about
// to be written is the proxy's own answer to err: no upstream head came (TTFB) and a 502
// gets err's kind in the access log.
func proxyAnswered(w http.ResponseWriter, err error) {
	if cw, ok := w.(*countingWriter); ok {
		cw.answered.err = err
	}
}

// connSlot is a client connection's request being served, so that the upstream's
// RoundTrip (which sees only the outgoing request, whose context is the incoming one's) can
// mark a re-send on its access line. One per connection, in the connection's context
// (withConnSlot, the server's ConnContext), not one per request: net/http serves the
// requests of an HTTP/1.1 connection one after the other, and the handler, its RoundTrip
// and its deferred end run on one goroutine, so w needs no lock.
type connSlot struct{ w *countingWriter }

type connSlotKey struct{}

// withConnSlot is http.Server.ConnContext with an access log.
func withConnSlot(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, connSlotKey{}, &connSlot{})
}

func slotOf(ctx context.Context) *connSlot {
	s, _ := ctx.Value(connSlotKey{}).(*connSlot)
	return s
}

// markRetried records on the request's access line that it was re-sent (retrybody.go).
func markRetried(ctx context.Context) {
	if s := slotOf(ctx); s != nil && s.w != nil {
		s.w.access.retried = true
	}
}

// countingBody counts the request body bytes read from the client. Atomic: a streamed
// body is read by the HTTP/2 client's own goroutine, which may still run when the
// handler returns.
type countingBody struct {
	rc io.ReadCloser
	n  atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error { return b.rc.Close() }

// track makes w its connection's request being served and counts r's body; only with an
// access log. untrack, deferred, ends it.
func (w *countingWriter) track(r *http.Request) {
	if s := slotOf(r.Context()); s != nil {
		s.w = w
		w.access.slot = s
	}
	if r.Body != nil && r.Body != http.NoBody {
		w.access.body.rc = r.Body
		r.Body = &w.access.body
	}
}

func (w *countingWriter) untrack() {
	if s := w.access.slot; s != nil && s.w == w {
		s.w = nil
	}
}

// upstreamFailureKind is the kind of a RoundTrip error that became a 502, in the words of
// h2ping_upstream_errors_total (which counts connections, this one request).
func upstreamFailureKind(err error) errKind {
	var de *dialError
	if errors.As(err, &de) {
		return de.kind
	}
	var pe *pingTimeoutError
	if errors.As(err, &pe) {
		return kindPingTimeout
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return kindReset
	}
	// The HTTP/2 client's errors are unexported; their texts are fixed (see classify).
	s := err.Error()
	if strings.HasPrefix(s, "stream error: ") || strings.Contains(s, "server sent GOAWAY and closed the connection") ||
		strings.Contains(s, "connection reset by peer") {
		return kindReset
	}
	return kindOther
}

// accessLog buffers lines and writes them to out from one goroutine.
type accessLog struct {
	out  *rotatingFile
	logf func(format string, args ...any)

	mu      sync.Mutex
	buf     []byte // lines waiting, appended under mu
	dropped int    // lines not buffered since the last write (buffer full)

	spare   []byte // the flusher's buffer, swapped with buf under mu
	failing bool   // the flusher's: a write failure was logged and not yet recovered

	kick, quit, done chan struct{}
}

func startAccessLog(out *rotatingFile, logf func(string, ...any)) *accessLog {
	a := &accessLog{out: out, logf: logf, kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go a.loop()
	return a
}

// log formats r's line and queues it. Only the method and the escaped path are read from
// r: never a header, never the query.
func (a *accessLog) log(r *http.Request, w *countingWriter, took time.Duration, gone bool) {
	var stack [512]byte
	line := appendAccessLine(stack[:0], r, w, took, gone)
	a.mu.Lock()
	if len(a.buf)+len(line) > accessMaxBuffered {
		a.dropped++
		a.mu.Unlock()
		return
	}
	a.buf = append(a.buf, line...)
	full := len(a.buf) >= accessFlushBytes
	a.mu.Unlock()
	if full {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

func appendAccessLine(b []byte, r *http.Request, w *countingWriter, took time.Duration, gone bool) []byte {
	status := w.code
	canceled := w.answered.err != nil && errors.Is(w.answered.err, context.Canceled) && r.Context().Err() != nil
	switch {
	case gone && (status == 0 || canceled):
		status = 0
	case status == 0:
		status = http.StatusOK // net/http sends 200 for a handler that wrote nothing
	}
	b = append(b, `{"time":"`...)
	b = appendTimeMilli(b, w.entry.start)
	b = append(b, `","method":`...)
	b = appendJSONString(b, r.Method)
	b = append(b, `,"path":`...)
	path := r.URL.EscapedPath()
	if len(path) > accessMaxPathLength {
		path = path[:accessMaxPathLength] + "..."
	}
	b = appendJSONString(b, path)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"ttfb_s":`...)
	if w.ttfb > 0 {
		b = appendSeconds(b, w.ttfb)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"duration_s":`...)
	b = appendSeconds(b, took)
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendInt(b, w.access.body.n.Load(), 10)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendInt(b, w.access.bytesOut, 10)
	b = append(b, `,"retried":`...)
	b = strconv.AppendBool(b, w.access.retried)
	b = append(b, `,"error":`...)
	if status == http.StatusBadGateway && w.answered.err != nil && !canceled {
		b = append(b, '"')
		b = append(b, kindNames[upstreamFailureKind(w.answered.err)]...)
		b = append(b, '"')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"nvcf_reqid":`...)
	if w.access.nvcfReqID != "" {
		b = appendJSONString(b, w.access.nvcfReqID)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"nvcf_polls":`...)
	b = strconv.AppendInt(b, int64(w.access.nvcfPolls), 10)
	return append(b, "}\n"...)
}

// appendTimeMilli appends t as time.Format(rfc3339Milli) in UTC would, for years 0-9999,
// in a tenth of its time: the layout is not parsed again for every line.
func appendTimeMilli(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	hour, minute, sec := t.Clock()
	b = appendDigits(b, year, 4)
	b = append(b, '-')
	b = appendDigits(b, int(month), 2)
	b = append(b, '-')
	b = appendDigits(b, day, 2)
	b = append(b, 'T')
	b = appendDigits(b, hour, 2)
	b = append(b, ':')
	b = appendDigits(b, minute, 2)
	b = append(b, ':')
	b = appendDigits(b, sec, 2)
	b = append(b, '.')
	b = appendDigits(b, t.Nanosecond()/1e6, 3)
	return append(b, 'Z')
}

// appendSeconds appends d >= 0 in seconds with 6 decimals (microseconds), as
// strconv.AppendFloat(b, d.Seconds(), 'f', 6, 64) would (but for exact half microseconds,
// which round up), with integers only.
func appendSeconds(b []byte, d time.Duration) []byte {
	us := int64(max(d, 0)+500) / 1000
	b = strconv.AppendInt(b, us/1e6, 10)
	b = append(b, '.')
	return appendDigits(b, int(us%1e6), 6)
}

// appendDigits appends v >= 0 zero-padded to width (at most 9) digits.
func appendDigits(b []byte, v, width int) []byte {
	var d [9]byte
	for i := width - 1; i >= 0; i-- {
		d[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, d[:width]...)
}

// appendJSONString appends s as a JSON string: quotes, backslashes and control bytes
// escaped, invalid UTF-8 replaced by U+FFFD, so every line parses.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

func (a *accessLog) loop() {
	defer close(a.done)
	t := time.NewTicker(accessFlushEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-a.kick:
		case <-a.quit:
			a.flush()
			return
		}
		a.flush()
	}
}

// flush writes the lines waiting. Only the loop goroutine calls it, so spare is its own.
func (a *accessLog) flush() {
	a.mu.Lock()
	a.buf, a.spare = a.spare[:0], a.buf
	dropped := a.dropped
	a.dropped = 0
	a.mu.Unlock()
	if dropped > 0 {
		a.logf("access log: %d lines dropped: the disk does not keep up", dropped)
	}
	if len(a.spare) == 0 {
		return
	}
	_, err := a.out.Write(a.spare)
	switch {
	case err != nil && !a.failing:
		a.failing = true
		a.logf("access log not written: %v; its lines are lost until a write succeeds", err)
	case err == nil && a.failing:
		a.failing = false
		a.logf("access log written again")
	}
}

// close writes what is waiting (after the drain: every request has its line) and closes
// the file. Call once.
func (a *accessLog) close() {
	close(a.quit)
	<-a.done
	a.out.Close()
}
