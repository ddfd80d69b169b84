package main

// frontend.go owns the client side: the accept loop, one goroutine per client connection,
// reading requests, noticing a client that goes away while its request waits, and the
// drain. It replaces net/http's Server for one reason, memory while requests wait: with
// net/http each waiting request held ~40 KiB (2,000 waits of 5 s peaked at ~81 MiB RSS,
// target < 80), of which 10 KiB were the connection's bufio buffers (4 KiB reader, 4 KiB
// writer, 2 KiB response writer, allocated at request start) and 8 KiB the stack of
// conn.serve parked 4 KB deep. Here a waiting request holds no buffer: the reader comes from
// a pool for parsing and the body and goes back before the upstream wait, the writer is
// taken only when the response is written (response.go), and the connection goroutine parks
// shallower: ~20 KiB per waiting request, peak ~47 MiB for the 2,000 (figures in
// bench/results/proxy-tuning.md). Request forwarding is proxy.go, response writing
// response.go.
//
// Must not: log request headers (Authorization), or hand a pooled reader back while anyone
// (the HTTP/2 transport reading a streamed body) may still read from it.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// maxHeaderBytes is net/http's default MaxHeaderBytes (1 MiB); headerSlack is its
	// allowance for the bufio read-ahead past the head. A larger head gets 431.
	maxHeaderBytes = 1 << 20
	headerSlack    = 4096
	// readerSize is the pooled request reader, net/http's size.
	readerSize = 4096
	// newConnGrace is how long a drain lets a connection that has not sent its first
	// request yet do so (net/http's Shutdown treats such connections the same way).
	newConnGrace = 5 * time.Second
	// lingerTime and lingerBytes bound the reading of unread input after an error
	// response on a connection we close: closing with unread data sends a RST, which can
	// destroy the response before the client reads it.
	lingerTime  = 500 * time.Millisecond
	lingerBytes = 256 << 10
)

// aLongTimeAgo is a read deadline in the past: it wakes a blocked Read at once.
var aLongTimeAgo = time.Unix(1, 0)

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readerSize) }}

// connState is where a client connection is; the drain acts on it under server.mu.
type connState uint8

const (
	// stateNew: accepted, no request started yet.
	stateNew connState = iota
	// stateActive: a request is being read, forwarded or answered.
	stateActive
	// stateIdle: between requests of a keep-alive connection, waiting for the next one.
	stateIdle
	// stateClosed: the drain closed it; the goroutine must not start another request.
	stateClosed
)

// server is the client-facing HTTP/1.1 server.
type server struct {
	cfg    *Config
	up     *upstream
	logger *log.Logger
	// upstreamName is the upstream as logged and named in 502 bodies (no userinfo).
	upstreamName string

	// draining is also read without mu on the request path (keep-alive decisions).
	draining atomic.Bool

	mu    sync.Mutex
	ln    net.Listener
	conns map[*clientConn]struct{}
	// wg counts the accept loop and the connection goroutines; shutdown waits for it.
	wg sync.WaitGroup
}

func newServer(cfg *Config, up *upstream, logger *log.Logger) *server {
	return &server{cfg: cfg, up: up, logger: logger, upstreamName: cfg.Upstream.String(),
		conns: map[*clientConn]struct{}{}}
}

