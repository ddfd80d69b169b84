package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// rawConn is a client connection that writes bytes as given and reads responses with
// http.ReadResponse, for what net/http's client cannot send (pipelining, HTTP/1.0, bad
// requests, Expect without a body yet).
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a hung proxy fails the test, not the run
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatalf("write: got %v; want nil", err)
	}
}

// response reads one response to a request with method and returns it with its body.
func (r *rawConn) response(method string) (*http.Response, string) {
	r.t.Helper()
	resp, err := http.ReadResponse(r.br, &http.Request{Method: method})
	if err != nil {
		r.t.Fatalf("reading a response: got %v; want one", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("reading the response body: got %v; want all of it", err)
	}
	return resp, string(b)
}

// closed waits for the proxy to close the connection: true on EOF or reset, false when a
// byte arrives or the connection's deadline passes first.
func (r *rawConn) closed() bool {
	_, err := r.br.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func decodeEcho(t *testing.T, body string) echoReply {
	t.Helper()
	var got echoReply
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("echo body %q: got %v; want JSON", body, err)
	}
	return got
}

func TestExpectContinueGets100BeforeTheBodyIsSent(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	r.send("POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	line, err := r.br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("before the body: got %q, %v; want \"HTTP/1.1 100 Continue\\r\\n\"", line, err)
	}
	if blank, _ := r.br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("after 100 Continue: got %q; want the blank line", blank)
	}
	r.send("hello")
	resp, body := r.response("POST")
	if got := decodeEcho(t, body); resp.StatusCode != 200 || got.Body != "hello" || got.Method != "POST" {
		t.Fatalf("got %d %+v; want 200 and the body echoed", resp.StatusCode, got)
	}
}

func TestChunkedRequestBodyBufferedAndStreamed(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	for _, limit := range []string{"1024", "3"} { // buffered (replayable), then streamed
		t.Run("limit "+limit, func(t *testing.T) {
			p := startProxy(t, origin.URL, caFileOf(t, origin), "-retry-body-limit", limit)
			r := dialRaw(t, p.addr)
			r.send("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
			resp, body := r.response("POST")
			if got := decodeEcho(t, body); resp.StatusCode != 200 || got.Body != "hello world" {
				t.Fatalf("got %d %+v; want 200 and \"hello world\" echoed", resp.StatusCode, got)
			}
			// The connection stays usable: the whole chunked body was consumed.
			r.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp, body := r.response("GET"); resp.StatusCode != 200 || decodeEcho(t, body).Path != "/after" {
				t.Fatalf("next request on the connection: got %d %q; want 200 from /after", resp.StatusCode, body)
			}
		})
	}
}

func TestKeepAliveSequentialAndPipelined(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	for i := range 3 {
		r.send(fmt.Sprintf("GET /seq/%d HTTP/1.1\r\nHost: x\r\n\r\n", i))
		resp, body := r.response("GET")
		if got := decodeEcho(t, body); resp.StatusCode != 200 || got.Path != fmt.Sprintf("/seq/%d", i) || resp.Close {
			t.Fatalf("request %d: got %d %+v close=%v; want 200 from /seq/%d, kept open", i, resp.StatusCode, got, resp.Close, i)
		}
	}
	// Two requests in one write, the second with a body: answered in order.
	r.send("POST /p1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nonePOST /p2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\ntwo")
	for _, want := range []echoReply{{Path: "/p1", Body: "one"}, {Path: "/p2", Body: "two"}} {
		resp, body := r.response("POST")
		if got := decodeEcho(t, body); resp.StatusCode != 200 || got.Path != want.Path || got.Body != want.Body {
			t.Fatalf("pipelined: got %d %+v; want 200 with %s %q", resp.StatusCode, got, want.Path, want.Body)
		}
	}
	r.send("GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if resp, _ := r.response("GET"); resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("Connection: close request: got %d close=%v; want 200 and Connection: close", resp.StatusCode, resp.Close)
	}
	if !r.closed() {
		t.Fatalf("after Connection: close: got the connection open; want it closed")
	}
}

func TestHTTP10Client(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" { // no length: the HTTP/1.0 body ends with the connection
			w.Write([]byte("part1 "))
			w.(http.Flusher).Flush()
			w.Write([]byte("part2"))
			return
		}
		echoHandler(w, r)
	}))
	p := startProxy(t, origin.URL, caFileOf(t, origin))

	r := dialRaw(t, p.addr)
	r.send("GET /old HTTP/1.0\r\n\r\n") // no Host: fine for HTTP/1.0
	resp, body := r.response("GET")
	if resp.Proto != "HTTP/1.0" || resp.StatusCode != 200 || decodeEcho(t, body).Path != "/old" || resp.ContentLength < 0 {
		t.Fatalf("HTTP/1.0 request: got %s %d %q length %d; want HTTP/1.0 200 from /old with a length", resp.Proto, resp.StatusCode, body, resp.ContentLength)
	}
	if !r.closed() {
		t.Fatalf("HTTP/1.0 without keep-alive: got the connection open; want it closed")
	}

	r = dialRaw(t, p.addr)
	r.send("GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
	resp, body = r.response("GET")
	if resp.StatusCode != 200 || body != "part1 part2" || resp.ContentLength != -1 || len(resp.TransferEncoding) != 0 {
		t.Fatalf("HTTP/1.0, unknown length: got %d %q length %d TE %v; want 200 \"part1 part2\" delimited by the close",
			resp.StatusCode, body, resp.ContentLength, resp.TransferEncoding)
	}
}

