package main

// upcheck.go owns the one upstream check made right after the ready file is written: a
// dial (TCP or the egress proxy's CONNECT tunnel, TLS, ALPN h2) and one PING on that
// connection, answered or not, so a wrong host, CA or protocol, or a path whose far side
// answers no PING (AWS ALB does not; some servers GOAWAY frequent PINGs), shows in the log
// and in GET /upstream within seconds, not at the first request of a job that may send it
// hours later. A path that passes TLS and ALPN but answers no PING is worse than no sidecar:
// every long wait on it is cut at the PING timeout.
//
// How the PING is sent with net/http alone: http.ClientConn has no Ping method, and the
// keep-alive PINGs (HTTP2Config.SendPingTimeout) come only after a read-idle interval. So
// the check arms one PING frame on the connection's watcher before the HTTP/2 client has
// it (framewatch.go, injectFrame), and the watcher writes it right after the client's
// first write: its preface, SETTINGS and WINDOW_UPDATE, flushed in one write before the
// client's read loop or any request exists. The frame sits between whole frames, in a
// write no other goroutine can interleave with, so the stream stays exactly what the
// client would have sent, plus one PING. (Writing it on the TLS connection from outside
// the client, as an earlier idea had it, could land inside one of the client's frames and
// corrupt the stream.) The client ignores the ack (its payload is not one of its own);
// the watcher matches it and tells the check (connEvents). The first connection that
// completes its handshake carries the PING, whoever dialled it: the check's own dial, or a
// request's that came first.
//
// The connection goes into the pool, so the first request finds it ready instead of
// paying for a dial of its own; unused, it closes after the idle timeout like any other.
//
// It starts a moment after the ready file (upstreamCheckDelay), not at once: a launcher
// starts one sidecar per upstream together, and a check that parses the system roots and
// runs a TLS handshake while its siblings are still starting takes the cores they start
// on (with GOMAXPROCS 1 it also holds this process's only P, so a SIGTERM right after
// ready waited for it). A request that comes first dials for itself, and that dial is the
// check. Asking GET /upstream for the verdict starts the check at once: the launcher asks
// only once every sibling is ready and it is waiting for nothing else, so the delay would
// only add to its start (200 ms of a 4-instance start's 285 ms when it was always waited).
//
// Its verdict is read by the launcher from GET /upstream on the metrics listener
// (procmetrics.go), not from the ready file: the ready file is the readiness protocol,
// written once before the check and removed at exit, and rewriting it would race the
// launcher's reader and reap's stale-file cleanup; the same endpoint also keeps the last
// upstream error for status and top, which already talk to that listener. Error text
// never becomes a metric label value (unbounded, and it may change with every dial).
//
// Must not: delay readiness (it runs after the ready file, in its own goroutine) or send
// a request (the upstream may bill or log one).

