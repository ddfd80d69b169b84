package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func startOrigin(t *testing.T, goawayEvery int, relayIdle time.Duration) (*origin, *x509.CertPool) {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	o, err := start("127.0.0.1:0", "127.0.0.1:0", ca, goawayEvery, 100, relayIdle)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(o.close)
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatalf("read ca: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("ca %s: no certificate", ca)
	}
	return o, roots
}

func h2Transport(roots *x509.CertPool) *http.Transport {
	var p http.Protocols
	p.SetHTTP2(true)
	return &http.Transport{
		Protocols:       &p,
		TLSClientConfig: &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}},
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The GOAWAY mode is graceful: requests the connection already carries finish, the client
// is told to take new ones elsewhere, and the connection closes once idle.
func TestGoawayAfterNRequestsLetsInFlightFinish(t *testing.T) {
	o, roots := startOrigin(t, 3, 0)
	tr := h2Transport(roots)
	defer tr.CloseIdleConnections()
	cc, err := tr.NewClientConn(context.Background(), "https", o.tlsAddr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer cc.Close()

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "https://"+o.tlsAddr+"/wait?first_byte=300ms", nil)
			resp, err := cc.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(body) != "ok\n" {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("in-flight request: got %v; want it to finish after the GOAWAY", err)
	}
	if got := o.st.goaways.Load(); got != 1 {
		t.Errorf("goaways: got %d; want 1", got)
	}
	// The client saw the GOAWAY: the connection takes no new request, then closes.
	waitFor(t, "connection unavailable after GOAWAY", func() bool { return cc.Available() == 0 })
	waitFor(t, "connection closed after GOAWAY", func() bool { return cc.Err() != nil })
	if got := o.st.connsWithRequests.Load(); got != 1 {
		t.Errorf("conns_with_requests: got %d; want 1", got)
	}
}

// Handshakes count every dialled TLS connection; only those that carried a request count
// as used: the dial-storm figure of the benchmark rests on this difference.
func TestHandshakesAndUsedConnectionsAreCountedApart(t *testing.T) {
	o, roots := startOrigin(t, 0, 0)
	idle, err := tls.Dial("tcp", o.tlsAddr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer idle.Close()
	tr := h2Transport(roots)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + o.tlsAddr + "/")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	resp.Body.Close()
	if got := o.st.handshakes.Load(); got != 2 {
		t.Errorf("handshakes: got %d; want 2", got)
	}
	if got := o.st.connsWithRequests.Load(); got != 1 {
		t.Errorf("conns_with_requests: got %d; want 1", got)
	}
}

// The relay drops a connection that carried nothing for its idle limit, and only then.
func TestRelayDropsOnlyIdleConnections(t *testing.T) {
	o, roots := startOrigin(t, 0, 300*time.Millisecond)
	// HTTP/1.1 over TLS: nothing crosses the relay while the origin waits (no PINGs).
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, NextProtos: []string{"http/1.1"}},
		DisableKeepAlives: true,
	}}
	resp, err := client.Get("https://" + o.relayAddr + "/wait?first_byte=50ms")
	if err != nil {
		t.Fatalf("short wait through the relay: got %v; want success", err)
	}
	resp.Body.Close()
	if _, err := client.Get("https://" + o.relayAddr + "/wait?first_byte=1s"); err == nil {
		t.Fatalf("wait of 1s through a 300ms-idle relay: got success; want the connection dropped")
	}
	if got := o.st.relayDrops.Load(); got != 1 {
		t.Errorf("relay_drops: got %d; want 1", got)
	}
}
