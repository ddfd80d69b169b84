package main

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestAskingForTheVerdictStartsTheCheckAtOnce: the launcher asks GET /upstream only once it
// waits for nothing else, so the check's timer must not add its delay to every start. Here
// the check has no timer at all: only the question can start it.
func TestAskingForTheVerdictStartsTheCheckAtOnce(t *testing.T) {
	var conns atomic.Int64
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	origin.EnableHTTP2 = true
	origin.Config.ConnState = func(_ net.Conn, st http.ConnState) { // set before it serves: no race
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	origin.StartTLS()
	origin.TLS.NextProtos = []string{"h2"}
	t.Cleanup(origin.Close)
	cfg, err := parseConfig([]string{"-upstream", origin.URL, "-ca-file", caFileOf(t, origin)},
		func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("parseConfig: got %v; want nil", err)
	}
	up := newUpstream(cfg)
	up.pool = newPool(up.newClientConn, cfg.MaxConnAge)
	t.Cleanup(up.pool.close)
	check := newUpstreamCheck(up, log.New(io.Discard, "", 0))
	stats.check.Store(check)
	t.Cleanup(func() { stats.check.Store(nil) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveMetrics(ln, false)
	t.Cleanup(func() { srv.Close() })

	select {
	case <-check.done:
		t.Fatal("check ended before anyone asked; want it to wait for its timer or the question")
	case <-time.After(100 * time.Millisecond):
	}
	if n := conns.Load(); n != 0 {
		t.Fatalf("origin connections before the question: got %d; want 0", n)
	}

	resp, err := http.Get("http://" + ln.Addr().String() + "/upstream")
	if err != nil {
		t.Fatalf("GET /upstream: got %v; want an answer", err)
	}
	resp.Body.Close()
	select {
	case <-check.done:
	case <-time.After(5 * time.Second):
		t.Fatal("check after GET /upstream: got none within 5 s; want it started at once")
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("origin connections after the check: got %d; want 1", n)
	}
	check.run() // a second question (or the timer firing later) dials nothing more
	if n := conns.Load(); n != 1 {
		t.Fatalf("origin connections after a second run: got %d; want still 1", n)
	}
}

// TestTheChecksPingIsAnsweredAndTheConnectionStaysSound: the PING written between the
// client's first frames is acknowledged (GET /upstream says so, with its round trip), and a
// request on that same connection afterwards is answered: the stream was not corrupted.
func TestTheChecksPingIsAnsweredAndTheConnectionStaysSound(t *testing.T) {
	var conns atomic.Int64
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello")
	}))
	origin.EnableHTTP2 = true
	origin.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	origin.StartTLS()
	origin.TLS.NextProtos = []string{"h2"}
	t.Cleanup(origin.Close)
	cfg, err := parseConfig([]string{"-upstream", origin.URL, "-ca-file", caFileOf(t, origin)},
		func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("parseConfig: got %v; want nil", err)
	}
	up := newUpstream(cfg)
	up.pool = newPool(up.newClientConn, cfg.MaxConnAge)
	t.Cleanup(up.pool.close)
	check := newUpstreamCheck(up, log.New(io.Discard, "", 0))
	stats.check.Store(check)
	t.Cleanup(func() { stats.check.Store(nil) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveMetrics(ln, false)
	t.Cleanup(func() { srv.Close() })
	// One question with ?wait: the answer is held until the check (dial and PING) has ended.
	resp, err := http.Get("http://" + ln.Addr().String() + "/upstream?wait=10s")
	if err != nil {
		t.Fatalf("GET /upstream?wait=10s: got %v; want an answer", err)
	}
	var got upstreamStatus
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !got.Checked || !got.OK {
		t.Fatalf("GET /upstream?wait=10s: got checked %v ok %v; want the dial's verdict in the one answer", got.Checked, got.OK)
	}
	if got.Ping == nil || *got.Ping != pingAnswered || got.PingRTT == nil || *got.PingRTT <= 0 || got.PingError != nil {
		t.Fatalf("GET /upstream ping: got %v rtt %v error %v; want answered with a round trip", got.Ping, got.PingRTT, got.PingError)
	}

	c, err := up.pool.acquire(context.Background())
	if err != nil {
		t.Fatalf("acquire: got %v; want the check's connection", err)
	}
	req, _ := http.NewRequest("GET", origin.URL+"/", nil)
	resp, err = c.cc.RoundTrip(req)
	if err != nil {
		t.Fatalf("request after the check's PING: got %v; want an answer", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hello" {
		t.Fatalf("body: got %q; want %q", body, "hello")
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("origin connections: got %d; want 1 (the request used the check's)", n)
	}
}