func TestHEADHasLengthButNoBody(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "11")
		io.WriteString(w, "hello world")
	}))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	r.send("HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := r.response("HEAD")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Length") != "11" || body != "" {
		t.Fatalf("HEAD: got %d Content-Length %q body %q; want 200, 11 and no body", resp.StatusCode, resp.Header.Get("Content-Length"), body)
	}
	// Had a body been sent, this response would be read from its bytes.
	r.send("GET /h HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := r.response("GET"); resp.StatusCode != 200 || body != "hello world" {
		t.Fatalf("GET after HEAD: got %d %q; want 200 \"hello world\"", resp.StatusCode, body)
	}
}

// waitingOrigin answers nothing: entered closes when its one request arrives, cancelled when
// that request's context ends (the proxy gave up on it).
func waitingOrigin(t *testing.T) (origin *httptest.Server, entered, cancelled chan struct{}) {
	entered, cancelled = make(chan struct{}), make(chan struct{})
	origin = newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(20 * time.Second):
		}
	}))
	return origin, entered, cancelled
}

func TestClientDisconnectCancelsUpstreamRequest(t *testing.T) {
	origin, entered, cancelled := waitingOrigin(t)
	p := startProxy(t, origin.URL, caFileOf(t, origin), "-retry-body-limit", "4")
	r := dialRaw(t, p.addr)
	r.send("POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789") // streamed: above the limit
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("origin: got no request after 10s; want the POST")
	}
	r.c.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatalf("origin request context: got still live 10s after the client closed; want cancelled")
	}
	if logs := p.logs.String(); strings.Contains(logs, "502") || strings.Contains(logs, "canceled") {
		t.Fatalf("log: got %q; want nothing for a client that went away", logs)
	}
}

func TestClientDisconnectCancelsBufferedRequest(t *testing.T) {
	origin, entered, cancelled := waitingOrigin(t)
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	r.send("GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	r.c.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatalf("origin request context: got still live 10s after the client closed; want cancelled")
	}
}

func TestDrainClosesIdleConnectionAndFinishesInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			<-release
		}
		io.WriteString(w, "done "+r.URL.Path)
	}))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	idle := dialRaw(t, p.addr)
	idle.send("GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := idle.response("GET"); resp.StatusCode != 200 || body != "done /first" {
		t.Fatalf("first request: got %d %q; want 200", resp.StatusCode, body)
	}
	busy := dialRaw(t, p.addr)
	busy.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered

	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		drained <- p.srv.Shutdown(ctx)
	}()
	if !idle.closed() {
		t.Fatalf("idle keep-alive connection during the drain: got open; want closed")
	}
	select {
	case err := <-drained:
		t.Fatalf("drain: got done (%v) with a request in flight; want it to wait", err)
	default:
	}
	close(release)
	resp, body := busy.response("GET")
	if resp.StatusCode != 200 || body != "done /slow" || !resp.Close {
		t.Fatalf("in-flight request: got %d %q close=%v; want 200 \"done /slow\" with Connection: close", resp.StatusCode, body, resp.Close)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("drain: got %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("drain: got still waiting after the last request; want done")
	}
}

