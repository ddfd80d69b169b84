package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// connectProxy is a site's egress proxy scaled down: it answers CONNECT only, checks
// Proxy-Authorization when it has credentials, refuses every CONNECT with refuse when set,
// and otherwise tunnels to route(target) (the target itself when route is nil), so a
// test can give the upstream a name that is not loopback (net/http never proxies
// loopback) and still reach a local origin.
type connectProxy struct {
	url        string
	user, pass string
	refuse     int
	route      func(target string) string

	mu      sync.Mutex
	targets []string // CONNECT targets, in order
	auths   []string // Proxy-Authorization of each CONNECT
	conns   []net.Conn
}

func startConnectProxy(t *testing.T, cp *connectProxy) *connectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: cp, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		cp.mu.Lock()
		defer cp.mu.Unlock()
		for _, c := range cp.conns {
			c.Close()
		}
	})
	cp.url = "http://" + ln.Addr().String()
	return cp
}

func (cp *connectProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
		return
	}
	cp.mu.Lock()
	cp.targets = append(cp.targets, r.Host)
	cp.auths = append(cp.auths, r.Header.Get("Proxy-Authorization"))
	cp.mu.Unlock()
	want := ""
	if cp.user != "" {
		want = "Basic " + base64.StdEncoding.EncodeToString([]byte(cp.user+":"+cp.pass))
	}
	if r.Header.Get("Proxy-Authorization") != want {
		w.Header().Set("Proxy-Authenticate", `Basic realm="test"`)
		http.Error(w, "credentials please", http.StatusProxyAuthRequired)
		return
	}
	if cp.refuse != 0 {
		http.Error(w, "refused", cp.refuse)
		return
	}
	target := r.Host
	if cp.route != nil {
		target = cp.route(target)
	}
	upstream, err := net.Dial("tcp", target)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	client, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	cp.mu.Lock()
	cp.conns = append(cp.conns, client, upstream)
	cp.mu.Unlock()
	io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n")
	go func() { io.Copy(upstream, client); upstream.Close() }()
	go func() { io.Copy(client, upstream); client.Close() }()
}

func (cp *connectProxy) seen() (targets, auths []string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]string(nil), cp.targets...), append([]string(nil), cp.auths...)
}

// viaProxy returns a Config edit that sends the upstream through proxyURL, as
// HTTPS_PROXY=proxyURL would (the decision itself is net/http's and reads the process
// environment once, so in-process tests set the outcome).
func viaProxy(t *testing.T, proxyURL string) func(*Config) {
	t.Helper()
	return func(cfg *Config) {
		e, err := egressFor(cfg.Upstream, proxyURL)
		if err != nil {
			t.Fatalf("egress %q: got %v; want nil", proxyURL, err)
		}
		cfg.Egress = e
	}
}

func egressFor(upstream *url.URL, proxyURL string) (*egressProxy, error) {
	pu, err := url.Parse(proxyURL)
	if err != nil {
		return nil, err
	}
	saved := proxyForUpstream
	defer func() { proxyForUpstream = saved }()
	proxyForUpstream = http.ProxyURL(pu)
	return egressFromEnvironment(upstream, func(string) string { return "" })
}

func TestEgressFromEnvironmentRefusesWhatItCannotDialAndHidesCredentials(t *testing.T) {
	up, _ := url.Parse("https://api.example.com")
	cases := []struct {
		proxy, wantErr, wantShown, wantAddr string
	}{
		{"http://alice:s3cret@proxy.corp:3128", "", "http://proxy.corp:3128", "proxy.corp:3128"},
		{"http://proxy.corp", "", "http://proxy.corp", "proxy.corp:80"},
		{"https://bob:pw@proxy.corp", "", "https://proxy.corp", "proxy.corp:443"},
		{"socks5://carol:pw@proxy.corp:1080", `HTTPS_PROXY "socks5://proxy.corp:1080": scheme "socks5" is not supported for the upstream; use an http:// or https:// proxy`, "", ""},
	}
	for _, c := range cases {
		e, err := egressFor(up, c.proxy)
		if c.wantErr != "" {
			if err == nil || err.Error() != c.wantErr {
				t.Errorf("%s: got %v; want %q", c.proxy, err, c.wantErr)
			}
			continue
		}
		if err != nil || e.String() != c.wantShown || e.addr != c.wantAddr {
			t.Errorf("%s: got %v, %q, %q; want %q, %q", c.proxy, err, e, e.addr, c.wantShown, c.wantAddr)
			continue
		}
		for _, shown := range []string{e.String(), fmt.Sprintf("%v %+v %s", e, e, describeEgress(e))} {
			if strings.Contains(shown, "s3cret") || strings.Contains(shown, "alice") {
				t.Errorf("%s: got %q shown; want no userinfo", c.proxy, shown)
			}
		}
	}
	if e, _ := egressFor(up, "http://alice:s3cret@proxy.corp:3128"); e.auth != "Basic "+base64.StdEncoding.EncodeToString([]byte("alice:s3cret")) {
		t.Errorf("Proxy-Authorization: got %q; want Basic alice:s3cret", e.auth)
	}
}

