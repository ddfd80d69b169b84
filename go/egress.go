package main

// egress.go owns the site's egress proxy: whether the upstream is dialled through one
// (net/http's own ProxyFromEnvironment decides, so HTTPS_PROXY, https_proxy and NO_PROXY
// mean what they mean to every Go program and to the OpenAI client the sidecar replaces),
// and the HTTP CONNECT tunnel through it. The tunnel is only the byte stream under the
// upstream's TLS: transport.go runs TLS, ALPN h2, PINGs and everything else inside it,
// end to end with the upstream, exactly as on a direct connection.
//
// Must not: log, show or put in an error the proxy URL's userinfo (the credentials go in
// Proxy-Authorization on the CONNECT and nowhere else), or send the proxy anything but
// the CONNECT (no request header of a client ever reaches it in the clear).

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// maxProxyStatus bounds the proxy's status line quoted in an error: it is the proxy's
// text, one line, and a 502 body or a log line is no place for a page of it.
const maxProxyStatus = 120

// egressProxy is the proxy the upstream is reached through. Its String is the proxy
// without userinfo, so printing it with any verb never shows the credentials.
type egressProxy struct {
	// shown is scheme://host[:port] as the user gave it, never with userinfo.
	shown string
	// addr is host:port to dial (port 80 for http://, 443 for https:// when none given).
	addr string
	// host is the TLS server name of an https:// proxy.
	host string
	// tls is true for an https:// proxy: TLS to the proxy, then the upstream's TLS inside.
	tls bool
	// auth is the Proxy-Authorization value ("Basic ..."), empty without userinfo.
	auth string
}

func (e *egressProxy) String() string { return e.shown }

// proxyForUpstream is net/http's decision, a variable so that tests of the refusals below
// need not set the process environment (net/http reads it once per process).
var proxyForUpstream = http.ProxyFromEnvironment

// egressFromEnvironment returns the proxy to reach upstream through, or nil to dial it
// directly. The decision is net/http's: HTTPS_PROXY (else https_proxy) for an https
// upstream unless NO_PROXY (else no_proxy) matches it; never for localhost or a loopback
// address; a value that is not a URL means no proxy. ALL_PROXY is not read, as net/http
// does not. getenv only names the variable in an error. A proxy scheme other than http or
// https (socks5) is refused: the sidecar would otherwise dial directly, which on a site
// that needs the proxy fails later and less clearly.
func egressFromEnvironment(upstream *url.URL, getenv func(string) string) (*egressProxy, error) {
	pu, err := proxyForUpstream(&http.Request{URL: upstream})
	if err != nil || pu == nil {
		return nil, err
	}
	name := "HTTPS_PROXY"
	if getenv(name) == "" && getenv("https_proxy") != "" {
		name = "https_proxy"
	}
	shown := (&url.URL{Scheme: pu.Scheme, Host: pu.Host}).String()
	e := &egressProxy{shown: shown, host: pu.Hostname()}
	port := pu.Port()
	switch pu.Scheme {
	case "http":
		if port == "" {
			port = "80"
		}
	case "https":
		e.tls = true
		if port == "" {
			port = "443"
		}
	default:
		return nil, &usageError{fmt.Sprintf("%s %q: scheme %q is not supported for the upstream; use an http:// or https:// proxy", name, shown, pu.Scheme)}
	}
	if e.host == "" {
		return nil, &usageError{fmt.Sprintf("%s %q: has no host; use http://HOST:PORT", name, shown)}
	}
	e.addr = net.JoinHostPort(e.host, port)
	if pu.User != nil {
		// As net/http's Transport sends it: Basic over the decoded user and password.
		pw, _ := pu.User.Password()
		e.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(pu.User.Username()+":"+pw))
	}
	return e, nil
}

// connectRefusedError is a CONNECT the proxy answered with anything but 2xx.
type connectRefusedError struct {
	proxy  string // without userinfo
	status string // the proxy's status line after the version, e.g. "407 Proxy Authentication Required"
}

