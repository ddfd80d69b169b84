package main

// framewatch.go owns watching the HTTP/2 frames of one upstream connection, for metrics:
// PINGs sent and acknowledged (with their round trip), GOAWAY and RST_STREAM received,
// responses received, and how the connection ended. It also owns the -ping-timeout
// verdict (checkPings): it sees both when a PING left and whether anything at all came
// back since, which net/http's own timeout, counting only the processed ack, does not.
//
// Why watch bytes: net/http sends the keep-alive PINGs itself (HTTP2Config.SendPingTimeout)
// and has no hook for them, and http.ClientConn has no Ping method to send our own. So the
// upstream connection handed to the HTTP/2 client is the TLS connection wrapped in a
// watchedConn, which reads the frame headers (9 bytes: length, type, flags, stream) as
// the plaintext passes through Read and Write. It never changes or reorders a byte: it
// looks at what was already read, and at what is written before it is queued to go out
// (batchwrite.go).
// The HTTP/2 client itself still parses and answers everything.
//
// The wrapper is accepted as HTTP/2 because it has *tls.Conn's ConnectionState (promoted
// from the embedded connection): Transport.NewClientConn then runs HTTP/2 on it as it
// would on the *tls.Conn (net/http's dialConn, the ClientConn branch). The one thing the
// client does with a bare *tls.Conn is its forced close after 250 ms when a close hangs;
// Close below does the same.
//
// Must not: modify or reorder the stream (closing it on the verdict, and writing
// the one whole frame armed with injectFrame between two whole frames of the client, are
// the only actions it takes); record anything but frame types, flags, PING payloads and
// error codes (header blocks carry Authorization).

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// HTTP/2 frame types and flags (RFC 9113 section 6) that the watcher reads.
const (
	frameHeaders   = 0x1
	frameRSTStream = 0x3
	framePing      = 0x6
	frameGoAway    = 0x7
	flagAck        = 0x1

	errCodeNo      = 0x0
	errCodeRefused = 0x7
	errCodeCancel  = 0x8

	// clientPrefaceLen is "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", sent before the first frame.
	clientPrefaceLen = 24
	// maxPendingPings bounds the PINGs remembered for their round trip; the client has at
	// most one health-check PING out, so older ones are dropped, never leaked.
	maxPendingPings = 8
	// forceCloseAfter is net/http's own bound on a TLS close (ClientConn.closeConn).
	forceCloseAfter = 250 * time.Millisecond
)

// watchedConn is an upstream TLS connection whose frames are counted in stats.
type watchedConn struct {
	*tls.Conn
	// batch is the way the client's bytes go out to Conn (batchwrite.go).
	batch *writeBatcher
	m     *meters
	// pingTimeout is -ping-timeout: the HTTP/2 client closes the connection when a PING
	// is unanswered that long.
	pingTimeout time.Duration

	// out and in are used by one goroutine at a time each: the HTTP/2 client writes under
	// its write lock and reads from its read loop only.
	out, in frameScanner

	pingMu sync.Mutex
	pings  []sentPing
	// pingCheck runs pingTimeout after the oldest unanswered PING, then again after each
	// further pingTimeout of silence while one is still unanswered.
	pingCheck *time.Timer
	// verdict is set (once) when pingCheck finds the upstream silent: the connection is then
	// closed under the client, whose reads fail with a *pingTimeoutError.
	verdict atomic.Pointer[lostPing]

	// lastRead is when bytes last came from the upstream (unix nanoseconds).
	lastRead atomic.Int64
	// report, when set, is told about a connection closed for a lost PING.
	report func(lostPing)
	// events, when set before the HTTP/2 client has the connection, hears what the watcher
	// sees on it (upcheck.go's PING verdict, probe.go's report of how it closed).
	events connEvents
	// inject is one whole frame to write at the next frame boundary of the outgoing stream
	// (injectFrame); nil when none. Set before the HTTP/2 client has the connection, then
	// touched only inside Write, which the client never calls from two goroutines at once.
	inject []byte

	goaway atomic.Bool // a GOAWAY arrived: the end of the connection is expected
	closed atomic.Bool // Close was called: read errors after it are ours
	ended  atomic.Bool // the connection's end was counted (once)
}

type sentPing struct {
	data [8]byte
	at   time.Time
}

