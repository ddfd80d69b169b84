package main

// upcheck.go owns the one upstream dial made right after the ready file is written, so a
// wrong host, CA or protocol shows in the log and in h2ping_upstream_up within seconds,
// not at the first request of a job that may send it hours later.
//
// The connection goes into the pool, so the first request finds it ready instead of
// paying for a dial of its own; unused, it closes after the idle timeout like any other.
// (Closing it at once would also cut the TLS handshake's last bytes, still queued in the
// write coalescer, and the upstream would log a failed handshake.)
//
// Must not: delay readiness (it runs after the ready file, in its own goroutine) or send
// a request (the upstream may bill or log one).

import (
	"log"
	"runtime/debug"
)

// checkUpstream dials the upstream once (TCP, TLS, ALPN h2, the HTTP/2 preface) and logs
// the outcome in one line, the upstream without userinfo. The dial is counted like any
// other (dials, errors, up).
func checkUpstream(up *upstream, logger *log.Logger) {
	if err := up.pool.warm(); err != nil {
		if err != errPoolClosed {
			logger.Printf("upstream check: %s: %s", up.cfg.Upstream, oneLine(err.Error()))
		}
		return
	}
	logger.Printf("upstream check: %s: TLS and HTTP/2 ok", up.cfg.Upstream)
	// The dial parsed the system roots and ran a handshake: garbage that the GC tuner's
	// headroom (tuning.go) would keep until requests come, which for a job that starts
	// sending late means hours. Returned now, an idle sidecar's RSS is about 2.5 MiB lower
	// (11.5 -> 8.9 MiB when measured; the current figure is in bench/results/metrics.md).
	debug.FreeOSMemory()
}
