// gymproxy is a test double for a proxy built from NeMo Gym's h2-ping-sidecar sources: it
// follows Gym's command-line and ready-file contract, not sidecar-fsm's.
//
// The contract it reproduces, because the launcher must cope with exactly this:
//   - it knows ONLY Gym's flags (-listen, -upstream, -ping-interval, -ping-timeout,
//     -shutdown-grace, -insecure-skip-verify, -retry-body-limit, -max-conn-age, -ready-file);
//     -exit-with-pid, -ca-file and -metrics-listen are "flag provided but not defined", exit 2;
//   - `-h` prints Go's default flag usage on stderr and exits 0;
//   - after binding, it writes its bare PID and a newline into -ready-file in place (no JSON,
//     no temp file and rename), so the file never says which port a `:0` listen bound;
//   - HTTP/1.1 in on -listen, HTTP/2 over TLS out to -upstream, with PINGs after
//     -ping-interval of read-idle time, enough for one long request through an idle relay.
//
// Standard library only; built by tests/integration/test_gym_binary.py into a temp dir.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "local HTTP/1.1 listen address")
	upstream := flag.String("upstream", "", "HTTPS origin to forward to (required)")
	pingInterval := flag.Duration("ping-interval", 60*time.Second, "send a PING after this much read-idle time")
	pingTimeout := flag.Duration("ping-timeout", 15*time.Second, "close the connection if a PING is not acknowledged in time")
	shutdownGrace := flag.Duration("shutdown-grace", 15*time.Minute, "on SIGTERM, wait up to this long for in-flight requests")
	insecure := flag.Bool("insecure-skip-verify", false, "skip upstream TLS verification (testing only)")
	// Accepted for the contract; a one-request test double neither buffers nor rotates.
	_ = flag.Int64("retry-body-limit", 16<<20, "request bodies up to this many bytes are buffered for re-send")
	_ = flag.Duration("max-conn-age", 50*time.Minute, "retire the upstream connection after this age (0 disables)")
	readyFile := flag.String("ready-file", "", "write the PID to this file once the listener is bound")
	flag.Parse()

	target, err := url.Parse(*upstream)
	if err != nil || target.Scheme != "https" || target.Host == "" {
		log.Fatalf("-upstream %q: want https://host[:port]", *upstream)
	}

	transport := &http.Transport{
		ForceAttemptHTTP2: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: *insecure},
		HTTP2:             &http.HTTP2Config{SendPingTimeout: *pingInterval, PingTimeout: *pingTimeout},
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = ""
		},
		Transport:     transport,
		FlushInterval: -1,
	}
	server := &http.Server{Handler: proxy}

	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("cannot bind %s: %v", *listen, err)
	}
	if *readyFile != "" {
		// In place, not atomically: a reader can see the file empty; that is Gym's contract.
		if err := os.WriteFile(*readyFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			log.Fatalf("cannot write -ready-file %s: %v", *readyFile, err)
		}
		defer os.Remove(*readyFile)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		<-sigs
		ctx, cancel := context.WithTimeout(context.Background(), *shutdownGrace)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	log.Printf("listening on %s -> %s", listener.Addr(), target)
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("serve: %v", err)
	}
	<-done
	log.Print("stopped")
}