import (
	"errors"
	"fmt"
	"log"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// upstreamCheckDelay is how long after the ready file the check starts unless asked for
// sooner: long enough for sidecars started together to be ready, short against the seconds
// the check promises.
const upstreamCheckDelay = 200 * time.Millisecond

// upstreamCheck is the one start-up check: started by its timer or by the first GET
// /upstream, whichever comes first, and never twice.
type upstreamCheck struct {
	once   sync.Once
	done   chan struct{} // closed when the check has ended
	up     *upstream
	logger *log.Logger
	ping   *checkPing
}

// newUpstreamCheck is the check of up; its PING is up.firstPing, armed since newUpstream
// on the first connection, so a request that dials before the check carries it too.
func newUpstreamCheck(up *upstream, logger *log.Logger) *upstreamCheck {
	return &upstreamCheck{done: make(chan struct{}), up: up, logger: logger, ping: up.firstPing}
}

// run starts the check in its own goroutine, the first time it is called. Safe to call
// from any goroutine, any number of times.
func (c *upstreamCheck) run() {
	c.once.Do(func() {
		go func() {
			defer close(c.done)
			checkUpstream(c.up, c.ping, c.logger)
		}()
	})
}

// startUpstreamCheck arms the check to run after upstreamCheckDelay and publishes it to GET
// /upstream (stats.check), which runs it at once when asked first.
func startUpstreamCheck(up *upstream, logger *log.Logger) *upstreamCheck {
	c := newUpstreamCheck(up, logger)
	stats.check.Store(c)
	time.AfterFunc(upstreamCheckDelay, c.run)
	return c
}

// checkUpstream dials the upstream once (TCP or the egress proxy's CONNECT tunnel, TLS,
// ALPN h2, the HTTP/2 preface and the check's PING), waits for the PING's verdict and logs
// the outcome in one line, the upstream and the proxy without userinfo; a refused CONNECT
// reads "egress proxy http://proxy:3128 answered 407 Proxy Authentication Required". The
// dial is counted like any other (dials, errors, up), the PING too (sent, acked).
func checkUpstream(up *upstream, ping *checkPing, logger *log.Logger) {
	if err := up.pool.warm(); err != nil {
		if err != errPoolClosed && err != errDialedAlready {
			logger.Printf("upstream check: %s: %s", up.cfg.Upstream, oneLine(err.Error()))
		}
		if err != errDialedAlready {
			return
		}
	}
	v := ping.wait()
	if v == nil { // a request dialled first and its dial failed: that is the verdict
		return
	}
	if v.state != pingAnswered {
		logger.Printf("upstream check: %s%s: TLS and HTTP/2 ok; %s", up.cfg.Upstream, describeEgress(up.cfg.Egress), v.words)
		return
	}
	logger.Printf("upstream check: %s%s: TLS and HTTP/2 ok, PING answered in %.3fs", up.cfg.Upstream, describeEgress(up.cfg.Egress), v.rtt)
	// The dial parsed the system roots and ran a handshake: garbage that the GC tuner's
	// headroom (tuning.go) would keep until requests come, which for a job that starts
	// sending late means hours. Returned now, an idle sidecar's RSS is about 2.5 MiB lower
	// (11.5 -> 8.9 MiB when measured; the current figure is in bench/results/metrics.md).
	debug.FreeOSMemory()
}

// checkPingData is the check's PING payload. Go's own health-check PINGs carry random
// bytes, so they cannot be taken for it (1 in 2^64).
var checkPingData = [8]byte{'u', 'p', 'c', 'h', 'e', 'c', 'k', '!'}

// pingFrame is a whole HTTP/2 PING frame (RFC 9113 6.7: length 8, type 0x6, no flags,
// stream 0) carrying data.
func pingFrame(data [8]byte) []byte {
	return append([]byte{0, 0, 8, framePing, 0, 0, 0, 0, 0}, data[:]...)
}

// The states of the check's PING after it was sent.
const (
	pingPending    = "pending"
	pingAnswered   = "answered"
	pingUnanswered = "unanswered"
	pingGoaway     = "goaway"
	pingClosed     = "closed"
)

// pingVerdict is how the check's PING ended: answered after rtt seconds, or words (the
// failure in one line, the remedy included) for GET /upstream, status and the log.
type pingVerdict struct {
	state string
	rtt   float64
	words string
}

// checkPing is the check's one PING: armed on the first connection that completes its
// handshake, then judged by what the watcher hears on it (connEvents) or by its timeout.
type checkPing struct {
	timeout time.Duration
	claimed atomic.Bool
	sent    atomic.Bool
	once    sync.Once
	decided chan struct{}
	verdict atomic.Pointer[pingVerdict]
}

func newCheckPing(timeout time.Duration) *checkPing {
	return &checkPing{timeout: timeout, decided: make(chan struct{})}
}

// arm gives the first connection to call it the PING and these ears; safe from any
// goroutine (connections are dialled in parallel).
func (p *checkPing) arm(w *watchedConn) {
	if p.claimed.CompareAndSwap(false, true) {
		w.events = p
		w.injectFrame(pingFrame(checkPingData))
	}
}

// state is the PING's state for GET /upstream: "" before it was sent, then pending until
// its verdict.
func (p *checkPing) state() (string, *pingVerdict) {
	if v := p.verdict.Load(); v != nil {
		return v.state, v
	}
	if p.sent.Load() {
		return pingPending, nil
	}
	return "", nil
}

// wait returns the verdict once decided, or nil at once when no connection carries the
// PING (its dial failed). Bounded by the timeout started when the PING was sent.
func (p *checkPing) wait() *pingVerdict {
	if !p.sent.Load() {
		return nil
	}
	<-p.decided
	return p.verdict.Load()
}

func (p *checkPing) decide(v *pingVerdict) {
	p.once.Do(func() {
		p.verdict.Store(v)
		if v.state != pingAnswered {
			// status shows the upstream as down in these words; not counted again: the
			// watcher counts the GOAWAY, the reset or the lost PING as it sees them.
			stats.upstreamUp.Store(false)
			stats.lastErr.Store(&upstreamNote{text: v.words, at: time.Now()})
		}
		close(p.decided)
	})
}

func (p *checkPing) pingSent(data [8]byte) {
	if data != checkPingData || p.sent.Swap(true) {
		return
	}
	time.AfterFunc(p.timeout, func() {
		p.decide(&pingVerdict{state: pingUnanswered, words: fmt.Sprintf(
			"PING not answered within %s (-ping-timeout): PINGs cannot keep this path open", p.timeout)})
	})
}

func (p *checkPing) pingAcked(data [8]byte, rtt time.Duration) {
	if data == checkPingData {
		p.decide(&pingVerdict{state: pingAnswered, rtt: rtt.Seconds()})
	}
}

func (p *checkPing) goawayReceived(code uint32) {
	if !p.sent.Load() || code == errCodeNo {
		return // a graceful GOAWAY is judged by what follows: the ack, or the close
	}
	p.decide(&pingVerdict{state: pingGoaway, words: goawayWords(code)})
}

func (p *checkPing) ended(err error) {
	if !p.sent.Load() {
		return
	}
	var pe *pingTimeoutError
	if errors.As(err, &pe) {
		p.decide(&pingVerdict{state: pingUnanswered, words: fmt.Sprintf(
			"PING not answered within %s (-ping-timeout): PINGs cannot keep this path open", p.timeout)})
		return
	}
	p.decide(&pingVerdict{state: pingClosed, words: "the upstream closed the connection before answering the PING (" +
		oneLine(err.Error()) + "): PINGs cannot keep this path open"})
}

// goawayWords names a GOAWAY that answered a PING, with what to do about it.
func goawayWords(code uint32) string {
	if code == errCodeEnhanceYourCalm {
		return "GOAWAY ENHANCE_YOUR_CALM answered the PING: the upstream refuses PINGs this often; set a longer ping_interval"
	}
	return "GOAWAY " + h2CodeName(code) + " answered the PING: PINGs cannot keep this path open"
}

// errCodeEnhanceYourCalm is what gRPC-style servers send to a client that PINGs too often.
const errCodeEnhanceYourCalm = 0xb