// serve accepts connections on ln until the drain closes it (http.ErrServerClosed) or
// Accept fails for good. Running out of file descriptors is not for good: like net/http,
// it waits (5 ms doubling to 1 s) and tries again.
func (s *server) serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		ln.Close()
		return http.ErrServerClosed
	}
	s.ln = ln
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	var backoff time.Duration
	for {
		rwc, err := ln.Accept()
		if err != nil {
			if s.draining.Load() {
				return http.ErrServerClosed
			}
			if retryableAccept(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logger.Printf("accept: %v; retrying in %v", err, backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := &clientConn{s: s, rwc: rwc, accepted: time.Now()}
		s.track(c)
		go c.serve()
	}
}

func retryableAccept(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// track registers a new connection. One accepted just before the drain closed the
// listener is served like any new connection during a drain (see drainLocked).
func (s *server) track(c *clientConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wg.Add(1) // the accept loop's own count keeps wg above zero here, so Add may follow Wait
	s.conns[c] = struct{}{}
	if s.draining.Load() {
		c.drainLocked(time.Now())
	}
}

func (s *server) untrack(c *clientConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// setState moves c to st unless the drain closed it, or st is idle and a drain is on (a
// keep-alive connection is not kept through a drain). False: close the connection.
func (s *server) setState(c *clientConn, st connState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.state == stateClosed || (st == stateIdle && s.draining.Load()) {
		return false
	}
	if c.graceSet {
		// The drain's deadline was for the first byte only; the request it started may
		// take as long as it takes.
		c.rwc.SetReadDeadline(time.Time{})
		c.graceSet = false
	}
	c.state = st
	return true
}

// shutdown stops accepting, closes idle connections, gives new ones newConnGrace to start
// a request, and waits until every connection is done or ctx ends (then it returns ctx's
// error and the caller decides: close). Requests in flight finish, answered with
// Connection: close; the upstream pool is the caller's to close afterwards.
func (s *server) shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining.Store(true)
	if s.ln != nil {
		s.ln.Close()
	}
	now := time.Now()
	for c := range s.conns {
		c.drainLocked(now)
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close closes the listener and every connection at once (a drain cut short). A request
// that waits sees its watcher's read fail and its context cancelled.
func (s *server) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining.Store(true)
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		c.state = stateClosed
		c.rwc.Close()
	}
}

// clientConn is one client connection. Its goroutine (serve) owns every field but the
// watcher's, which are handed over through wmu and wwg.
type clientConn struct {
	s        *server
	rwc      net.Conn
	accepted time.Time

	// state and graceSet are guarded by s.mu.
	state    connState
	graceSet bool

	// br is the pooled request reader: non-nil while a request is parsed or its body
	// read, and kept between requests only when it holds pipelined bytes.
	br *bufio.Reader
	// one holds a byte read ahead of br (the idle wait's or the watcher's), the first of
	// the next request; hasByte says it is there.
	one     [1]byte
	hasByte bool
	// headerLeft counts down the bytes the head of a request may use while limited is
	// set; tooLarge records that it ran out (431).
	headerLeft int64
	limited    bool
	tooLarge   bool

	// The watcher (see startWatch). wstate and bodyDone are guarded by wmu; wbyte, wgot
	// and gone are written by the watcher and read after wwg.Wait.
	wmu      sync.Mutex
	wstate   uint8
	bodyDone bool
	wwg      sync.WaitGroup
	wbyte    [1]byte
	wgot     bool
	gone     bool
	cancel   context.CancelFunc
}

const (
	watchNone uint8 = iota
	watchRunning
	watchStopped
)

// drainLocked applies the drain to c (s.mu held): an idle keep-alive connection is closed,
// a new one gets until newConnGrace after its accept to send its request.
func (c *clientConn) drainLocked(now time.Time) {
	switch c.state {
	case stateIdle:
		c.state = stateClosed
		c.rwc.Close()
	case stateNew:
		deadline := c.accepted.Add(newConnGrace)
		if deadline.Before(now) {
			deadline = now
		}
		c.rwc.SetReadDeadline(deadline)
		c.graceSet = true
	}
}

// serve runs the connection: wait for a request, answer it, repeat while keep-alive holds.
func (c *clientConn) serve() {
	linger := false
	defer func() { c.finish(linger) }()
	for first := true; ; first = false {
		if !c.pending() {
			if !first && !c.s.setState(c, stateIdle) {
				return
			}
			// A one-byte read: an idle connection holds no buffer while it waits.
			n, err := c.rwc.Read(c.one[:])
			if n == 0 || err != nil {
				return
			}
			c.hasByte = true
		}
		if !c.s.setState(c, stateActive) {
			return
		}
		keep, lingerAfter := c.serveOne()
		if !keep {
			linger = lingerAfter
			return
		}
	}
}

// pending reports bytes of a next request already read (pipelined, or read ahead).
func (c *clientConn) pending() bool {
	return c.hasByte || (c.br != nil && c.br.Buffered() > 0)
}

// finish closes the connection. After an error response with input left unread it first
// half-closes and reads for a while, so the client gets the response rather than a RST.
func (c *clientConn) finish(linger bool) {
	if linger {
		if tc, ok := c.rwc.(*net.TCPConn); ok {
			tc.CloseWrite()
			tc.SetReadDeadline(time.Now().Add(lingerTime))
			var scratch [512]byte
			for n := 0; n < lingerBytes; {
				m, err := tc.Read(scratch[:])
				n += m
				if err != nil {
					break
				}
			}
		}
	}
	c.rwc.Close()
	c.releaseReader()
	c.s.untrack(c)
}

// reader returns the connection's request reader, taking one from the pool if needed.
func (c *clientConn) reader() *bufio.Reader {
	if c.br == nil {
		c.br = readerPool.Get().(*bufio.Reader)
		c.br.Reset(c)
	}
	return c.br
}

// releaseReader gives the reader back unless it still holds pipelined bytes. Callers make
// sure nobody else reads from it (a streamed body drops it instead: forgetReader).
func (c *clientConn) releaseReader() {
	if c.br != nil && c.br.Buffered() == 0 {
		c.br.Reset(nil)
		readerPool.Put(c.br)
		c.br = nil
	}
}

// forgetReader drops the reader without pooling it: the HTTP/2 transport may still be
// reading a streamed request body through it when the connection is given up.
func (c *clientConn) forgetReader() { c.br = nil }

// errHeaderTooLarge ends reading a request head longer than maxHeaderBytes.
var errHeaderTooLarge = errors.New("request head too large")

// Read is the source of the pooled reader: the byte read ahead first, then the socket,
// counted against the head limit while limited is set.
func (c *clientConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.limited {
		if c.headerLeft <= 0 {
			c.tooLarge = true
			return 0, errHeaderTooLarge
		}
		if int64(len(p)) > c.headerLeft {
			p = p[:c.headerLeft]
		}
	}
	var n int
	var err error
	if c.hasByte {
		p[0] = c.one[0]
		c.hasByte = false
		n = 1
	} else {
		n, err = c.rwc.Read(p)
	}
	if c.limited {
		c.headerLeft -= int64(n)
	}
	return n, err
}

// readRequest reads the next request head. On a malformed or refused request it writes
// net/http's answer (400, 431, 505) itself and returns nil.
func (c *clientConn) readRequest() (*http.Request, bool) {
	br := c.reader()
	c.limited, c.headerLeft, c.tooLarge = true, maxHeaderBytes+headerSlack, false
	req, err := http.ReadRequest(br)
	c.limited = false
	if err != nil {
		switch {
		case c.tooLarge:
			c.writePlain(http.StatusRequestHeaderFieldsTooLarge, "")
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isNetError(err):
			// The client went away mid-request; nobody reads an answer.
		default:
			c.writePlain(http.StatusBadRequest, "")
		}
		return nil, false
	}
	if req.ProtoMajor != 1 {
		c.writePlain(http.StatusHTTPVersionNotSupported, "")
		return nil, false
	}
	// net/http's rule: HTTP/1.1 needs a Host (ReadRequest moves it from the header to
	// req.Host, or takes an absolute URL's, and refuses two). CONNECT is refused below.
	if req.ProtoAtLeast(1, 1) && req.Host == "" && req.Method != "CONNECT" {
		c.writePlain(http.StatusBadRequest, "missing required Host header")
		return nil, false
	}
	if req.Method == "CONNECT" {
		c.writePlain(http.StatusMethodNotAllowed, "CONNECT is not proxied")
		return nil, false
	}
	return req, true
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, net.ErrClosed)
}

// startWatch starts the watcher that notices the client going away while its request
// waits: a one-byte read on the socket, which only a closed connection (EOF, reset) or a
// next pipelined request ends. It starts only once the request body has been read in full,
// since before that the body's bytes are the request's, not a sign of life. A closed
// connection cancels the request's context, which resets the upstream stream.
//
// It runs on the connection goroutine for buffered bodies and on the HTTP/2 transport's
// goroutine (the body's EOF) for streamed ones; wmu orders it against stopWatch, so a
// watcher is never started after the response is done.
func (c *clientConn) startWatch() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.bodyDone = true
	if c.wstate != watchNone {
		return
	}
	c.wstate = watchRunning
	c.wwg.Add(1)
	go c.watch()
}

func (c *clientConn) watch() {
	defer c.wwg.Done()
	n, err := c.rwc.Read(c.wbyte[:])
	if n > 0 {
		// The next request began (pipelining): keep its byte. The client cannot be
		// watched any further, as with net/http.
		c.wgot = true
		return
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) { // not stopWatch's deadline: the client is gone
		c.gone = true
		c.cancel()
	}
}

// stopWatch ends the watcher (a past read deadline wakes its read) and waits for it, so
// that the connection goroutine reads the socket alone again. It reports whether the
// request body was read to its end.
func (c *clientConn) stopWatch() (bodyDone bool) {
	c.wmu.Lock()
	st := c.wstate
	c.wstate = watchStopped
	bodyDone = c.bodyDone
	c.wmu.Unlock()
	if st == watchRunning {
		c.rwc.SetReadDeadline(aLongTimeAgo)
		c.wwg.Wait()
		c.rwc.SetReadDeadline(time.Time{})
		if c.wgot {
			c.one[0], c.hasByte, c.wgot = c.wbyte[0], true, false
		}
	}
	return bodyDone
}

// resetWatch prepares the watcher fields for the next request (connection goroutine,
// after stopWatch: no watcher runs and none can start).
func (c *clientConn) resetWatch() {
	c.wmu.Lock()
	c.wstate, c.bodyDone = watchNone, false
	c.wmu.Unlock()
}
