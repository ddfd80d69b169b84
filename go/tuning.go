package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// Runtime defaults for this proxy's load, measured with bench/proxy.py on a 2-core machine
// (figures in bench/results/proxy-tuning.md). Each applies only when the environment does not set
// the knob itself: the launcher's gomaxprocs/gomemlimit config (GOMAXPROCS, GOMEMLIMIT)
// and a user's GOGC always win.

// defaultProcs is GOMAXPROCS when the environment does not set it. The proxy's work per
// request is a few microseconds of parsing between network waits, so with more than one P
// most of its CPU went to handing goroutines between Ps: futex wake-ups, spinning Ms and
// their usleep (strace at c=16: 1.8 nanosleep and 0.8 futex calls per request). In one
// bench/proxy.py run at c=16, the same build with 2 Ps vs 1 P: 0.48x vs 0.64x HAProxy's
// requests/s and 3.1x vs 2.2x its CPU per request. One core carries ~10,000 requests/s,
// far above what an LLM endpoint sees.
const defaultProcs = 1

// GC headroom: the collector may let the heap grow by gcHeadroom before the next cycle
// (GOGC = gcHeadroom / (live heap + stacks + globals)), clamped to [gcPercentMin,
// gcPercentMax]. With the default GOGC=100 a proxy at concurrency 16 has under 1 MB live
// and collected every 4 MB (the runtime's minimum heap): 46 cycles in a 3 s run, GC and
// allocation 13 % of its CPU; with this tuner 7 cycles. A fixed higher GOGC would multiply
// the heap of 2,000 requests in flight (RSS target < 80 MiB), so the percentage follows the
// live size: a small heap gets at most 4x the 4 MB minimum, a large one is collected at
// 50 % growth (stacks count in the base, and 2,000 waiting requests hold 21 MB of them).
//
// Why no tighter default (bench scale phase, 2,000 x 5 s waits, runs alternated): the peak
// RSS is live memory, not garbage. With net/http's server it was ~81 MiB (stacks 31 MiB,
// its per-connection buffers 19 MiB, written all at once by the response burst); no GC
// setting moved it much (GOMEMLIMIT=60MiB gave 65-67 MiB for 10x the CPU, GOGC=10 75-78 MiB for
// +45 % CPU; GOGC=25 and GODEBUG=adaptivestackstart=0 nothing). The front end of
// frontend.go holds no buffer while a request waits: peak ~47 MiB (stacks 21 MiB, heap
// 15 MiB). A user who wants the RSS lower still, at the cost of CPU, sets the launcher's
// gomemlimit.
const (
	gcHeadroom   = 16 << 20
	gcPercentMin = 50
	gcPercentMax = 400
)

// limitProcs applies defaultProcs; getenv is os.Getenv outside tests. main calls it first
// thing, before any goroutine of its own exists: while the runtime has an idle P, each new
// goroutine (the signal watcher, the accept loop, the runtime's own) wakes it, which costs a
// thread, a spinning M and futex wake-ups before the ready file is even written. With four
// proxies started together on two cores, calling it first rather than after the ready file
// saved 0.82 ms of the proxies' CPU and 0.74 ms of the launcher's warm start (80 paired
// starts, bench/launcher.py's configuration); the stop-the-world it takes is cheaper than the
// threads it avoids.
func limitProcs(getenv func(string) string) {
	if getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(defaultProcs)
	}
}

// tuneGC arms the GC tuner unless GOGC is set; getenv is os.Getenv outside tests. It starts
// at gcPercentMax, which is what adjust computes for any live size under gcHeadroom /
// gcPercentMax (4 MB), as at every start: the first metrics.Read (which builds the runtime's
// table of metrics) then happens at the first GC, not while the proxies of a run are still
// starting on the same cores. Without the tuner's start-up work, 4 proxies used 1.2 ms less
// CPU by the time the launcher's start returned (60 paired starts).
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		t := &gcTuner{samples: []metrics.Sample{
			{Name: "/gc/heap/live:bytes"},
			{Name: "/gc/scan/stack:bytes"},
			{Name: "/gc/scan/globals:bytes"},
		}, percent: gcPercentMax}
		debug.SetGCPercent(gcPercentMax)
		t.arm()
	}
}

// gcTuner re-derives GOGC after every GC cycle from the live size that cycle measured.
// It runs on the finalizer goroutine, one cycle behind: a burst that grows the heap is
// collected at most gcHeadroom later than with the final percentage.
type gcTuner struct {
	samples []metrics.Sample
	percent int
}

// gcSentinel is garbage as soon as it is armed; its finalizer marks the end of a cycle.
// It holds a pointer so that it is never batched by the tiny allocator (whose blocks
// may live on, and then the finalizer would never run).
type gcSentinel struct{ t *gcTuner }

func (t *gcTuner) arm() {
	runtime.SetFinalizer(&gcSentinel{t: t}, func(s *gcSentinel) {
		s.t.adjust()
		s.t.arm()
	})
}

func (t *gcTuner) adjust() {
	metrics.Read(t.samples)
	var base uint64
	for _, s := range t.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			base += s.Value.Uint64()
		}
	}
	p := gcPercentMax
	if base > 0 {
		p = int(min(uint64(gcPercentMax), max(uint64(gcPercentMin), gcHeadroom*100/base)))
	}
	if p != t.percent {
		t.percent = p
		debug.SetGCPercent(p)
	}
}