func (e *connectRefusedError) Error() string {
	return fmt.Sprintf("egress proxy %s answered %s", e.proxy, e.status)
}

// dial opens a tunnel to target (the upstream's host:port) through the proxy and returns
// the connection the upstream's TLS runs on. Every failure is a dialError of kind dial:
// until the tunnel stands, the upstream has not been reached. ctx bounds all of it (the
// CONNECT's answer included: a proxy that never answers must not hold a dial forever).
func (e *egressProxy) dial(ctx context.Context, d *net.Dialer, target string, tlsConf *tls.Config) (net.Conn, error) {
	conn, err := d.DialContext(ctx, "tcp", e.addr)
	if err != nil {
		return nil, &dialError{kindDial, fmt.Errorf("egress proxy %s: %w", e, err)}
	}
	// Unblocks the CONNECT's write and read when ctx ends; the TLS handshake below
	// watches ctx itself. stop reports whether it already fired.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	tunnel, err := e.connect(ctx, conn, target, tlsConf)
	if !stop() && err == nil {
		err = ctx.Err() // the answer came just as ctx ended: the deadline is set
	}
	if err != nil {
		conn.Close()
		var refused *connectRefusedError
		if !errors.As(err, &refused) {
			err = fmt.Errorf("egress proxy %s: %w", e, err)
		}
		return nil, &dialError{kindDial, err}
	}
	return tunnel, nil
}

// connect sends the CONNECT on conn (after TLS to an https:// proxy) and reads the answer.
func (e *egressProxy) connect(ctx context.Context, conn net.Conn, target string, tlsConf *tls.Config) (net.Conn, error) {
	if e.tls {
		conf := tlsConf.Clone()
		conf.ServerName = e.host
		// The proxy speaks HTTP/1.1 for the CONNECT; h2 is for the upstream, inside.
		conf.NextProtos = nil
		conf.ClientSessionCache = nil
		tc := tls.Client(conn, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, err
		}
		conn = tc
	}
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: target},
		Host:   target,
		Header: http.Header{},
	}
	if e.auth != "" {
		req.Header.Set("Proxy-Authorization", e.auth)
	}
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("no answer to CONNECT %s: %w", target, err)
	}
	// The body of a refusal (an HTML page) is not read: the connection is closed anyway.
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		status := oneLine(resp.Status)
		if len(status) > maxProxyStatus {
			status = status[:maxProxyStatus] + "..."
		}
		return nil, &connectRefusedError{proxy: e.String(), status: status}
	}
	if br.Buffered() > 0 {
		// Bytes after the proxy's answer are the upstream's: the reader holds them.
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// bufferedConn reads what the CONNECT's reader already buffered before the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// allProxyNote is a start-up log line for a route the user may not expect: ALL_PROXY set
// (the OpenAI client the sidecar stands in for, httpx, honours it) but no HTTPS_PROXY, so
// the upstream is dialled directly. Empty otherwise. The value is never shown.
func allProxyNote(cfg *Config, getenv func(string) string) string {
	if cfg.Egress != nil || getenv("HTTPS_PROXY") != "" || getenv("https_proxy") != "" {
		return ""
	}
	for _, name := range []string{"ALL_PROXY", "all_proxy"} {
		if getenv(name) != "" {
			return name + " is set but not used: like every Go program the sidecar reads HTTPS_PROXY and NO_PROXY; " +
				"set HTTPS_PROXY to reach the upstream through that proxy"
		}
	}
	return ""
}

// routeOf is how the ready file names the upstream's route: "direct", or "via egress proxy
// X" with X without userinfo. The launcher prints it as is, so this process is the one
// voice on which route it takes (net/http decided it, above).
func routeOf(e *egressProxy) string {
	if e == nil {
		return "direct"
	}
	return "via egress proxy " + e.String()
}

// describeEgress is how the log names the route: "" direct, else " via egress proxy X".
func describeEgress(e *egressProxy) string {
	if e == nil {
		return ""
	}
	return " " + routeOf(e)
}