// lostPing is what was known when a connection was closed for an unanswered PING: how long
// the PING had been out, when the upstream last sent anything, and how many bytes were
// waiting unread in the socket (-1: unknown). Bytes waiting mean the answer may be among
// them and this process was too busy to read it; none, and nothing read since the PING,
// mean the upstream (or the path to it) was silent.
type lostPing struct {
	pingAge, sinceRead time.Duration
	unread             int
}

func (l lostPing) String() string {
	return fmt.Sprintf("PING unanswered for %s; last bytes from the upstream %s ago, %d bytes waiting unread in the socket",
		l.pingAge.Round(time.Millisecond), l.sinceRead.Round(time.Millisecond), l.unread)
}

// watch wraps tc (handshake done, ALPN h2) and counts it as an open connection.
func (m *meters) watch(tc *tls.Conn, pingTimeout time.Duration) *watchedConn {
	m.conns.Add(1)
	c := &watchedConn{Conn: tc, m: m, pingTimeout: pingTimeout}
	if tc != nil {
		c.batch = newWriteBatcher(tc, func() { tc.NetConn().Close() })
	}
	c.lastRead.Store(time.Now().UnixNano())
	c.out.skip = clientPrefaceLen
	c.out.sent = true
	return c
}

// Write looks at p before it leaves: the HTTP/2 client's read loop can read a PING's ack
// before this Write returns, and an ack read before its PING was recorded would match
// nothing, leaving the PING pending to be judged lost. A Write that fails has ended the
// connection, so bytes looked at but not sent mislead nothing.
func (c *watchedConn) Write(p []byte) (int, error) {
	c.out.feed(p, c)
	n, err := c.batch.Write(p)
	if c.inject != nil && err == nil && c.out.atFrameBoundary() {
		frame := c.inject
		c.inject = nil
		// Looked at before it leaves, for the same reason as p; a failed write has ended
		// the connection, which the client sees at its next read or write.
		c.out.feed(frame, c)
		c.batch.Write(frame)
	}
	return n, err
}

// injectFrame arms frame (one whole HTTP/2 frame) to be written right after the first
// write of the HTTP/2 client that ends at a frame boundary: for a new connection, the
// client's preface, SETTINGS and WINDOW_UPDATE, which newClientConn flushes in one write
// before anything else can write. It must be called before the client has the connection.
//
// This is how the start-up check sends its PING with net/http alone (http.ClientConn has
// no Ping method): the frame goes between two whole frames of the client, inside one of
// the client's own Writes (its first, made before its read loop or any request exists;
// any later one is made under its write lock), so no frame of the client is split and no
// other writer can interleave; the TLS layer below sees two writes in order, as it would
// from the client itself. The ack is read by the client, which ignores an ack whose
// payload it did not send (Go's processPing), and by this watcher, which matches it.
func (c *watchedConn) injectFrame(frame []byte) { c.inject = frame }

// connEvents hears the frames and the end of one watched connection. Its methods run on
// the connection's reading or writing goroutine and must not block.
type connEvents interface {
	pingSent(data [8]byte)
	pingAcked(data [8]byte, rtt time.Duration)
	goawayReceived(code uint32)
	// ended: the connection failed under the client (a read error not caused by our own
	// Close): EOF, a reset, or a lost PING's *pingTimeoutError.
	ended(err error)
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
	}
	c.in.feed(p[:n], c)
	if err != nil {
		if werr := c.batch.failure(); werr != nil {
			err = werr // the batch write failed and closed the connection under this read
		}
		if l := c.verdict.Load(); l != nil {
			err = &pingTimeoutError{timeout: c.pingTimeout, silence: l}
		} else {
			c.readFailed(err)
		}
		if c.events != nil && !c.closed.Load() {
			c.events.ended(err)
		}
	}
	return n, err
}

// readFailed classifies how the upstream ended the connection. Errors after our own
// Close (idle, rotation, drain, lost PING: counted where it is decided) are not the
// upstream's; EOF after a GOAWAY is the graceful end the GOAWAY announced.
func (c *watchedConn) readFailed(err error) {
	if c.closed.Load() || errors.Is(err, net.ErrClosed) || c.ended.Swap(true) {
		return
	}
	switch {
	case errors.Is(err, io.EOF) && c.goaway.Load():
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		c.m.upstreamFailed(kindReset, "upstream ended the connection: "+err.Error())
	default:
		c.m.upstreamFailed(kindOther, "reading from the upstream: "+err.Error())
	}
}

