package main

// The differential test: the same raw HTTP/1.1 bytes sent to this proxy and to a
// reference proxy (net/http's Server + httputil.ReverseProxy + http.Transport over h2) in
// front of one recording origin. What the origin receives and what the client gets back
// must be the same, byte for byte after removing Date values; every difference that is
// chosen is listed on its case with the reason. It is how our own front end was found to
// lose and forge request bytes, so it stays as a regression suite for the client side.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// diffRecord is what the origin saw of one request. Content-Length is left out of the
// headers: this proxy sends a buffered chunked body with its length (the GOAWAY re-send
// needs the body in memory anyway), the reference streams it; Body compares the bytes.
type diffRecord struct {
	Method, URI, Proto string
	Header             http.Header
	Body               string
	Trailer            http.Header
}

type recordingOrigin struct {
	srv  *httptest.Server
	ca   string
	mu   sync.Mutex
	recs []diffRecord
}

func newRecordingOrigin(t *testing.T) *recordingOrigin {
	o := &recordingOrigin{}
	o.srv = newH2Origin(t, o)
	o.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	o.ca = caFileOf(t, o.srv)
	return o
}

func (o *recordingOrigin) take() []diffRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	recs := o.recs
	o.recs = nil
	return recs
}

func (o *recordingOrigin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := diffRecord{Method: r.Method, URI: r.RequestURI, Proto: r.Proto, Header: r.Header.Clone()}
	rec.Header.Del("Content-Length")
	if r.URL.Path == "/upload413" {
		// Answers before reading the body: the early refusal of a streamed upload.
		rec.Body = "<not read>"
		o.record(rec)
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
		return
	}
	body, err := io.ReadAll(r.Body)
	rec.Body = string(body)
	if err != nil {
		rec.Body += "<error>"
	}
	rec.Trailer = r.Trailer
	o.record(rec)
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	switch r.URL.Path {
	case "/echo":
		w.Write(body)
	case "/204":
		w.WriteHeader(http.StatusNoContent)
	case "/304":
		w.WriteHeader(http.StatusNotModified)
	case "/trailers":
		h.Set("Trailer", "X-Sum")
		io.WriteString(w, "body")
		h.Set("X-Sum", "42")
	case "/stream":
		// Unknown length (headers flushed first), one write: chunk boundaries made by
		// when each proxy happens to read would differ from run to run.
		w.(http.Flusher).Flush()
		io.WriteString(w, "part1 part2")
	default:
		fmt.Fprintf(w, "%s %s\n", r.Method, r.RequestURI)
	}
}

func (o *recordingOrigin) record(rec diffRecord) {
	o.mu.Lock()
	o.recs = append(o.recs, rec)
	o.mu.Unlock()
}

// referenceProxy is net/http + httputil.ReverseProxy as documented, configured like ours
// where a setting exists (Rewrite to the origin, h2 with the origin's CA, no compression).
func referenceProxy(t *testing.T, o *recordingOrigin) (string, *atomic.Int64) {
	pem, err := os.ReadFile(o.ca)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	tr := &http.Transport{
		TLSClientConfig:    &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2:  true,
		DisableCompression: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	target := o.srv.URL
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = strings.TrimPrefix(target, "https://")
			pr.Out.Host = ""
		},
		Transport: tr,
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	srv := httptest.NewUnstartedServer(rp)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	open := &atomic.Int64{}
	srv.Config.ConnState = countOpen(open)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), open
}

// diffCase is one raw exchange. parts are written one after another (a goroutine writes,
// so a proxy that stops reading cannot block the test). The connection is read until the
// proxy closes it or wait passes; cases that keep it open end with a Connection: close
// request so both proxies close, and the few that must hang use a short wait.
type diffCase struct {
	name      string
	parts     []string
	halfClose bool
	wait      time.Duration
	// diff, when set, is a chosen difference and its reason: what the client gets and
	// what the origin sees are then not compared, and this proxy's answer must match the
	// regular expression want.
	diff, want string
}

const closeReq = "GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

func padGet(path string, size int) string {
	head := "GET " + path + " HTTP/1.1\r\nHost: x\r\nX-Pad: "
	return head + strings.Repeat("p", size-len(head)-4) + "\r\n\r\n"
}