func TestEgressTunnelCarriesRequestsWithCredentialsInProxyAuthorizationOnly(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	cp := startConnectProxy(t, &connectProxy{user: "alice", pass: "s3cret"})
	proxyURL := strings.Replace(cp.url, "http://", "http://alice:s3cret@", 1)
	p := startProxyWith(t, viaProxy(t, proxyURL), origin.URL, caFileOf(t, origin))
	for range 3 {
		code, body := get(t, p.url+"/a?b=c")
		if code != http.StatusOK || !strings.Contains(body, `"Path":"/a","Query":"b=c"`) {
			t.Fatalf("through the tunnel: got %d %q; want 200 echoing /a?b=c", code, body)
		}
	}
	targets, auths := cp.seen()
	want := strings.TrimPrefix(origin.URL, "https://")
	if len(targets) != 1 || targets[0] != want {
		t.Fatalf("CONNECT targets: got %q; want one to %q (one connection, reused)", targets, want)
	}
	if auths[0] != "Basic "+base64.StdEncoding.EncodeToString([]byte("alice:s3cret")) {
		t.Fatalf("Proxy-Authorization: got %q; want Basic alice:s3cret", auths[0])
	}
	if strings.Contains(p.logs.String(), "s3cret") {
		t.Fatalf("log: got %q; want no credentials", p.logs)
	}
}

func TestEgressThroughAnHTTPSProxy(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	cp := &connectProxy{}
	// httptest's servers share one certificate, so the origin's CA file verifies the
	// proxy too (TLS to the proxy, then the upstream's own TLS inside the tunnel).
	tlsProxy := httptest.NewTLSServer(cp)
	t.Cleanup(func() {
		tlsProxy.Close()
		cp.mu.Lock()
		defer cp.mu.Unlock()
		for _, c := range cp.conns {
			c.Close()
		}
	})
	p := startProxyWith(t, viaProxy(t, tlsProxy.URL), origin.URL, caFileOf(t, origin))
	if code, body := get(t, p.url+"/x"); code != http.StatusOK || !strings.Contains(body, `"Proto":"HTTP/2.0"`) {
		t.Fatalf("through an https:// proxy: got %d %q; want 200 over HTTP/2", code, body)
	}
	if targets, _ := cp.seen(); len(targets) != 1 {
		t.Fatalf("CONNECTs: got %q; want 1", targets)
	}
}

func TestEgressTLSFailureNamesTheRouteAndTheFix(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	addr := origin.Listener.Addr().String()
	cp := startConnectProxy(t, &connectProxy{route: func(string) string { return addr }})
	// The certificate that comes back does not name the upstream, as when a TLS-inspecting
	// proxy re-signs it with a CA the sidecar was not given.
	_, port, _ := net.SplitHostPort(addr)
	p := startProxyWith(t, viaProxy(t, cp.url), "https://upstream.test:"+port, caFileOf(t, origin))
	tlsErrs := stats.errs[kindTLS].Load()
	code, body := get(t, p.url+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "x509") ||
		!strings.Contains(body, "(through egress proxy "+cp.url+"; a proxy that inspects TLS needs its CA in -ca-file)") {
		t.Fatalf("got %d %q; want 502 naming the x509 failure, the route and the fix", code, body)
	}
	if got := stats.errs[kindTLS].Load() - tlsErrs; got != 1 {
		t.Fatalf("h2ping_upstream_errors_total{kind=\"tls\"} grew by %d; want 1", got)
	}
}