// Close closes the connection once. Like net/http's forceCloseConn for a *tls.Conn, a TLS
// close still blocked after forceCloseAfter (a write stuck on a peer that reads nothing
// holds the lock the close_notify alert needs) is ended by closing the TCP connection.
func (c *watchedConn) Close() error {
	if c.closed.Swap(true) {
		return c.Conn.Close()
	}
	c.m.conns.Add(-1)
	c.pingMu.Lock()
	if c.pingCheck != nil {
		c.pingCheck.Stop()
	}
	c.pingMu.Unlock()
	l := c.verdict.Load()
	if age, out := c.oldestPing(); l == nil && out && age >= hardPingTimeout(c.pingTimeout)*3/4 {
		// net/http's backstop is closing it (see hardPingTimeout).
		l = &lostPing{pingAge: age, sinceRead: time.Since(time.Unix(0, c.lastRead.Load())), unread: unreadBytes(c.Conn.NetConn())}
	}
	if l != nil && !c.ended.Swap(true) {
		c.m.upstreamFailed(kindPingTimeout, "PING not answered within "+c.pingTimeout.String()+" (-ping-timeout): "+l.String()+"; connection closed")
		if c.report != nil {
			c.report(*l)
		}
	}
	c.batch.close()
	t := time.AfterFunc(forceCloseAfter, func() { c.Conn.NetConn().Close() })
	defer t.Stop()
	return c.Conn.Close()
}

// oldestPing is how long the oldest unanswered PING has been out, if one is. The HTTP/2
// client's own deadline starts just before the PING is written, so the age seen here may
// fall a little short of it; three quarters of it still tells a lost PING from one merely
// in flight when the connection is closed for another reason (idle, rotation, drain).
func (c *watchedConn) oldestPing() (time.Duration, bool) {
	c.pingMu.Lock()
	defer c.pingMu.Unlock()
	if len(c.pings) == 0 {
		return 0, false
	}
	return time.Since(c.pings[0].at), true
}

// checkPings is the verdict on a connection with a PING out for pingTimeout: dead only if
// the upstream has sent nothing at all since the PING, not even bytes still waiting unread
// in the socket. Anything from it means it is alive and its PING ack is behind those
// bytes, or this process was too busy to read it: a PING answered late is not a lost
// connection (a late ack once ended a thousand waits with 502 on a loaded machine), and
// the check looks again after another pingTimeout of silence. A connection that went
// silent is still closed pingTimeout after the PING, as -ping-timeout promises.
func (c *watchedConn) checkPings() {
	if c.closed.Load() {
		return
	}
	c.pingMu.Lock()
	if len(c.pings) == 0 {
		c.pingMu.Unlock()
		return
	}
	sent := c.pings[0].at
	lastRead := time.Unix(0, c.lastRead.Load())
	silentFrom := sent
	if lastRead.After(sent) {
		silentFrom = lastRead
	}
	silence := time.Since(silentFrom)
	unread := 0
	if silence >= c.pingTimeout {
		unread = unreadBytes(c.Conn.NetConn())
	}
	if silence < c.pingTimeout || unread > 0 {
		next := c.pingTimeout - silence
		if next <= 0 {
			next = c.pingTimeout
		}
		c.pingCheck.Reset(next)
		c.pingMu.Unlock()
		return
	}
	c.pingMu.Unlock()
	l := &lostPing{pingAge: time.Since(sent), sinceRead: time.Since(lastRead), unread: unread}
	if c.verdict.CompareAndSwap(nil, l) {
		// Closing the TCP connection (not c.Close: that is the client's to call) fails the
		// client's blocked read at once; it then ends every stream with that read's error.
		c.Conn.NetConn().Close()
	}
}

