package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type echoReply struct {
	Method, Path, Query, Host, Body, Auth, Proto string
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	json.NewEncoder(w).Encode(echoReply{
		Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host,
		Body: string(body), Auth: r.Header.Get("Authorization"), Proto: r.Proto,
	})
}

func TestForwardKeepsPathQueryAndUpstreamHost(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	req, _ := http.NewRequest("POST", p.url+"/v1/chat?x=1&y=two", strings.NewReader("hello"))
	req.Header.Set("Authorization", "Bearer sekrit-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got echoReply
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := echoReply{Method: "POST", Path: "/v1/chat", Query: "x=1&y=two", Host: strings.TrimPrefix(origin.URL, "https://"),
		Body: "hello", Auth: "Bearer sekrit-token", Proto: "HTTP/2.0"}
	if got != want {
		t.Fatalf("origin saw %+v; want %+v", got, want)
	}
	if strings.Contains(p.logs.String(), "sekrit") {
		t.Fatalf("log: got %q; want no Authorization value", p.logs.String())
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: got %v; want a response", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestHTTP1OnlyOriginGets502NotFallback(t *testing.T) {
	var hits atomic.Int64
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	origin.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	origin.StartTLS()                                   // HTTP/1.1 only: ALPN offers http/1.1
	t.Cleanup(origin.Close)
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	code, body := get(t, p.url+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "h2") || strings.Count(body, "\n") != 1 {
		t.Fatalf("got %d %q; want 502 with one line naming h2", code, body)
	}
	if hits.Load() != 0 {
		t.Fatalf("origin requests: got %d; want 0 (no HTTP/1.1 fallback)", hits.Load())
	}
}

func TestALPNWithoutH2Gets502NamingIt(t *testing.T) {
	// A server that ignores ALPN entirely: the handshake succeeds with no protocol.
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	origin.StartTLS()
	origin.TLS.NextProtos = nil
	t.Cleanup(origin.Close)
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	code, body := get(t, p.url+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "negotiated ALPN no protocol, not h2") {
		t.Fatalf("got %d %q; want 502 naming the ALPN result", code, body)
	}
}

func TestUnreachableUpstreamGets502(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := startProxy(t, "https://"+addr, caFileOf(t, origin))
	code, body := get(t, p.url+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "connection refused") || strings.Count(body, "\n") != 1 {
		t.Fatalf("got %d %q; want 502 with one line naming the refusal", code, body)
	}
}

func TestSSEEventsArriveOneByOne(t *testing.T) {
	acks := make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-acks: // the next event is written only after the client saw this one
			case <-time.After(10 * time.Second):
				return
			}
		}
	}))
	p := startProxy(t, origin.URL, caFileOf(t, origin))
	resp, err := http.Get(p.url + "/sse")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		if want := fmt.Sprintf("data: %d\n", i); line != want || err != nil {
			t.Fatalf("event %d: got %q, %v; want %q", i, line, err, want)
		}
		br.ReadString('\n')
		acks <- struct{}{}
	}
}

// goawayRefusal sends a POST that the origin refuses with a graceful GOAWAY: a slow
// request holds stream 1 on the first connection, the origin's writes are held back, its
// graceful shutdown queues GOAWAY(last stream 1), the POST goes out as stream 3 and reaches
// the origin (counted bytes), and only then the GOAWAY is let through.
func goawayRefusal(t *testing.T, bodySize int, limit string) (int, string, *connOrigin, map[string]int, int64) {
	return goawayRefusalWith(t, nil, bodySize, limit)
}

// goawayRefusalWith is goawayRefusal with edit applied to the proxy's Config.
func goawayRefusalWith(t *testing.T, edit func(*Config), bodySize int, limit string) (int, string, *connOrigin, map[string]int, int64) {
	var mu sync.Mutex
	posts := map[string]int{}
	slowIn, release := make(chan struct{}), make(chan struct{})
	o := newConnOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(slowIn)
			<-release
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		posts[string(b)]++
		mu.Unlock()
		w.Write(b)
	}), 0)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	p := startProxyWith(t, edit, o.url, o.caFile, "-retry-body-limit", limit)
	slowDone := make(chan error, 1)
	go func() {
		resp, err := http.Get(p.url + "/slow")
		if err == nil {
			resp.Body.Close()
		}
		slowDone <- err
	}()
	<-slowIn
	first := o.connections()[0]
	first.gate.pause()
	go first.srv.Shutdown(context.Background())
	waitFor(t, "the GOAWAY to be written and held", 5*time.Second, func() bool { return first.gate.blockedWriters() > 0 })
	readBefore := first.gate.read.Load()

	body := strings.Repeat("b", bodySize)
	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Post(p.url+"/post", "text/plain", strings.NewReader(body))
		if err != nil {
			done <- result{0, err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, string(b)}
	}()
	// At least the body's size: a bare "grew" was also met by a frame of the client's own
	// (a SETTINGS or PING ack, ~40 bytes with TLS), and then, under load, the GOAWAY could
	// reach the proxy before the POST was sent, which then went to a fresh connection.
	waitFor(t, "the POST to reach the first connection", 5*time.Second, func() bool {
		return first.gate.read.Load() >= readBefore+int64(bodySize)
	})
	first.gate.resume()
	r := <-done
	close(release)
	if err := <-slowDone; err != nil {
		t.Fatalf("slow request on the GOAWAY'd connection: got %v; want it to finish", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return r.code, r.body, o, maps.Clone(posts), p.up.resent.Load()
}

func TestSmallPostResentAfterGracefulGOAWAY(t *testing.T) {
	code, body, o, posts, resent := goawayRefusal(t, 100, "1024")
	if resent != 1 {
		t.Fatalf("re-sent requests: got %d; want 1", resent)
	}
	want := strings.Repeat("b", 100)
	if code != http.StatusOK || body != want {
		t.Fatalf("got %d %q; want 200 and the body echoed", code, body)
	}
	if posts[want] != 1 {
		t.Fatalf("origin processed the POST %d times; want exactly 1", posts[want])
	}
	if n := len(o.connections()); n != 2 {
		t.Fatalf("origin connections: got %d; want 2 (refused on the first, re-sent on a fresh one)", n)
	}
}

func TestLargePostNotResentAfterGracefulGOAWAY(t *testing.T) {
	code, body, _, posts, _ := goawayRefusal(t, 4096, "1024")
	if code != http.StatusBadGateway || !strings.Contains(body, "GOAWAY") {
		t.Fatalf("got %d %q; want 502 naming the GOAWAY", code, body)
	}
	if len(posts) != 0 {
		t.Fatalf("origin processed %d POSTs; want 0", len(posts))
	}
}