func diffCases() []diffCase {
	var many63, many200 strings.Builder
	for i := range 63 {
		fmt.Fprintf(&many63, "GET /g%02d HTTP/1.1\r\nHost: x\r\n\r\n", i)
	}
	for i := range 200 {
		fmt.Fprintf(&many200, "GET /%03d HTTP/1.1\r\nHost: x\r\nA: b\r\n\r\n", i) // 46 bytes
	}
	hidden := "GET /admin?smuggled=1 HTTP/1.1\r\nHost: x\r\n\r\n"
	smuggle := many63.String() +
		"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + strings.Repeat("u", 20) +
		fmt.Sprintf("POST /benign HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(hidden), hidden) + closeReq
	var fields strings.Builder
	for range 20000 {
		fields.WriteString("a: b\r\n")
	}
	big := strings.Repeat("B", 1<<20)
	return []diffCase{
		{name: "get", parts: []string{closeReq}},
		{name: "keep-alive pair", parts: []string{"GET /one HTTP/1.1\r\nHost: x\r\n\r\n", closeReq}},
		{name: "pipelined over 4 KiB then POST", parts: []string{padGet("/fast", 2000) + padGet("/fast", 2000) +
			"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + strings.Repeat("e", 100) + closeReq}},
		{name: "63 GETs, upload, benign body hiding a GET", parts: []string{smuggle}},
		{name: "200 pipelined 46-byte GETs", parts: []string{many200.String() + closeReq}},
		{name: "pipelined across writes", parts: []string{"GET /a HTTP/1.1\r\nHo", "st: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n", closeReq}},
		{name: "chunked body with extension and trailer", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"5;ext=1\r\nhello\r\nA\r\n 012345678\r\n0\r\nX-T: 1\r\n\r\n" + closeReq}},
		{name: "chunked body in pieces", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc", "\r\n3\r\ndef\r\n0\r\n\r\n", closeReq}},
		{name: "expect 100-continue", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", "hello", closeReq},
			diff: "Expect is not forwarded: net/http already answered 100 Continue, and the upstream's own 100 would reach the client as a second one",
			want: `^HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n(?s:.*)\r\n\r\nhello`},
		{name: "expect something else", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: magic\r\nContent-Length: 5\r\n\r\nhello" + closeReq}},
		{name: "HEAD", parts: []string{"HEAD /fast HTTP/1.1\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "204 and 304", parts: []string{"GET /204 HTTP/1.1\r\nHost: x\r\n\r\nGET /304 HTTP/1.1\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "response trailers", parts: []string{"GET /trailers HTTP/1.1\r\nHost: x\r\nTe: trailers\r\n\r\n" + closeReq},
			diff: "ReverseProxy keeps the upstream's Content-Length and then drops the trailers; this proxy sends such a response chunked with its trailers", want: "X-Sum: 42"},
		{name: "unknown-length stream", parts: []string{"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "HTTP/1.0 without Host", parts: []string{"GET /old HTTP/1.0\r\n\r\n"}},
		{name: "HTTP/1.0 keep-alive stream", parts: []string{"GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"}},
		{name: "oversized head", parts: []string{"GET /big HTTP/1.1\r\nHost: x\r\nX-Big: " + big + big[:8192] + "\r\n\r\n"}},
		{name: "20,000 header fields", parts: []string{"GET /fields HTTP/1.1\r\nHost: x\r\n" + fields.String() + "\r\n" + closeReq}},
		{name: "folded header", parts: []string{"GET /fold HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  more\r\n\r\n" + closeReq}},
		{name: "space before colon in Content-Length", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length : 5\r\n\r\nhello" + closeReq}},
		{name: "space before colon", parts: []string{"GET /sp HTTP/1.1\r\nHost: x\r\nX-Name : v\r\n\r\n" + closeReq}},
		{name: "no colon", parts: []string{"GET /nc HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n" + closeReq}},
		{name: "invalid header name", parts: []string{"GET /bad HTTP/1.1\r\nHost: x\r\nX(y): v\r\n\r\n" + closeReq}},
		{name: "duplicate equal Content-Length", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello" + closeReq}},
		{name: "duplicate differing Content-Length", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!" + closeReq}},
		{name: "Content-Length list", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello" + closeReq}},
		{name: "signed Content-Length", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello" + closeReq}},
		{name: "Content-Length with chunked", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + closeReq}},
		{name: "unknown Transfer-Encoding", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + closeReq}},
		{name: "bad chunk size", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n" + closeReq},
			diff: "a client body that cannot be read is the client's fault: 400, where ReverseProxy answers 502", want: "400 Bad Request"},
		{name: "bare LF", parts: []string{"GET /lf HTTP/1.1\nHost: x\n\n" + closeReq}},
		{name: "empty Host", parts: []string{"GET /eh HTTP/1.1\r\nHost:\r\n\r\n" + closeReq}},
		{name: "two Hosts", parts: []string{"GET /th HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n" + closeReq}},
		{name: "no Host", parts: []string{"GET /nh HTTP/1.1\r\n\r\n" + closeReq}},
		{name: "POST body, CRLF, GET", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\r\n" + closeReq}},
		{name: "absolute-form target", parts: []string{"GET http://other.example/abs?q=1 HTTP/1.1\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "query with semicolon and bad escape", parts: []string{"GET /q?a=1;b=2&c=%zz&d=4 HTTP/1.1\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "hop-by-hop and forwarding headers", parts: []string{"GET /hop HTTP/1.1\r\nHost: x\r\nConnection: X-Hop, keep-alive\r\nX-Hop: 1\r\nKeep-Alive: 5\r\n" +
			"Proxy-Connection: x\r\nX-Forwarded-For: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\nTe: trailers, deflate\r\nAuthorization: Bearer t\r\n\r\n" + closeReq}},
		{name: "no User-Agent", parts: []string{"GET /ua HTTP/1.1\r\nHost: x\r\n\r\nGET /ua2 HTTP/1.1\r\nHost: x\r\nUser-Agent: me/1\r\n\r\n" + closeReq}},
		{name: "lower-case method", parts: []string{"get /lc HTTP/1.1\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "CONNECT", parts: []string{"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n" + closeReq}},
		{name: "OPTIONS *", parts: []string{"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "HTTP/2 preface", parts: []string{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"}},
		{name: "HTTP/1.2", parts: []string{"GET /v HTTP/1.2\r\nHost: x\r\n\r\n" + closeReq}},
		{name: "garbage", parts: []string{"this is not http\r\n\r\n"}},
		{name: "header line that never ends", parts: []string{"GET /never HTTP/1.1\r\nHost: x\r\nX-Long: aaaa"}, wait: 300 * time.Millisecond},
		{name: "half-close after a request", parts: []string{"GET /half HTTP/1.1\r\nHost: x\r\n\r\n"}, halfClose: true,
			diff: "net/http takes a half-close for a client gone and cancels the request, racing its answer: ReverseProxy then answers an empty 502, this proxy a 502 that says the client closed (never an empty 200)",
			want: `^HTTP/1.1 (502 Bad Gateway\r\n(?s:.*)request cancelled: the client closed|200 OK\r\n(?s:.*)\r\n\r\nGET /half\n$)`},
		{name: "half-close mid-body", parts: []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello"}, halfClose: true,
			diff: "a client body that ends early is the client's fault: 400 and nothing sent upstream, where ReverseProxy sends the truncated request and answers 502", want: "400 Bad Request"},
		{name: "early 413 to a streamed upload", parts: []string{"POST /upload413 HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n", big, big, closeReq}},
	}
}

var dateLine = regexp.MustCompile(`(?m)^Date: [^\r\n]*\r\n`)

// exchange sends c to addr and returns what came back (Date values removed) and how the
// connection ended: "closed", "reset" or "open" (still open when wait passed).
func exchange(t *testing.T, addr string, c diffCase) (string, string) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wait := c.wait
	if wait == 0 {
		wait = 10 * time.Second
	}
	conn.SetDeadline(time.Now().Add(wait))
	go func() {
		for _, p := range c.parts {
			if _, err := io.WriteString(conn, p); err != nil {
				return
			}
		}
		if c.halfClose {
			conn.(*net.TCPConn).CloseWrite()
		}
	}()
	var out bytes.Buffer
	_, err = io.Copy(&out, conn)
	end := "closed"
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		end = "open"
	case err != nil:
		end = "reset"
	}
	return dateLine.ReplaceAllString(out.String(), ""), end
}

func TestDifferentialAgainstNetHTTPReverseProxy(t *testing.T) {
	for _, c := range diffCases() {
		t.Run(c.name, func(t *testing.T) {
			// Each proxy gets its own origin for each case, closed (which waits for its
			// handlers) before its records are read: a request still on its way from one
			// exchange must not be counted in the next.
			run := func(start func(o *recordingOrigin) (string, *atomic.Int64)) (string, string, []diffRecord) {
				o := newRecordingOrigin(t)
				addr, open := start(o)
				out, end := exchange(t, addr, c)
				waitFor(t, "the proxy to close the client connection", 10*time.Second, func() bool { return open.Load() == 0 })
				o.srv.Close()
				return out, end, o.take()
			}
			gotOut, gotEnd, gotRecs := run(func(o *recordingOrigin) (string, *atomic.Int64) {
				p := startProxy(t, o.srv.URL, o.ca, "-retry-body-limit", "65536")
				return p.addr, p.open
			})
			wantOut, wantEnd, wantRecs := run(func(o *recordingOrigin) (string, *atomic.Int64) { return referenceProxy(t, o) })
			if c.diff != "" {
				if !regexp.MustCompile(c.want).MatchString(gotOut) {
					t.Errorf("client got %q; want it to match %q (%s)", short(gotOut), c.want, c.diff)
				}
				return
			}
			if gotOut != wantOut || gotEnd != wantEnd {
				t.Errorf("client got %q (%s); want %q (%s), as net/http + ReverseProxy", short(gotOut), gotEnd, short(wantOut), wantEnd)
			}
			if len(gotRecs) != len(wantRecs) {
				t.Fatalf("origin got %d requests %v; want %d %v", len(gotRecs), uris(gotRecs), len(wantRecs), uris(wantRecs))
			}
			for i := range gotRecs {
				g, w := fmt.Sprintf("%+v", gotRecs[i]), fmt.Sprintf("%+v", wantRecs[i])
				if g != w {
					t.Errorf("origin request %d: got %s; want %s", i, short(g), short(w))
				}
			}
		})
	}
}

func uris(recs []diffRecord) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Method+" "+r.URI)
	}
	return slices.Clip(out)
}

// short keeps failure messages readable when a case sends megabytes.
func short(s string) string {
	if len(s) > 600 {
		return s[:300] + fmt.Sprintf("...<%d bytes>...", len(s)-600) + s[len(s)-300:]
	}
	return s
}
