package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// connTracker records an httptest origin's connections by client address.
type connTracker struct {
	mu     sync.Mutex
	opened map[string]bool
	closed map[string]bool
}

func trackConns(srv *httptest.Server) *connTracker {
	ct := &connTracker{opened: map[string]bool{}, closed: map[string]bool{}}
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		ct.mu.Lock()
		defer ct.mu.Unlock()
		switch s {
		case http.StateNew:
			ct.opened[c.RemoteAddr().String()] = true
		case http.StateClosed, http.StateHijacked:
			ct.closed[c.RemoteAddr().String()] = true
		}
	}
	return ct
}

func (ct *connTracker) isClosed(addr string) bool {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return ct.closed[addr]
}

func (ct *connTracker) count() int {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return len(ct.opened)
}

func TestMaxConnAgeMovesNewRequestsAndClosesRetiredWhenIdle(t *testing.T) {
	slowAddr := make(chan string, 1)
	release := make(chan struct{})
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			slowAddr <- r.RemoteAddr
			<-release
		}
		io.WriteString(w, r.RemoteAddr)
	}))
	ct := trackConns(origin)
	origin.EnableHTTP2 = true
	origin.StartTLS()
	t.Cleanup(origin.Close)
	p := startProxy(t, origin.URL, caFileOf(t, origin), "-max-conn-age", "300ms")

	slowDone := make(chan int, 1)
	go func() {
		resp, err := http.Get(p.url + "/slow")
		if err != nil {
			slowDone <- 0
			return
		}
		resp.Body.Close()
		slowDone <- resp.StatusCode
	}()
	oldAddr := <-slowAddr
	waitFor(t, "the first connection to be retired", 5*time.Second, func() bool {
		n, _ := p.up.pool.stats()
		return n == 0
	})
	code, newAddr := get(t, p.url+"/echo")
	if code != 200 || newAddr == oldAddr {
		t.Fatalf("request after max-conn-age: got %d on %s; want 200 on a new connection (old %s)", code, newAddr, oldAddr)
	}
	if ct.isClosed(oldAddr) {
		t.Fatalf("retired connection: got closed with a request in flight; want it open until that request ends")
	}
	close(release)
	if code := <-slowDone; code != 200 {
		t.Fatalf("in-flight request on the retired connection: got %d; want 200", code)
	}
	waitFor(t, "the retired connection to close once idle", 5*time.Second, func() bool { return ct.isClosed(oldAddr) })
}

func TestBurstDialsOnlyTheConnectionsItNeeds(t *testing.T) {
	const requests = 250 // with 100 streams per connection: 3 connections
	arrived := make(chan struct{}, requests)
	release := make(chan struct{})
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	origin.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 100}
	ct := trackConns(origin)
	origin.EnableHTTP2 = true
	origin.StartTLS()
	t.Cleanup(origin.Close)
	p := startProxy(t, origin.URL, caFileOf(t, origin))

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: requests}}
	defer client.CloseIdleConnections()
	errs := make(chan error, requests)
	for range requests {
		go func() {
			resp, err := client.Get(p.url + "/wait")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			errs <- err
		}()
	}
	deadline := time.After(20 * time.Second)
	for i := range requests {
		select {
		case <-arrived:
		case <-deadline:
			t.Fatalf("requests at the origin: got %d; want %d", i, requests)
		}
	}
	close(release)
	for range requests {
		if err := <-errs; err != nil {
			t.Fatalf("burst request: got %v; want 200", err)
		}
	}
	if hs, used := p.up.handshakes.Load(), ct.count(); hs != 3 || used != 3 {
		t.Fatalf("handshakes, origin connections: got %d, %d; want 3, 3 (no dial storm)", hs, used)
	}
}

func TestGOAWAYChurnLosesNothing(t *testing.T) {
	const requests, concurrency = 300, 20
	o := newConnOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	}), 5)
	p := startProxy(t, o.url, o.caFile)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	defer client.CloseIdleConnections()

	var mu sync.Mutex
	var latencies []time.Duration
	work := make(chan int)
	errs := make(chan error, requests)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for range work {
				body := make([]byte, 1024)
				rand.Read(body)
				start := time.Now()
				resp, err := client.Post(p.url+"/echo", "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					errs <- err
					continue
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !bytes.Equal(got, body) {
					errs <- fmt.Errorf("status %d, %d bytes %q", resp.StatusCode, len(got), got[:min(len(got), 200)])
					continue
				}
				mu.Lock()
				latencies = append(latencies, time.Since(start))
				mu.Unlock()
			}
		})
	}
	for i := range requests {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("POST under GOAWAY churn: got %v; want 200 byte-exact", err)
	}
	slices.Sort(latencies)
	t.Logf("%d POSTs, %d origin connections, %d re-sent; p50 %s p99 %s", len(latencies), len(o.connections()),
		p.up.resent.Load(), latencies[len(latencies)/2], latencies[len(latencies)*99/100])
	if p.up.resent.Load() == 0 {
		t.Fatalf("re-sent requests: got 0; want some (the origin GOAWAYs every 5 requests)")
	}
}
