package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// Runtime defaults for this proxy's load, measured with bench/proxy.py on a 2-core machine
// (bench/results/proxy.md, proxy-tuning.md). Each applies only when the environment does
// not set the knob itself: the launcher's gomaxprocs/gomemlimit config (GOMAXPROCS,
// GOMEMLIMIT) and a user's GOGC always win.

// defaultProcs is GOMAXPROCS when the environment does not set it. The proxy's work per
// request is short parsing between network waits, so with more than one P most of its CPU
// went to handing goroutines between Ps: futex wake-ups, spinning threads and their
// sleeps (strace at c=16: 1.8 nanosleep and 0.8 futex calls per request). In one
// bench/proxy.py run at c=16, the same build with 2 Ps vs 1 P: 0.48x vs 0.64x HAProxy's
// requests/s and 3.1x vs 2.2x its CPU per request. One core carries far more requests than
// an LLM endpoint sees.
const defaultProcs = 1

// GC headroom: the collector may let the heap grow by gcHeadroom before the next cycle
// (GOGC = gcHeadroom / (live heap + stacks + globals)), clamped to [gcPercentMin,
// gcPercentMax]. A small heap (a proxy at c=16 has under 1 MB live) gets 4x the runtime's
// 4 MB minimum instead of a cycle every 4 MB; a large one (thousands of waiting requests,
// their stacks counted in the base) is collected at 50 % growth instead of 100 %.
//
// Why it is kept (paired bench/proxy.py run, builds alternated, bench/results/proxy.md):
// without it, 10,000 concurrent waits peaked at 473 MiB RSS instead of 412 (+15 %), and
// c=16 served 0.91x the requests/s at 1.13x the CPU per request (medians).
const (
	gcHeadroom   = 16 << 20
	gcPercentMin = 50
	gcPercentMax = 400
)

// limitProcs applies defaultProcs; getenv is os.Getenv outside tests. main calls it first
// thing, before any goroutine of its own exists: while the runtime has an idle P, each new
// goroutine (the signal watcher, the accept loop) wakes it, which costs a thread and futex
// wake-ups while the proxies of a run start together on the same cores.
func limitProcs(getenv func(string) string) {
	if getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(defaultProcs)
	}
}

// tuneGC arms the GC tuner unless GOGC is set; getenv is os.Getenv outside tests. It starts
// at gcPercentMax, which is what adjust computes for any live size under gcHeadroom /
// gcPercentMax (4 MB), as at every start: the first metrics.Read (which builds the
// runtime's table of metrics) then happens at the first GC, not while a run's proxies are
// still starting.
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
