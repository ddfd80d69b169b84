package main

// procmetrics.go owns the parts of GET /metrics that are not the proxy's own counters: the
// request-duration histogram, h2ping_build_info, and the process and runtime series under
// the names the Prometheus Go client gives them (process_resident_memory_bytes,
// process_cpu_seconds_total, process_open_fds, process_start_time_seconds, go_goroutines,
// a few go_memstats_*), so dashboards built for any Go service work unchanged. It also
// owns GET /upstream, the start-up check's verdict and the last upstream error as JSON.
//
// The process series are read from /proc at scrape time, as the Go client's procfs does
// (the module proxy is unreachable and the standard library suffices); where /proc cannot
// be read (not Linux) they are left out rather than reported as zeros.
//
// Must not: put an error text, a path or anything about a request into a label value (the
// label values here are the build's own words), or cost the request path anything beyond
// the histogram's two atomic adds.

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// durationBuckets are the upper bounds of h2ping_request_duration_seconds: from a fast
// answer to the hour a slow upstream may take, which is what the sidecar exists for.
var durationBuckets = [...]float64{
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600,
}

// histogram counts observations per bucket (not cumulative: one add per observation;
// the scrape sums them up) plus +Inf, and their sum in nanoseconds (an integer add, no
// compare-and-swap loop on a float).
type histogram struct {
	counts   [len(durationBuckets) + 1]atomic.Uint64
	sumNanos atomic.Uint64
}

func (h *histogram) observe(d time.Duration) {
	if d < 0 {
		d = 0
	}
	// The first bound >= d (Prometheus buckets are "less than or equal"), by a binary
	// search written out: sort.Search's closure call per step doubled the cost.
	v := d.Seconds()
	lo, hi := 0, len(durationBuckets)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if durationBuckets[mid] < v {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	h.counts[lo].Add(1)
	h.sumNanos.Add(uint64(d))
}

// appendText writes the histogram family: cumulative _bucket samples, _sum and _count. A
// scrape racing an observation may see a count one ahead of the sum; Prometheus tolerates
// that, as it does for the Go client's own histograms.
func (h *histogram) appendText(b []byte, name, help string) []byte {
	b = head(b, name, help, "histogram")
	var cum uint64
	for i := range h.counts {
		cum += h.counts[i].Load()
		le := "+Inf"
		if i < len(durationBuckets) {
			le = strconv.FormatFloat(durationBuckets[i], 'g', -1, 64)
		}
		b = sample(b, name+"_bucket", "le", le, cum)
	}
	b = append(b, name...)
	b = append(b, "_sum "...)
	b = strconv.AppendFloat(b, float64(h.sumNanos.Load())/1e9, 'g', -1, 64)
	b = append(b, '\n')
	b = append(b, name...)
	b = append(b, "_count "...)
	b = strconv.AppendUint(b, cum, 10)
	return append(b, '\n')
}

// version is the sidecar's version, set with -ldflags "-X main.version=..."; empty, the
// module version the build recorded is used ("(devel)" for a build from a source tree).
var version string

// buildInfoSample is h2ping_build_info's one sample, fixed at start.
var buildInfoSample = func() []byte {
	v := version
	if v == "" {
		v = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			v = bi.Main.Version
		}
	}
	return []byte(`h2ping_build_info{version="` + escapeLabel(v) + `",goversion="` +
		escapeLabel(runtime.Version()) + "\"} 1\n")
}()

// escapeLabel escapes a label value as the text format requires (\\, \" and \n).
func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// userHZ is the unit of /proc/self/stat's CPU times: USER_HZ, 100 on every Linux the Go
// client's procfs supports (it assumes the same; sysconf needs cgo).
const userHZ = 100

// bootTime is /proc/stat's btime (seconds since the epoch), read once: it does not change.
var bootTime = sync.OnceValue(func() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if n, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return n
			}
		}
	}
	return -1
})

// procStat is what /proc/self/stat says about this process.
type procStat struct {
	cpuSeconds, startTime float64
	rssBytes, vsizeBytes  float64
}

// readProcStat parses /proc/self/stat (proc(5)). The command name, in parentheses, may hold
// spaces or parentheses itself, so fields are counted from the last ')'.
func readProcStat() (procStat, bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	// f[0] is field 3 (state), so field n is f[n-3].
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return procStat{}, false
	}
	num := func(n int) float64 {
		v, _ := strconv.ParseFloat(f[n-3], 64)
		return v
	}
	s := procStat{
		cpuSeconds: (num(14) + num(15)) / userHZ,
		vsizeBytes: num(23),
		rssBytes:   num(24) * float64(os.Getpagesize()),
		startTime:  -1,
	}
	if bt := bootTime(); bt >= 0 {
		s.startTime = bt + num(22)/userHZ
	}
	return s, true
}

