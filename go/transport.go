package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// dialTimeout bounds TCP connect plus TLS handshake of one upstream connection.
	dialTimeout = 30 * time.Second
	// idleConnTimeout closes an upstream connection that carried no request for this long;
	// PINGs alone would otherwise keep every connection of a past burst open forever.
	idleConnTimeout = 5 * time.Minute
)

// hardPingFactor x -ping-timeout is how long a PING may stay unanswered on a connection
// whose upstream keeps sending other bytes.
const hardPingFactor = 4

func hardPingTimeout(d time.Duration) time.Duration { return hardPingFactor * d }

// upstream dials HTTP/2-over-TLS connections to the one origin of Config. It owns the
// TLS configuration and the http.Transport that turns a TLS connection into a ClientConn;
// the Transport's own connection cache is never used (pool.go decides when to dial).
type upstream struct {
	cfg *Config
	tr  *http.Transport

	tlsOnce sync.Once
	tlsConf *tls.Config

	// handshakes counts completed TLS handshakes (tests compare it with connections used).
	handshakes atomic.Int64
	// resent counts requests re-sent after a refusal (tests assert the retry happened).
	resent atomic.Int64

	pool *pool
	// statusUp is the NVCF status host's own upstream when it is not this one (nvcf.go).
	statusUp *upstream
	// logf, when set, logs one line per connection closed for a lost PING.
	logf func(format string, args ...any)
	// firstPing is the start-up check's PING (upcheck.go), carried by the first connection
	// that completes its handshake; nil sends none (the probe).
	firstPing *checkPing
	// onConn, when set before anything dials, sees each new connection before the HTTP/2
	// client has it (probe.go).
	onConn func(context.Context, *watchedConn)
}

func newUpstream(cfg *Config) *upstream {
	u := &upstream{cfg: cfg, firstPing: newCheckPing(cfg.PingTimeout)}
	var protos http.Protocols
	protos.SetHTTP2(true)
	u.tr = &http.Transport{
		Protocols:         &protos,
		ForceAttemptHTTP2: true,
		DialTLSContext:    u.dialTLS,
		// A proxy passes the client's Accept-Encoding through and the body as it came;
		// the transport must not add gzip and decompress behind the client's back.
		DisableCompression: true,
		IdleConnTimeout:    idleConnTimeout,
		HTTP2: &http.HTTP2Config{
			// SendPingTimeout is the read-idle timer: no frame for this long -> PING.
			SendPingTimeout: cfg.PingInterval,
			// The -ping-timeout verdict is the watcher's (framewatch.go, checkPings): a
			// silent upstream is closed at -ping-timeout, one still sending is not. Go's
			// own, which counts only the ack, is the backstop for an ack that never comes.
			PingTimeout: hardPingTimeout(cfg.PingTimeout),
			CountError:  stats.countHTTP2Error,
		},
	}
	return u
}

// newClientConn dials one new HTTP/2 connection; it is never shared with the Transport.
func (u *upstream) newClientConn(ctx context.Context) (*http.ClientConn, error) {
	start := time.Now()
	cc, err := u.tr.NewClientConn(ctx, "https", u.cfg.UpstreamAddr)
	stats.dialed(err, time.Since(start))
	return cc, err
}

// tlsConfig is built at the first dial, not at start: x509.SystemCertPool reads and parses
// the whole system bundle, work that readiness (and a launcher starting many proxies at
// once) need not wait for.
func (u *upstream) tlsConfig() *tls.Config {
	u.tlsOnce.Do(func() {
		conf := &tls.Config{
			ServerName: u.cfg.ServerName,
			// h2 only: offering http/1.1 would let a server pick it, and the sidecar
			// exists to speak HTTP/2 (PINGs) on the upstream side.
			NextProtos:         []string{"h2"},
			MinVersion:         tls.VersionTLS12,
			InsecureSkipVerify: u.cfg.InsecureSkipVerify,
			// Resumption makes the re-dials after GOAWAY or rotation cheap.
			ClientSessionCache: tls.NewLRUClientSessionCache(64),
		}
		if len(u.cfg.CAPEM) > 0 {
			roots, err := x509.SystemCertPool()
			if err != nil || roots == nil {
				roots = x509.NewCertPool()
			}
			roots.AppendCertsFromPEM(u.cfg.CAPEM)
			conf.RootCAs = roots
		}
		u.tlsConf = conf
	})
	return u.tlsConf
}

// notH2Error is a TLS connection whose ALPN result is not h2. The Transport would
// silently fall back to HTTP/1.1 on it (restricting Protocols does not prevent that for
// NewClientConn), so the dialler checks the negotiated protocol itself.
type notH2Error struct {
	addr, proto string
}

func (e *notH2Error) Error() string {
	got := "no protocol"
	if e.proto != "" {
		got = fmt.Sprintf("%q", e.proto)
	}
	return fmt.Sprintf("upstream %s negotiated ALPN %s, not h2; the sidecar never falls back to HTTP/1.1", e.addr, got)
}

func (u *upstream) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	raw, err := u.dialRaw(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, u.tlsConfig())
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		if strings.Contains(err.Error(), "no application protocol") {
			return nil, &dialError{kindALPN, fmt.Errorf("upstream %s refused ALPN h2 (%v); it does not speak HTTP/2", addr, err)}
		}
		if u.cfg.Egress != nil {
			// A site's proxy that inspects TLS re-signs the upstream's certificate with its
			// own CA: say which path the handshake took, so the fix (ca_file) is findable.
			err = fmt.Errorf("%w (through egress proxy %s; a proxy that inspects TLS needs its CA in -ca-file)", err, u.cfg.Egress)
		}
		return nil, &dialError{kindTLS, err}
	}
	u.handshakes.Add(1)
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		tc.Close()
		return nil, &dialError{kindALPN, &notH2Error{addr: addr, proto: p}}
	}
	// The HTTP/2 client runs on the watcher as on tc (see framewatch.go).
	w := stats.watch(tc, u.cfg.PingTimeout)
	if u.logf != nil {
		w.report = func(l lostPing) { u.logf("upstream %s: connection closed: %v", addr, l) }
	}
	if u.firstPing != nil {
		u.firstPing.arm(w)
	}
	if u.onConn != nil {
		u.onConn(ctx, w)
	}
	return w, nil
}

// dialRaw returns the byte stream the upstream's TLS runs on: a TCP connection to addr,
// or a CONNECT tunnel to addr through the egress proxy (egress.go). Either way what
// follows (TLS, ALPN h2, PINGs, GOAWAY, rotation) is end to end with the upstream.
func (u *upstream) dialRaw(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	if u.cfg.Egress != nil {
		return u.cfg.Egress.dial(ctx, d, addr, u.tlsConfig())
	}
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, &dialError{kindDial, err}
	}
	return raw, nil
}

// errPoolClosed is returned to requests that arrive after the drain closed the pool.
var errPoolClosed = errors.New("upstream connections are closed (shutting down)")