func TestEgressRefusalIs502NamingTheProxysAnswer(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	cases := []struct {
		cp         *connectProxy
		userinfo   string
		wantStatus string
	}{
		{&connectProxy{user: "alice", pass: "s3cret"}, "", "407 Proxy Authentication Required"},
		{&connectProxy{user: "alice", pass: "s3cret"}, "alice:wrong-pw@", "407 Proxy Authentication Required"},
		{&connectProxy{refuse: http.StatusForbidden}, "", "403 Forbidden"},
		{&connectProxy{refuse: http.StatusBadGateway}, "", "502 Bad Gateway"},
	}
	for _, c := range cases {
		cp := startConnectProxy(t, c.cp)
		proxyURL := strings.Replace(cp.url, "http://", "http://"+c.userinfo, 1)
		p := startProxyWith(t, viaProxy(t, proxyURL), origin.URL, caFileOf(t, origin))
		dialErrs := stats.errs[kindDial].Load()
		code, body := get(t, p.url+"/x")
		want := "h2-ping-sidecar: upstream " + origin.URL + ": egress proxy " + cp.url + " answered " + c.wantStatus + "\n"
		if code != http.StatusBadGateway || body != want {
			t.Errorf("got %d %q; want 502 %q", code, body, want)
		}
		if got := stats.errs[kindDial].Load() - dialErrs; got != 1 {
			t.Errorf("%s: h2ping_upstream_errors_total{kind=\"dial\"} grew by %d; want 1", c.wantStatus, got)
		}
		if strings.Contains(p.logs.String(), "wrong-pw") || strings.Contains(body, "wrong-pw") {
			t.Errorf("log or body: got the password; want it nowhere")
		}
	}
}

func TestEgressProxyUnreachableNamesTheProxy(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	p := startProxyWith(t, viaProxy(t, "http://u:pw@"+addr), origin.URL, caFileOf(t, origin))
	code, body := get(t, p.url+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "egress proxy http://"+addr+": dial tcp") ||
		!strings.Contains(body, "connection refused") || strings.Contains(body, "pw") {
		t.Fatalf("got %d %q; want 502 naming the proxy (no credentials) and the refusal", code, body)
	}
}

func TestEgressProxyThatNeverAnswersEndsTheDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	up, _ := url.Parse("https://api.example.com")
	e, err := egressFor(up, "http://"+ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	u := newUpstream(&Config{Upstream: up, ServerName: "api.example.com"})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = e.dial(ctx, &net.Dialer{}, "api.example.com:443", u.tlsConfig())
	var de *dialError
	if !errors.As(err, &de) || de.kind != kindDial || time.Since(start) > 5*time.Second {
		t.Fatalf("got %v after %s; want a dial error at the deadline", err, time.Since(start))
	}
}

func TestEgressGOAWAYRetryThroughTheTunnel(t *testing.T) {
	cp := startConnectProxy(t, &connectProxy{})
	code, body, o, posts, resent := goawayRefusalWith(t, viaProxy(t, "http://"+strings.TrimPrefix(cp.url, "http://")), 100, "1024")
	want := strings.Repeat("b", 100)
	if resent != 1 || code != http.StatusOK || body != want || posts[want] != 1 {
		t.Fatalf("got %d %q, re-sent %d, processed %d; want 200, the body, re-sent once, processed once", code, body, resent, posts[want])
	}
	if targets, _ := cp.seen(); len(targets) != 2 || len(o.connections()) != 2 {
		t.Fatalf("CONNECTs: got %q, origin connections %d; want 2 and 2 (the re-send on a fresh tunnel)", targets, len(o.connections()))
	}
}

