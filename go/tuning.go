package main

import (
	"runtime"
	"runtime/debug"
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

// gcPercent is GOGC when the environment does not set it. A node's heaviest load is
// thousands of requests waiting minutes for a first byte: the heap is then their
// goroutine stacks and net/http's per-connection buffers, and the runtime's 100 lets the
// peak grow past what such a node is promised. Kept for that user-felt figure, peak RSS at
// 10,000 waits under 500 MiB (bench/proxy.py --phases paired, issue 27): with 50, 405 MiB
// (median of 5 runs, 393-429); with the runtime's default, 488 (7 runs, 423-510, 3 of them
// over 500). Its cost: at 16 and 128 connections the live heap is 0-2 MB and the runtime's
// minimum goal (4 MB x GOGC/100) sets the pace, about 120 collections a second, 5 % / 14 %
// of the time (gctrace). A higher GOGC buys that back only with peak RSS, the figure issue
// 38 keeps: 80 gave 0.96x / 0.88x the CPU per request for 1.10x / 1.05x the peak RSS, 100
// 0.97x / 0.81x for 1.15x / 1.11x (bench/cpu_compare.py, 2026-12-08). (A finalizer-driven
// tuner that re-derived GOGC after every cycle gave 414 MiB at 10,000 waits, at twice the
// RSS under throughput: no figure a user feels.)
const gcPercent = 50

// limitProcs applies defaultProcs; getenv is os.Getenv outside tests. main calls it first
// thing, before any goroutine of its own exists: while the runtime has an idle P, each new
// goroutine (the signal watcher, the accept loop) wakes it, which costs a thread and futex
// wake-ups while the proxies of a run start together on the same cores.
func limitProcs(getenv func(string) string) {
	if getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(defaultProcs)
	}
}

// tuneGC applies gcPercent unless GOGC is set; getenv is os.Getenv outside tests.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