// openFDs counts /proc/self/fd as the Go client does (the directory's own descriptor
// included).
func openFDs() (int, bool) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	return len(names), err == nil
}

// appendProcessText appends the process and runtime series. runtime.ReadMemStats stops
// the world for microseconds, once per scrape (seconds apart), never on the request path.
func appendProcessText(b []byte) []byte {
	if s, ok := readProcStat(); ok {
		b = counterFloat(b, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", s.cpuSeconds)
		b = gauge(b, "process_resident_memory_bytes", "Resident memory size in bytes.", s.rssBytes)
		b = gauge(b, "process_virtual_memory_bytes", "Virtual memory size in bytes.", s.vsizeBytes)
		if s.startTime >= 0 {
			b = gauge(b, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", s.startTime)
		}
	}
	if n, ok := openFDs(); ok {
		b = gauge(b, "process_open_fds", "Number of open file descriptors.", float64(n))
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < math.MaxInt64 {
		b = gauge(b, "process_max_fds", "Maximum number of open file descriptors.", float64(lim.Cur))
	}
	b = gauge(b, "go_goroutines", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b = gauge(b, "go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use.", float64(ms.HeapAlloc))
	b = gauge(b, "go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use.", float64(ms.HeapInuse))
	b = gauge(b, "go_memstats_sys_bytes", "Number of bytes obtained from system.", float64(ms.Sys))
	b = gauge(b, "go_memstats_next_gc_bytes", "Number of heap bytes when next garbage collection will take place.", float64(ms.NextGC))
	return b
}

func counterFloat(b []byte, name, help string, v float64) []byte {
	b = head(b, name, help, "counter")
	b = append(b, name...)
	b = append(b, ' ')
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	return append(b, '\n')
}

// upstreamStatus is GET /upstream's answer. Checked is false until the first upstream
// dial ends (the start-up check's, or a request's that came first); then OK, Error (the
// error's own words, one line) and Seconds (how long that dial took) are its verdict. Up
// is h2ping_upstream_up now; LastError the latest upstream failure's text (null before
// the first), kept after the upstream recovers so an operator can see what it was.
//
// Ping is the check's PING on the first connection (upcheck.go): null until it is sent
// (a dial that failed sends none), then "pending", and finally "answered" (PingRTT is its
// round trip), "unanswered", "goaway" or "closed", with PingError in its own words, the
// remedy included. A check has passed when OK and Ping is "answered".
type upstreamStatus struct {
	Checked     bool     `json:"checked"`
	OK          bool     `json:"ok"`
	Error       *string  `json:"error"`
	Seconds     *float64 `json:"seconds"`
	Ping        *string  `json:"ping"`
	PingRTT     *float64 `json:"ping_rtt_seconds"`
	PingError   *string  `json:"ping_error"`
	Up          bool     `json:"up"`
	LastError   *string  `json:"last_error"`
	LastErrorAt *string  `json:"last_error_at"`
}

// maxUpstreamWait bounds GET /upstream?wait=D: a caller that wants longer asks again.
const maxUpstreamWait = 10 * time.Second

// serveUpstream is GET /upstream[?wait=D]. Whoever asks for the verdict is waiting for it:
// the check starts now if its timer has not yet (upcheck.go). With wait (a Go duration, at
// most maxUpstreamWait) the answer waits until the check has ended or D has passed, so a
// launcher learns the verdict the moment it is known instead of at its next poll (a poll
// every 25 ms cost a start 12 ms on average once the check also awaited its PING).
func serveUpstream(w http.ResponseWriter, r *http.Request) {
	if c := stats.check.Load(); c != nil {
		c.run()
		if d, err := time.ParseDuration(r.URL.Query().Get("wait")); err == nil && d > 0 {
			t := time.NewTimer(min(d, maxUpstreamWait))
			select {
			case <-c.done:
			case <-t.C:
			case <-r.Context().Done():
			}
			t.Stop()
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(stats.upstreamJSON())
}

func (m *meters) upstreamJSON() []byte {
	s := upstreamStatus{Up: m.upstreamUp.Load()}
	if v := m.firstCheck.Load(); v != nil {
		s.Checked, s.OK, s.Seconds = true, v.ok, &v.seconds
		if !v.ok {
			s.Error = &v.err
		}
	}
	if c := m.check.Load(); c != nil && c.ping != nil {
		if state, v := c.ping.state(); state != "" {
			s.Ping = &state
			if v != nil && v.state == pingAnswered {
				s.PingRTT = &v.rtt
			} else if v != nil {
				s.PingError = &v.words
			}
		}
	}
	if n := m.lastErr.Load(); n != nil {
		at := n.at.UTC().Format(time.RFC3339Nano)
		s.LastError, s.LastErrorAt = &n.text, &at
	}
	b, _ := json.Marshal(s) // strings, bools and floats: cannot fail
	return append(b, '\n')
}