// TestE2EEgressFromEnvironmentKeepsALongWaitAliveThroughTheTunnel runs the binary with
// HTTPS_PROXY (credentials included) and an upstream named example.com, which net/http
// proxies (it never proxies loopback) and the test proxy routes to the local path: an
// idle-dropping relay in front of an origin that counts PINGs. The wait is 3x the
// relay's limit, so only PINGs crossing the tunnel keep it alive.
func TestE2EEgressFromEnvironmentKeepsALongWaitAliveThroughTheTunnel(t *testing.T) {
	const idle = time.Second
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wait, _ := time.ParseDuration(r.URL.Query().Get("first_byte"))
		select {
		case <-time.After(wait):
			io.WriteString(w, "worth the wait from "+r.Host)
		case <-r.Context().Done():
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h2c.Serve(ln)
	t.Cleanup(func() { h2c.Close() })
	front := startPingCountingFront(t, ln.Addr().String())
	relay := startIdleRelay(t, front.ln.Addr().String(), idle)
	port := strconv.Itoa(relay.ln.Addr().(*net.TCPAddr).Port)
	cp := startConnectProxy(t, &connectProxy{user: "alice", pass: "s3cret", route: func(string) string { return "127.0.0.1:" + port }})
	env := []string{"HTTPS_PROXY=" + strings.Replace(cp.url, "http://", "http://alice:s3cret@", 1), "NO_PROXY=", "no_proxy=", "https_proxy="}
	upstreamURL := "https://example.com:" + port
	p := runSidecarEnv(t, env, "-upstream", upstreamURL, "-ca-file", front.caFile, "-ping-interval", (idle / 4).String(), "-ping-timeout", "5s")
	code, body := get(t, p.url()+"/slow?first_byte="+(3*idle).String())
	if code != 200 || body != "worth the wait from example.com:"+port {
		t.Fatalf("through the tunnel: got %d %q; want 200 and the upstream's own name as Host", code, body)
	}
	if n := front.pings.Load(); n < 3 {
		t.Fatalf("PINGs through the tunnel: got %d; want at least 3", n)
	}
	if targets, _ := cp.seen(); len(targets) == 0 || targets[0] != "example.com:"+port {
		t.Fatalf("CONNECT targets: got %q; want example.com:%s", targets, port)
	}
	logs := p.stderr.String()
	if !strings.Contains(logs, "upstream "+upstreamURL+" via egress proxy "+cp.url+" (") || strings.Contains(logs, "s3cret") || strings.Contains(logs, "alice") {
		t.Fatalf("log: got %q; want the route named without credentials", logs)
	}
}

func TestE2EEgressUpstreamCheckNamesTheRefusal(t *testing.T) {
	cp := startConnectProxy(t, &connectProxy{user: "alice", pass: "s3cret"})
	env := []string{"HTTPS_PROXY=", "https_proxy=" + cp.url, "NO_PROXY=", "no_proxy="}
	p := runSidecarEnv(t, env, "-upstream", "https://api.example.com:8443")
	want := "upstream check: https://api.example.com:8443: egress proxy " + cp.url + " answered 407 Proxy Authentication Required"
	waitFor(t, "the upstream check's verdict", 10*time.Second, func() bool { return strings.Contains(p.stderr.String(), want) })
}

// TestE2EEgressNoProxyIsHonoured: the upstream 0.0.0.0 reaches the local origin (Linux
// connects 0.0.0.0 to loopback) yet is no loopback address to net/http, so HTTPS_PROXY
// applies to it unless NO_PROXY names it. -insecure-skip-verify: the test certificate
// does not name 0.0.0.0, and the route, not TLS, is what is tested.
func TestE2EEgressNoProxyIsHonoured(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	upstreamURL := "https://0.0.0.0:" + strconv.Itoa(origin.Listener.Addr().(*net.TCPAddr).Port)
	for _, noProxy := range []string{"", "0.0.0.0"} {
		cp := startConnectProxy(t, &connectProxy{})
		env := []string{"HTTPS_PROXY=" + cp.url, "https_proxy=", "NO_PROXY=" + noProxy, "no_proxy="}
		p := runSidecarEnv(t, env, "-upstream", upstreamURL, "-insecure-skip-verify")
		if code, _ := get(t, p.url()+"/x"); code != http.StatusOK {
			t.Fatalf("NO_PROXY=%q: got %d; want 200", noProxy, code)
		}
		targets, _ := cp.seen()
		named := strings.Contains(p.stderr.String(), "via egress proxy "+cp.url)
		if proxied := noProxy == ""; (len(targets) == 1) != proxied || named != proxied {
			t.Fatalf("NO_PROXY=%q: got CONNECTs %q, log %q; want proxied=%v", noProxy, targets, p.stderr, proxied)
		}
		// The route the ready file says is the one taken (the launcher prints it).
		if want := map[bool]string{true: "via egress proxy " + cp.url, false: "direct"}[noProxy == ""]; p.info.Route != want {
			t.Fatalf("NO_PROXY=%q: ready file's route %q; want %q", noProxy, p.info.Route, want)
		}
	}
}

func TestE2EEgressAllProxyAloneIsNamedAsUnused(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	env := []string{"HTTPS_PROXY=", "https_proxy=", "ALL_PROXY=http://dave:pw-all@127.0.0.1:9", "all_proxy="}
	p := runSidecarEnv(t, env, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin))
	if code, _ := get(t, p.url()+"/x"); code != http.StatusOK {
		t.Fatalf("direct: got %d; want 200", code)
	}
	logs := p.stderr.String()
	if !strings.Contains(logs, "ALL_PROXY is set but not used") || strings.Contains(logs, "pw-all") {
		t.Fatalf("log: got %q; want ALL_PROXY named as unused, its value not shown", logs)
	}
}

func TestE2EEgressSocksProxyIsRefusedAtStart(t *testing.T) {
	cmd := exec.Command(sidecarBin, "-listen", "127.0.0.1:0", "-upstream", "https://api.example.com")
	cmd.Env = append(os.Environ(), "HTTPS_PROXY=socks5://carol:pw@127.0.0.1:1080", "NO_PROXY=", "no_proxy=")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || strings.Contains(string(out), "pw") ||
		!strings.Contains(string(out), `scheme "socks5" is not supported`) {
		t.Fatalf("socks5 proxy: got %v %q; want exit 2 naming the scheme, no credentials", err, out)
	}
}

