// Command origin is the benchmark's upstream: a fast TLS HTTP/2 origin on loopback, with a
// plain HTTP/1.1 listener for the "direct" baseline and an optional idle-dropping TCP relay in
// front of the TLS listener (AWS Global Accelerator scaled down).
//
// It owns only what bench/proxy.py measures against: the endpoints, the counters behind
// GET /stats, the throwaway certificate and the relay. It must stay cheap per request (it
// shares two cores with the proxy under test and the load generator, so it must never be the
// bottleneck) and it must not log per request.
//
// Endpoints (on every listener):
//
//	GET  /                      a few bytes
//	GET  /wait?first_byte=5s    first byte after the given duration (&id=X counts X)
//	POST /echo                  the request body back (&id=X counts X)
//	GET  /stats                 counters as JSON (see stats)
//	POST /reset                 zero the counters
//
// On start it prints one JSON line to stdout with the bound addresses and the CA path, then
// serves until SIGTERM/SIGINT or until stdin closes (so a killed benchmark never leaves it
// behind).
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listenTLS := flag.String("listen-tls", "127.0.0.1:0", "TLS listener (ALPN h2, then http/1.1)")
	listenH1 := flag.String("listen-h1", "127.0.0.1:0", "plain HTTP/1.1 listener (direct baseline, /stats)")
	caOut := flag.String("ca-out", "", "write the self-signed certificate here as PEM (required)")
	goawayEvery := flag.Int("goaway-every", 0, "send a graceful GOAWAY after this many requests on a TLS connection (0 = never)")
	maxStreams := flag.Uint("max-streams", 100, "HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection")
	relayIdle := flag.Duration("relay-idle", 0, "start a TCP relay in front of the TLS listener that drops connections silent for this long (0 = no relay)")
	flag.Parse()
	if *caOut == "" {
		fmt.Fprintln(os.Stderr, "origin: -ca-out is required; give a path for the PEM certificate")
		os.Exit(2)
	}
	if err := run(*listenTLS, *listenH1, *caOut, *goawayEvery, uint32(*maxStreams), *relayIdle); err != nil {
		fmt.Fprintf(os.Stderr, "origin: %v\n", err)
		os.Exit(1)
	}
}

func run(listenTLS, listenH1, caOut string, goawayEvery int, maxStreams uint32, relayIdle time.Duration) error {
	o, err := start(listenTLS, listenH1, caOut, goawayEvery, maxStreams, relayIdle)
	if err != nil {
		return err
	}
	defer o.close()
	ready, _ := json.Marshal(map[string]string{
		"tls":   o.tlsAddr,
		"h1":    o.h1Addr,
		"relay": o.relayAddr,
		"ca":    caOut,
	})
	fmt.Println(string(ready))

	// Exit on a signal or when the parent's pipe closes, whichever first: a benchmark killed
	// with SIGKILL cannot forward a signal, but its end of our stdin closes.
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case <-done:
	}
	return nil
}

// origin is a running origin: its bound addresses, counters and a close for tests.
type origin struct {
	tlsAddr, h1Addr, relayAddr string
	st                         *stats
	close                      func()
}

func start(listenTLS, listenH1, caOut string, goawayEvery int, maxStreams uint32, relayIdle time.Duration) (*origin, error) {
	cert, err := selfSignedCert(caOut)
	if err != nil {
		return nil, err
	}
	st := newStats()
	handler := newHandler(st)

	tlsCfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
		// Called once per ClientHello: the number of handshakes the proxy started, used ones
		// or not (the dial-storm figure).
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			st.handshakes.Add(1)
			return nil, nil
		},
	}

	tl, err := net.Listen("tcp", listenTLS)
	if err != nil {
		return nil, err
	}
	hl, err := net.Listen("tcp", listenH1)
	if err != nil {
		tl.Close()
		return nil, err
	}

	h2cfg := &http.HTTP2Config{MaxConcurrentStreams: int(maxStreams)}
	newTLSServer := func() *http.Server {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		p.SetHTTP2(true)
		return &http.Server{
			Handler:     handler,
			Protocols:   p,
			HTTP2:       h2cfg,
			ConnContext: withConnStats(st),
			ErrorLog:    quietLog(),
		}
	}
	h1 := &http.Server{Handler: handler, ErrorLog: quietLog()}
	h1p := new(http.Protocols)
	h1p.SetHTTP1(true)
	h1.Protocols = h1p

	go func() { _ = h1.Serve(hl) }()
	if goawayEvery > 0 {
		go serveGoaway(tls.NewListener(countAccepts(tl, st), tlsCfg), newTLSServer, goawayEvery, st)
	} else {
		srv := newTLSServer()
		go func() { _ = srv.Serve(tls.NewListener(countAccepts(tl, st), tlsCfg)) }()
	}

	o := &origin{tlsAddr: tl.Addr().String(), h1Addr: hl.Addr().String(), st: st}
	var rl net.Listener
	if relayIdle > 0 {
		rl, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tl.Close()
			hl.Close()
			return nil, err
		}
		o.relayAddr = rl.Addr().String()
		go serveRelay(rl, o.tlsAddr, relayIdle, st)
	}
	// close stops accepting; connections already open end with the process (the benchmark
	// and the tests never reuse an origin after closing it).
	o.close = func() {
		tl.Close()
		hl.Close()
		if rl != nil {
			rl.Close()
		}
	}
	return o, nil
}
