package main

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// refusingAddr returns a loopback address that refuses connections: a socket bound there
// without listen() holds the port (no one else gets it) and the kernel answers a connect
// with a reset. It is closed at cleanup.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
}

// upstreamVerdict is GET /upstream's answer, as the launcher reads it.
type upstreamVerdict struct {
	Checked     bool     `json:"checked"`
	OK          bool     `json:"ok"`
	Error       *string  `json:"error"`
	Seconds     *float64 `json:"seconds"`
	Up          bool     `json:"up"`
	LastError   *string  `json:"last_error"`
	LastErrorAt *string  `json:"last_error_at"`
}

// waitVerdict polls GET /upstream until the first check has a verdict (deadline 5 s).
func waitVerdict(t *testing.T, p *sidecarProc) upstreamVerdict {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + p.info.Metrics + "/upstream")
		if err != nil {
			t.Fatalf("GET /upstream: got %v; want an answer", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("GET /upstream: got %d %q (%s); want 200 JSON", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		var v upstreamVerdict
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("GET /upstream: got %q; want JSON: %v", body, err)
		}
		if v.Checked {
			return v
		}
		if v.OK || v.Error != nil || v.Seconds != nil {
			t.Fatalf("before the check: got %s; want ok false, error and seconds null", body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /upstream: got no verdict after 5 s; want one; stderr: %s", p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUpstreamVerdictIsReadableWithoutTheLog: the start-up check's verdict and the last
// upstream error are in GET /upstream, in the error's own words, and those words never
// reach /metrics (no error text as a label value).
func TestUpstreamVerdictIsReadableWithoutTheLog(t *testing.T) {
	good := newH2Origin(t, http.HandlerFunc(echoHandler))
	h1 := httptest.NewUnstartedServer(http.HandlerFunc(echoHandler))
	h1.Config.ErrorLog = log.New(io.Discard, "", 0)
	h1.StartTLS()
	t.Cleanup(h1.Close)
	cases := []struct {
		name, words string // words: "" for ok
		args        []string
	}{
		{"ok", "", []string{"-upstream", good.URL, "-ca-file", caFileOf(t, good)}},
		{"refusing port", "connect: connection refused", []string{"-upstream", "https://" + refusingAddr(t)}},
		{"wrong CA", "x509: certificate signed by unknown authority", []string{"-upstream", good.URL}},
		{"no h2", "does not speak HTTP/2", []string{"-upstream", h1.URL, "-ca-file", caFileOf(t, h1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := runSidecar(t, append(tc.args, "-metrics-listen", "127.0.0.1:0")...)
			v := waitVerdict(t, p)
			if v.Seconds == nil || *v.Seconds <= 0 || *v.Seconds > 5 {
				t.Fatalf("seconds: got %v; want the dial's time", v.Seconds)
			}
			if tc.words == "" {
				if !v.OK || v.Error != nil || !v.Up || v.LastError != nil {
					t.Fatalf("got %+v; want ok, up, no error", v)
				}
				return
			}
			if v.OK || v.Up || v.Error == nil || !strings.Contains(*v.Error, tc.words) {
				t.Fatalf("got ok %v up %v error %v; want a failure naming %q", v.OK, v.Up, v.Error, tc.words)
			}
			if v.LastError == nil || *v.LastError != *v.Error || v.LastErrorAt == nil {
				t.Fatalf("last_error: got %v at %v; want the check's error with its time", v.LastError, v.LastErrorAt)
			}
			if strings.Contains(*v.Error, "\n") {
				t.Fatalf("error: got %q; want one line", *v.Error)
			}
			resp, err := http.Get("http://" + p.info.Metrics + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), tc.words) {
				t.Fatalf("/metrics: got the error text %q in it; want it only in /upstream", tc.words)
			}
		})
	}
}

// TestRequestDurationHistogram: each answered request lands in the bucket of its time;
// buckets are cumulative up to 3600 s and +Inf, with _sum and _count.
func TestRequestDurationHistogram(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond) // the upstream's own slowness
		io.WriteString(w, "ok")
	}))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-metrics-listen", "127.0.0.1:0")
	for _, ms := range []int{0, 0, 300} {
		resp, err := http.Get(p.url() + "/?ms=" + strconv.Itoa(ms))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	m := waitMetrics(t, p, "3 answered", func(m map[string]float64) bool {
		return m["h2ping_request_duration_seconds_count"] == 3
	})
	bucket := func(le string) float64 { return m[`h2ping_request_duration_seconds_bucket{le="`+le+`"}`] }
	prev := 0.0
	for _, b := range durationBuckets {
		le := strconv.FormatFloat(b, 'g', -1, 64)
		if bucket(le) < prev {
			t.Fatalf("bucket le=%s: got %v after %v; want cumulative counts", le, bucket(le), prev)
		}
		prev = bucket(le)
	}
	if bucket("3600") != 3 || bucket("+Inf") != 3 {
		t.Fatalf("le=3600, +Inf: got %v, %v; want 3, 3", bucket("3600"), bucket("+Inf"))
	}
	if bucket("0.25") > 2 {
		t.Fatalf("le=0.25: got %v; want the 300 ms request above it", bucket("0.25"))
	}
	if sum := m["h2ping_request_duration_seconds_sum"]; sum < 0.3 || sum > 10 {
		t.Fatalf("sum: got %v; want at least the 0.3 s one waited", sum)
	}
}

// TestProcessAndRuntimeSeries: the Go client's process and runtime names, with values a
// running sidecar can have, and the build info.
func TestProcessAndRuntimeSeries(t *testing.T) {
	before := float64(time.Now().Unix())
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-metrics-listen", "127.0.0.1:0")
	m := scrape(t, p)
	now := float64(time.Now().Unix())
	checks := []struct {
		name     string
		low, top float64
	}{
		{"process_resident_memory_bytes", 1 << 20, 1 << 30},
		{"process_virtual_memory_bytes", 1 << 20, 1 << 50},
		{"process_cpu_seconds_total", 0, 60},
		{"process_start_time_seconds", before - 2, now + 1},
		{"process_open_fds", 4, 1 << 20},
		{"process_max_fds", 64, 1 << 40},
		{"go_goroutines", 2, 1000},
		{"go_memstats_alloc_bytes", 1, 1 << 30},
		{"go_memstats_sys_bytes", 1 << 20, 1 << 32},
	}
	for _, c := range checks {
		v, ok := m[c.name]
		if !ok || v < c.low || v > c.top {
			t.Errorf("%s: got %v (present %v); want between %v and %v", c.name, v, ok, c.low, c.top)
		}
	}
	found := false
	for k, v := range m {
		if strings.HasPrefix(k, "h2ping_build_info{") {
			found = v == 1 && strings.Contains(k, `goversion="`+runtime.Version()+`"`) && strings.Contains(k, `version="`)
		}
	}
	if !found {
		t.Errorf("h2ping_build_info: got none with goversion %q and value 1; want one", runtime.Version())
	}
}

func TestEscapeLabel(t *testing.T) {
	if got := escapeLabel("a\\b\"c\nd"); got != `a\\b\"c\nd` {
		t.Fatalf("got %q; want %q", got, `a\\b\"c\nd`)
	}
}
