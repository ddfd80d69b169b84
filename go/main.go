// Command h2-ping-sidecar is a loopback HTTP/1.1 proxy to one HTTP/2-over-TLS upstream
// that keeps idle upstream connections alive with PINGs (see SPEC.md, "The proxy").
//
// main.go is wiring only: parse and validate flags, bind, write the ready file, serve,
// and drain on a signal or when the -exit-with-pid process is gone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-probe" { // a mode of its own (probe.go)
		os.Exit(runProbe(os.Args[2:], os.Getenv, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run returns the exit code: 0 after a drain, 2 for bad flags or an unbindable address
// (nothing bound, no ready file), 1 for a runtime failure.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	limitProcs(getenv)
	// Signals are caught before the ready file exists, so a launcher that stops us right
	// after readiness gets a drain, never the default kill.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	cfg, err := parseConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintf(stderr, "-listen %q: %v; choose a free address or port 0\n", cfg.Listen, unwrapOpError(err))
		return 2
	}
	outs, err := openOutputs(cfg.Outputs)
	if err != nil {
		ln.Close()
		fmt.Fprintln(stderr, err)
		return 2
	}
	var metricsAddr string
	if cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			ln.Close()
			fmt.Fprintf(stderr, "-metrics-listen %q: %v; choose a free address or port 0\n", cfg.MetricsListen, unwrapOpError(err))
			return 2
		}
		defer serveMetrics(mln, cfg.Pprof).Close()
		metricsAddr = mln.Addr().String()
	}
	logOut := stderr
	if outs.log != nil {
		logOut = outs.log
	}
	logger := log.New(logOut, "h2-ping-sidecar: ", log.LstdFlags|log.Lmicroseconds)
	up := newUpstream(cfg)
	up.logf = logger.Printf
	up.pool = newPool(up.newClientConn, cfg.MaxConnAge)
	srv := newServer(cfg, up, logger)
	if metricsAddr != "" || outs.needsCounting() {
		srv.Handler = stats.wrap(srv.Handler)
	}
	outs.start(stats, srv, logger.Printf)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	pid := os.Getpid()
	if cfg.ReadyFile != "" {
		info := readyInfo{PID: pid, Listen: ln.Addr().String(), Metrics: metricsAddr, Route: routeOf(cfg.Egress)}
		if err := writeReadyFile(cfg.ReadyFile, info); err != nil {
			fmt.Fprintln(stderr, err)
			ln.Close()
			outs.finish()
			return 1
		}
		defer removeReadyFile(cfg.ReadyFile, info)
	}
	startUpstreamCheck(up, logger)
	tuneGC(getenv)
	logger.Printf("listening on %s, upstream %s%s (ping-interval %s, ping-timeout %s, max-conn-age %s)",
		ln.Addr(), cfg.Upstream, describeEgress(cfg.Egress), cfg.PingInterval, cfg.PingTimeout, cfg.MaxConnAge)
	if note := allProxyNote(cfg, getenv); note != "" {
		logger.Print(note)
	}

	var ownerGone <-chan struct{}
	if cfg.ExitWithPID > 0 {
		ownerGone = watchPID(cfg.ExitWithPID)
	}
	select {
	case err := <-served:
		logger.Printf("serve: %v", err)
		up.pool.close()
		up.closeNVCF()
		outs.finish()
		return 1
	case sig := <-sigs:
		logger.Printf("%v: draining for up to %s", sig, cfg.ShutdownGrace)
	case <-ownerGone:
		logger.Printf("process %d is gone: draining for up to %s", cfg.ExitWithPID, cfg.ShutdownGrace)
	}
	drain(srv, up, cfg, sigs, logger)
	outs.finish()
	return 0
}

// drain stops accepting, lets in-flight requests finish for up to ShutdownGrace, then
// closes the upstream connections. A second signal ends the drain at once: closing the
// client connections cancels their requests, which resets the upstream streams.
func drain(srv *http.Server, up *upstream, cfg *Config, sigs <-chan os.Signal, logger *log.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	go func() {
		select {
		case sig := <-sigs:
			logger.Printf("%v again: stopping now", sig)
			cancel()
		case <-ctx.Done():
		}
	}()
	// Shutdown closes the listener and idle keep-alive connections at once, gives a
	// connection that has not sent its first request 5 s to do so, and waits for the
	// requests in flight, whose responses go out with Connection: close. It cancels
	// nothing: a request waits as long as ctx allows.
	if err := srv.Shutdown(ctx); err != nil {
		logger.Printf("drain cut short (%v): closing remaining requests", err)
		srv.Close()
	} else {
		logger.Printf("drained")
	}
	up.pool.close()
	up.closeNVCF()
}

func unwrapOpError(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Err
		}
		return oe.Err
	}
	return err
}
