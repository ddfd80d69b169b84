package main

// upcheck.go owns the one upstream dial made right after the ready file is written, so a
// wrong host, CA or protocol shows in the log and in h2ping_upstream_up within seconds,
// not at the first request of a job that may send it hours later.
//
// The connection goes into the pool, so the first request finds it ready instead of
// paying for a dial of its own; unused, it closes after the idle timeout like any other.
//
// It starts a moment after the ready file (upstreamCheckDelay), not at once: a launcher
// starts one sidecar per upstream together, and a check that parses the system roots and
// runs a TLS handshake while its siblings are still starting takes the cores they start
// on (with GOMAXPROCS 1 it also holds this process's only P, so a SIGTERM right after
// ready waited for it). A request that comes first dials for itself, and that dial is the
// check. Asking GET /upstream for the verdict starts the check at once: the launcher asks
// only once every sibling is ready and it is waiting for nothing else, so the delay would
// only add to its start (200 ms of a 4-instance start's 285 ms when it was always waited).
//
// Its verdict is read by the launcher from GET /upstream on the metrics listener
// (procmetrics.go), not from the ready file: the ready file is the readiness protocol,
// written once before the check and removed at exit, and rewriting it would race the
// launcher's reader and reap's stale-file cleanup; the same endpoint also keeps the last
// upstream error for status and top, which already talk to that listener. Error text
// never becomes a metric label value (unbounded, and it may change with every dial).
//
// Must not: delay readiness (it runs after the ready file, in its own goroutine) or send
// a request (the upstream may bill or log one).

import (
	"log"
	"runtime/debug"
	"sync"
	"time"
)

// upstreamCheckDelay is how long after the ready file the check starts unless asked for
// sooner: long enough for sidecars started together to be ready, short against the seconds
// the check promises.
const upstreamCheckDelay = 200 * time.Millisecond

// upstreamCheck is the one start-up check: started by its timer or by the first GET
// /upstream, whichever comes first, and never twice.
type upstreamCheck struct {
	once   sync.Once
	done   chan struct{} // closed when the check has ended
	up     *upstream
	logger *log.Logger
}

func newUpstreamCheck(up *upstream, logger *log.Logger) *upstreamCheck {
	return &upstreamCheck{done: make(chan struct{}), up: up, logger: logger}
}

// run starts the check in its own goroutine, the first time it is called. Safe to call
// from any goroutine, any number of times.
func (c *upstreamCheck) run() {
	c.once.Do(func() {
		go func() {
			defer close(c.done)
			checkUpstream(c.up, c.logger)
		}()
	})
}

// startUpstreamCheck arms the check to run after upstreamCheckDelay and publishes it to GET
// /upstream (stats.check), which runs it at once when asked first.
func startUpstreamCheck(up *upstream, logger *log.Logger) *upstreamCheck {
	c := newUpstreamCheck(up, logger)
	stats.check.Store(c)
	time.AfterFunc(upstreamCheckDelay, c.run)
	return c
}

// checkUpstream dials the upstream once (TCP or the egress proxy's CONNECT tunnel, TLS,
// ALPN h2, the HTTP/2 preface) and logs the outcome in one line, the upstream and the
// proxy without userinfo; a refused CONNECT reads "egress proxy http://proxy:3128
// answered 407 Proxy Authentication Required". The dial is counted like any
// other (dials, errors, up).
func checkUpstream(up *upstream, logger *log.Logger) {
	if err := up.pool.warm(); err != nil {
		if err != errPoolClosed && err != errDialedAlready {
			logger.Printf("upstream check: %s: %s", up.cfg.Upstream, oneLine(err.Error()))
		}
		return
	}
	logger.Printf("upstream check: %s%s: TLS and HTTP/2 ok", up.cfg.Upstream, describeEgress(up.cfg.Egress))
	// The dial parsed the system roots and ran a handshake: garbage that the GC tuner's
	// headroom (tuning.go) would keep until requests come, which for a job that starts
	// sending late means hours. Returned now, an idle sidecar's RSS is about 2.5 MiB lower
	// (11.5 -> 8.9 MiB when measured; the current figure is in bench/results/metrics.md).
	debug.FreeOSMemory()
}