// frame handles a frame whose first len(data) payload bytes (as many as keepBytes asked
// for) have passed.
func (c *watchedConn) frame(sent bool, typ, flags byte, data []byte) {
	m := c.m
	switch {
	case typ == framePing && sent && flags&flagAck == 0:
		m.pingsSent.Add(1)
		c.pingMu.Lock()
		if len(c.pings) == maxPendingPings {
			c.pings = append(c.pings[:0], c.pings[1:]...)
		}
		c.pings = append(c.pings, sentPing{data: [8]byte(data), at: time.Now()})
		if c.pingCheck == nil {
			c.pingCheck = time.AfterFunc(c.pingTimeout, c.checkPings)
		} else if len(c.pings) == 1 {
			c.pingCheck.Reset(c.pingTimeout)
		}
		c.pingMu.Unlock()
		if c.events != nil {
			c.events.pingSent([8]byte(data))
		}
	case typ == framePing && !sent && flags&flagAck != 0:
		var rtt time.Duration
		acked := false
		c.pingMu.Lock()
		for i, p := range c.pings {
			if p.data == [8]byte(data) {
				rtt, acked = time.Since(p.at), true
				c.pings = append(c.pings[:i], c.pings[i+1:]...)
				m.pingAcks.Add(1)
				m.pingRTT.Store(math.Float64bits(rtt.Seconds()))
				break
			}
		}
		c.pingMu.Unlock()
		if acked && c.events != nil {
			c.events.pingAcked([8]byte(data), rtt)
		}
	case typ == frameGoAway && !sent:
		c.goaway.Store(true)
		m.goaways.Add(1)
		code := be32(data[4:8])
		if code != errCodeNo {
			m.upstreamFailed(kindReset, "GOAWAY from the upstream with error code "+h2CodeName(code))
		}
		if c.events != nil {
			c.events.goawayReceived(code)
		}
	case typ == frameRSTStream && !sent:
		// REFUSED_STREAM is re-sent (a retry, not a failure); CANCEL is also what a server
		// answers to a stream the proxy itself cancelled because its client went away.
		if code := be32(data); code != errCodeNo && code != errCodeRefused && code != errCodeCancel {
			m.upstreamFailed(kindReset, "RST_STREAM from the upstream with error code "+h2CodeName(code))
		}
	case typ == frameHeaders && !sent:
		m.upstreamOK()
	}
}

// h2CodeNames are RFC 9113's error code names, for the last-error text.
var h2CodeNames = [...]string{"NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
	"SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL",
	"COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"}

// h2CodeName is code's name, or its number for a code RFC 9113 does not define.
func h2CodeName(code uint32) string {
	if int(code) < len(h2CodeNames) {
		return h2CodeNames[code]
	}
	return "0x" + strconv.FormatUint(uint64(code), 16)
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// keepBytes is how many payload bytes of a frame the watcher needs (0: none, the frame
// is counted from its header alone or not at all). Only frames whose payload is fixed by
// the protocol are read: PING data, GOAWAY's last stream and error code, RST_STREAM's
// error code. HEADERS is handled at its header; its header block is never looked at.
func keepBytes(sent bool, typ byte) int {
	switch {
	case typ == framePing:
		return 8
	case typ == frameGoAway && !sent:
		return 8
	case typ == frameRSTStream && !sent:
		return 4
	}
	return 0
}

// frameScanner follows frame boundaries in one direction of the byte stream, across
// Read and Write calls that split frames anywhere.
type frameScanner struct {
	sent  bool // the direction: written by the proxy (true) or read from the upstream
	skip  int  // preface bytes still to pass
	hdr   [9]byte
	hn    int // header bytes collected
	left  int // payload bytes of the current frame still to pass
	typ   byte
	flags byte
	need  int // payload bytes to collect into keep before the frame is reported
	keep  [8]byte
	kn    int
}

// atFrameBoundary is true when the bytes fed so far end with a whole frame (or the
// preface): a frame written now starts a frame of its own.
func (s *frameScanner) atFrameBoundary() bool { return s.skip == 0 && s.hn == 0 && s.left == 0 }

func (s *frameScanner) feed(p []byte, c *watchedConn) {
	for len(p) > 0 {
		if s.skip > 0 {
			n := min(s.skip, len(p))
			s.skip -= n
			p = p[n:]
			continue
		}
		if s.left == 0 && s.hn < len(s.hdr) {
			n := copy(s.hdr[s.hn:], p)
			s.hn += n
			p = p[n:]
			if s.hn < len(s.hdr) {
				return
			}
			s.left = int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
			s.typ, s.flags = s.hdr[3], s.hdr[4]
			s.need, s.kn = keepBytes(s.sent, s.typ), 0
			switch {
			case s.need > s.left:
				s.need = 0 // malformed: the HTTP/2 client rejects it; nothing to report
			case s.need == 0:
				c.frame(s.sent, s.typ, s.flags, nil)
			}
			if s.left == 0 {
				s.hn = 0
			}
			continue
		}
		n := min(s.left, len(p))
		if s.kn < s.need {
			k := copy(s.keep[s.kn:s.need], p[:n])
			s.kn += k
			if s.kn == s.need {
				c.frame(s.sent, s.typ, s.flags, s.keep[:s.need])
			}
		}
		s.left -= n
		p = p[n:]
		if s.left == 0 {
			s.hn = 0
		}
	}
}