// routeOfEnv names the upstream whose route a run of this test binary prints and exits
// (init, before TestMain): net/http reads the proxy variables once per process, so each
// case of TestRouteFollowsNetHTTPsRules is a process of its own.
const routeOfEnv = "H2PING_TEST_ROUTE_OF"

func init() {
	upstream := os.Getenv(routeOfEnv)
	if upstream == "" {
		return
	}
	u, err := url.Parse(upstream)
	if err == nil {
		var e *egressProxy
		if e, err = egressFromEnvironment(u, os.Getenv); err == nil {
			fmt.Print(routeOf(e))
		}
	}
	if err != nil {
		fmt.Print("error: ", err)
	}
	os.Exit(0)
}

// TestRouteFollowsNetHTTPsRules is the route the ready file says (and `sidecar-fsm start`
// prints) for each rule of net/http's ProxyFromEnvironment that README promises: the
// upper-case name first, HTTP_PROXY and ALL_PROXY unused, a bare host:port taken as
// http://, never localhost or loopback, NO_PROXY's suffix, port, CIDR and * entries; and
// never the credentials. The proxies are loopback addresses nothing listens on: nothing is
// dialled, each case only decides.
func TestRouteFollowsNetHTTPsRules(t *testing.T) {
	const proxy = "http://alice:s3cret@127.0.0.1:3128"
	const via = "via egress proxy http://127.0.0.1:3128"
	cases := []struct {
		env      map[string]string
		upstream string
		want     string
	}{
		{nil, "https://api.example.com", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy}, "https://api.example.com", via},
		{map[string]string{"https_proxy": proxy}, "https://api.example.com", via},
		{map[string]string{"HTTPS_PROXY": proxy, "https_proxy": "http://127.0.0.9:1"}, "https://api.example.com", via},
		{map[string]string{"HTTP_PROXY": proxy, "ALL_PROXY": proxy, "all_proxy": proxy}, "https://api.example.com", "direct"},
		{map[string]string{"HTTPS_PROXY": "127.0.0.1:3128"}, "https://api.example.com", via},
		{map[string]string{"HTTPS_PROXY": "https://127.0.0.1"}, "https://api.example.com", "via egress proxy https://127.0.0.1"},
		{map[string]string{"HTTPS_PROXY": proxy}, "https://localhost:8443", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy}, "https://127.0.0.2", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy}, "https://[::1]:8443", "direct"},
		// 0.0.0.0 is not loopback to net/http (the tinyproxy tests reach a local origin so).
		{map[string]string{"HTTPS_PROXY": proxy}, "https://0.0.0.0:8443", via},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "example.com"}, "https://api.example.com", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "example.com"}, "https://example.com", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": ".example.com"}, "https://example.com", via},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "*.example.com"}, "https://api.example.com", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "ample.com"}, "https://api.example.com", via},
		{map[string]string{"HTTPS_PROXY": proxy, "no_proxy": " Other.org , EXAMPLE.com "}, "https://api.example.com", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "other.org", "no_proxy": "example.com"}, "https://api.example.com", via},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "example.com:8443"}, "https://api.example.com", via},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "other.org,*"}, "https://api.example.com", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "10.0.0.0/8"}, "https://10.1.2.3", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "10.0.0.0/8"}, "https://11.1.2.3", via},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "10.1.2.3:8443"}, "https://10.1.2.3:8443", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "10.1.2.3:8443"}, "https://10.1.2.3", via},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "[2001:db8::1]:443"}, "https://[2001:db8::1]", "direct"},
		{map[string]string{"HTTPS_PROXY": proxy, "NO_PROXY": "example.com"}, "https://10.1.2.3", via},
	}
	unset := []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "REQUEST_METHOD"}
	for _, c := range cases {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		for _, kv := range os.Environ() {
			name, _, _ := strings.Cut(kv, "=")
			if !slices.Contains(unset, name) {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, routeOfEnv+"="+c.upstream)
		for name, value := range c.env {
			cmd.Env = append(cmd.Env, name+"="+value)
		}
		out, err := cmd.Output()
		if got := string(out); err != nil || got != c.want {
			t.Errorf("%v %s: got %q, %v; want %q", c.env, c.upstream, got, err, c.want)
		}
		if strings.Contains(string(out), "s3cret") || strings.Contains(string(out), "alice") {
			t.Errorf("%v %s: got %q; want no credentials", c.env, c.upstream, out)
		}
	}
}