func TestMalformedRequestGets400(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	for name, raw := range map[string]string{
		"garbage":       "this is not http\r\n\r\n",
		"no host":       "GET / HTTP/1.1\r\n\r\n",
		"bad chunk":     "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"bad length":    "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: nine\r\n\r\n",
		"header syntax": "GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			r := dialRaw(t, p.addr)
			r.send(raw)
			resp, body := r.response("GET")
			if resp.StatusCode != http.StatusBadRequest || !strings.HasPrefix(body, "400 Bad Request") || !resp.Close {
				t.Fatalf("got %d %q close=%v; want 400 and the connection closed", resp.StatusCode, body, resp.Close)
			}
		})
	}
}

func TestOversizedHeadersGet431(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	go io.WriteString(r.c, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", http.DefaultMaxHeaderBytes+4096)+"\r\n\r\n")
	resp, _ := r.response("GET")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("got %d; want 431", resp.StatusCode)
	}
	// Just under the limit still goes through.
	r = dialRaw(t, p.addr)
	go io.WriteString(r.c, "GET /big HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 512<<10)+"\r\n\r\n")
	if resp, body := r.response("GET"); resp.StatusCode != 200 || decodeEcho(t, body).Path != "/big" {
		t.Fatalf("a 512 KiB header: got %d %q; want 200", resp.StatusCode, body)
	}
}

func TestResponseTrailersAndHopHeaders(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Keep-Alive") != "" || r.Header.Get("X-Hop") != "" || r.Header.Get("Te") != "trailers" {
			http.Error(w, "hop-by-hop header forwarded", 500)
			return
		}
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", "42")
	}))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	r.send("GET /t HTTP/1.1\r\nHost: x\r\nConnection: X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nTe: trailers\r\n\r\n")
	resp, body := r.response("GET")
	if resp.StatusCode != 200 || body != "body" || resp.Trailer.Get("X-Sum") != "42" {
		t.Fatalf("got %d %q trailer %v; want 200 \"body\" and X-Sum: 42", resp.StatusCode, body, resp.Trailer)
	}
}

func TestClientGoneMidStreamCancelsUpstreamQuietly(t *testing.T) {
	cancelled := make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select { // silent after the first event: only the watcher can notice the client leave
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(20 * time.Second):
		}
	}))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	r.send("GET /sse HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(r.br, &http.Request{Method: "GET"})
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); line != "data: first\n" || err != nil {
		t.Fatalf("first event: got %q, %v; want \"data: first\\n\"", line, err)
	}
	r.c.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatalf("origin stream: got still live 10s after the client closed; want cancelled")
	}
	waitFor(t, "the proxy to drop the connection", 5*time.Second, func() bool { return p.open.Load() == 0 })
	if logs := p.logs.String(); logs != "" {
		t.Fatalf("log: got %q; want nothing for a client that went away", logs)
	}
}

// TestRequestSentWhileOneWaits: the second request arrives while the first waits, so the
// watcher reads its first byte; it must be kept, and the first request not cancelled.
func TestRequestSentWhileOneWaits(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(entered)
			select {
			case <-release:
			case <-r.Context().Done():
				http.Error(w, "cancelled", 500)
				return
			}
		}
		io.WriteString(w, "done "+r.URL.Path)
	}))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	r := dialRaw(t, p.addr)
	r.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	r.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	close(release)
	for _, want := range []string{"done /slow", "done /next"} {
		if resp, body := r.response("GET"); resp.StatusCode != 200 || body != want {
			t.Fatalf("got %d %q; want 200 %q", resp.StatusCode, body, want)
		}
	}
}
