package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readTraffic parses the traffic file strictly (unknown fields refused, the histogram
// shapes checked).
func readTraffic(t *testing.T, path string) (trafficRecord, error) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		return trafficRecord{}, err
	}
	var r trafficRecord
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("traffic file %q: got %v; want one complete JSON record", data, err)
	}
	for _, h := range []histogramRecord{r.TTFB, r.Duration} {
		var n uint64
		for _, c := range h.Counts {
			n += c
		}
		if len(h.Counts) != len(h.Bounds)+1 || n != h.Count || len(h.Bounds) != len(durationBuckets) {
			t.Fatalf("histogram %+v: got %d counts for %d bounds summing to %d; want bounds+1 summing to count", h, len(h.Counts), len(h.Bounds), n)
		}
	}
	return r, nil
}

// waitTraffic reads the file until cond holds (deadline 10 s).
func waitTraffic(t *testing.T, path, what string, cond func(trafficRecord) bool) trafficRecord {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := readTraffic(t, path)
		if err == nil && cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s in %s: got timeout; last %+v, %v", what, path, r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// statusOrigin answers ?code=N with N after ?ms=M milliseconds.
func statusOrigin(t *testing.T) (url, caFile string) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(ms) * time.Millisecond)
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		if code == 0 {
			code = 200
		}
		w.WriteHeader(code)
		io.WriteString(w, "body")
	}))
	return origin.URL, caFileOf(t, origin)
}

// TestE2ETrafficFileIsTheMetricsAndFinalAfterSIGTERM: the record carries the very figures
// /metrics shows, is rewritten every interval, and after a SIGTERM drain holds final=true
// with the exact counts, TTFB and duration histograms and the longest duration.
func TestE2ETrafficFileIsTheMetricsAndFinalAfterSIGTERM(t *testing.T) {
	url, ca := statusOrigin(t)
	path := filepath.Join(t.TempDir(), "h2ping-a-host-run.traffic.json")
	p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-metrics-listen", "127.0.0.1:0",
		"-traffic-file", path, "-traffic-interval", "100ms")
	first := waitTraffic(t, path, "the first record", func(r trafficRecord) bool { return true })
	if first.Version != trafficVersion || first.PID != p.cmd.Process.Pid || first.Final || first.Requests != 0 {
		t.Fatalf("first record: got %+v; want version %d, our pid, not final, 0 requests", first, trafficVersion)
	}
	for _, q := range []string{"?ms=300", "?code=404", "?code=503", "", "?code=302"} {
		if code, _ := get(t, p.url()+"/x"+q); code == 0 {
			t.Fatalf("request %s: got no response", q)
		}
	}
	m := waitMetrics(t, p, "5 answered", func(m map[string]float64) bool { return m["h2ping_request_duration_seconds_count"] == 5 })
	r := waitTraffic(t, path, "a record with the 5 requests", func(r trafficRecord) bool { return r.Duration.Count == 5 })
	if r.Final || float64(r.Requests) != m["h2ping_requests_total"] || r.Responses2xx != 2 || r.Responses4xx != 1 ||
		r.Responses5xx != 1 || r.Responses502 != 0 || r.ResponsesOther != 1 {
		t.Fatalf("record %+v; want not final, requests as /metrics (%v), 2xx 2, 4xx 1, 5xx 1, 502 0, other 1", r, m["h2ping_requests_total"])
	}
	if r.DurationMaxSecs < 0.3 || r.DurationMaxSecs > 5 || float64(r.DurationMaxSecs) != m["h2ping_request_duration_max_seconds"] {
		t.Fatalf("duration_max_s: got %v (metrics %v); want the 0.3 s request's, the same as /metrics", r.DurationMaxSecs, m["h2ping_request_duration_max_seconds"])
	}
	if r.TTFB.Count != 5 || r.TTFB.Sum < 0.3 || r.TTFB.Sum > r.Duration.Sum {
		t.Fatalf("ttfb: got %+v (duration sum %v); want 5, at least the 0.3 s wait, no more than the durations", r.TTFB, r.Duration.Sum)
	}
	started, err1 := time.Parse(rfc3339Milli, r.StartedAt)
	asOf, err2 := time.Parse(rfc3339Milli, r.AsOf)
	if err1 != nil || err2 != nil || asOf.Before(started) || time.Since(asOf) > 10*time.Second {
		t.Fatalf("started_at %q, as_of %q: want RFC 3339 UTC ms times, as_of after the start and recent", r.StartedAt, r.AsOf)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
	final, err := readTraffic(t, path)
	if err != nil || !final.Final || final.Requests != 5 || final.Duration.Count != 5 || final.Responses2xx != 2 || final.UpstreamErrors["dial"] != 0 {
		t.Fatalf("after SIGTERM: got %+v, %v; want final with the exact counts", final, err)
	}
	if len(final.UpstreamErrors) != int(numKinds) {
		t.Fatalf("upstream_errors: got %v; want every kind", final.UpstreamErrors)
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp-*"))
	if len(leftovers) != 0 {
		t.Fatalf("temp files: got %v; want none after a clean exit", leftovers)
	}
}

// TestE2ETrafficFileSurvivesSIGKILL: a proxy killed while rewriting every 5 ms leaves the
// last complete record, never a part of one.
func TestE2ETrafficFileSurvivesSIGKILL(t *testing.T) {
	url, ca := statusOrigin(t)
	for i := range 5 {
		path := filepath.Join(t.TempDir(), "traffic.json")
		p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-traffic-file", path, "-traffic-interval", "5ms")
		get(t, p.url()+"/one")
		waitTraffic(t, path, "the request", func(r trafficRecord) bool { return r.Requests == 1 })
		time.Sleep(time.Duration(i) * 3 * time.Millisecond) // vary where in a write the kill lands
		p.cmd.Process.Kill()
		p.waitExit(t, 5*time.Second)
		r, err := readTraffic(t, path)
		if err != nil || r.Final || r.Requests != 1 || r.PID != p.cmd.Process.Pid {
			t.Fatalf("after SIGKILL: got %+v, %v; want the last complete record, not final", r, err)
		}
	}
	// A temp file a kill left behind is removed by the next process on the same path.
	dir := t.TempDir()
	path := filepath.Join(dir, "t[1].json")
	stale := filepath.Join(dir, ".t[1].json.tmp-123")
	other := filepath.Join(dir, ".t1.json.tmp-123")
	os.WriteFile(stale, []byte("{"), 0o644)
	os.WriteFile(other, []byte("{"), 0o644)
	runSidecar(t, "-upstream", url, "-ca-file", ca, "-traffic-file", path)
	waitTraffic(t, path, "the first record", func(trafficRecord) bool { return true })
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale temp file: got %v; want it removed", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another file's temp: got %v; want it left alone", err)
	}
}

// TestE2ETrafficFileWriteFailureKeepsServing: with the folder removed (and, for a user
// that permissions bind, made read-only) the proxy logs once that the figures are stale,
// keeps serving, and writes again once the folder is back.
func TestE2ETrafficFileWriteFailureKeepsServing(t *testing.T) {
	url, ca := statusOrigin(t)
	dir := filepath.Join(t.TempDir(), "logs")
	os.Mkdir(dir, 0o755)
	path := filepath.Join(dir, "traffic.json")
	p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-traffic-file", path, "-traffic-interval", "20ms")
	waitTraffic(t, path, "the first record", func(r trafficRecord) bool { return true })
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stale line", 5*time.Second, func() bool { return strings.Contains(p.stderr.String(), "figures are stale") })
	for range 3 {
		if code, _ := get(t, p.url()+"/still"); code != 200 {
			t.Fatalf("request with the folder gone: got %d; want 200", code)
		}
	}
	if n := strings.Count(p.stderr.String(), "traffic figures not written"); n != 1 {
		t.Fatalf("stale lines: got %d; want 1 for the whole failure: %s", n, p.stderr)
	}
	os.Mkdir(dir, 0o755)
	waitTraffic(t, path, "the record written again", func(r trafficRecord) bool { return r.Requests == 3 })
	waitFor(t, "the recovery line", 5*time.Second, func() bool { return strings.Contains(p.stderr.String(), "written to "+path+" again") })
}

// TestE2ETrafficFileInAReadOnlyFolder: a folder the proxy cannot write is no reason to
// refuse to start or to stop serving. Root ignores permissions, so for root the folder is
// /proc, which no one can create files in.
func TestE2ETrafficFileInAReadOnlyFolder(t *testing.T) {
	url, ca := statusOrigin(t)
	dir := "/proc"
	if os.Geteuid() != 0 {
		dir = t.TempDir()
		os.Chmod(dir, 0o555)
		t.Cleanup(func() { os.Chmod(dir, 0o755) })
	}
	p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-traffic-file", filepath.Join(dir, "traffic.json"), "-traffic-interval", "20ms")
	if code, _ := get(t, p.url()+"/serves"); code != 200 {
		t.Fatalf("request: got %d; want 200", code)
	}
	waitFor(t, "the stale line", 5*time.Second, func() bool { return strings.Contains(p.stderr.String(), "figures are stale") })
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
}

// TestE2ETrafficFileFinalAfterOwnerExit: the -exit-with-pid drain writes the final record.
func TestE2ETrafficFileFinalAfterOwnerExit(t *testing.T) {
	url, ca := statusOrigin(t)
	owner := exec.Command("sleep", "60")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Process.Kill(); owner.Wait() })
	path := filepath.Join(t.TempDir(), "traffic.json")
	p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-traffic-file", path, "-traffic-interval", "1h",
		"-exit-with-pid", fmt.Sprint(owner.Process.Pid))
	get(t, p.url()+"/a")
	get(t, p.url()+"/b")
	owner.Process.Kill()
	owner.Wait()
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
	r, err := readTraffic(t, path)
	if err != nil || !r.Final || r.Requests != 2 || r.Responses2xx != 2 {
		t.Fatalf("after the owner exited: got %+v, %v; want final with 2 requests", r, err)
	}
}

// TestTimeToFirstByteHistogram: TTFB is the wait for the upstream's response head, apart
// from the body's time; a 150 ms head wait lands above le=0.1 (buckets fine enough to tell
// 5 ms from 50 ms); a 502 has no TTFB; the longest duration is exact. Only lower bounds
// on waits are asserted: a loaded machine makes anything slower, never faster.
func TestTimeToFirstByteHistogram(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		head, _ := strconv.Atoi(r.URL.Query().Get("head"))
		body, _ := strconv.Atoi(r.URL.Query().Get("body"))
		time.Sleep(time.Duration(head) * time.Millisecond)
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(time.Duration(body) * time.Millisecond)
		io.WriteString(w, "done")
	}))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-metrics-listen", "127.0.0.1:0")
	for _, q := range []string{"head=0&body=0", "head=150&body=0", "head=0&body=300"} {
		get(t, p.url()+"/?"+q)
	}
	m := waitMetrics(t, p, "3 answered", func(m map[string]float64) bool {
		return m["h2ping_request_duration_seconds_count"] == 3 && m["h2ping_time_to_first_byte_seconds_count"] == 3
	})
	ttfb := func(le string) float64 { return m[`h2ping_time_to_first_byte_seconds_bucket{le="`+le+`"}`] }
	dur := func(le string) float64 { return m[`h2ping_request_duration_seconds_bucket{le="`+le+`"}`] }
	if ttfb("0.005") > ttfb("0.05") || ttfb("0.1") > 2 || ttfb("3600") != 3 || ttfb("+Inf") != 3 {
		t.Fatalf("ttfb buckets 0.005 %v, 0.05 %v, 0.1 %v, 3600 %v, +Inf %v; want cumulative, the 150 ms wait above 0.1, all 3 by 3600",
			ttfb("0.005"), ttfb("0.05"), ttfb("0.1"), ttfb("3600"), ttfb("+Inf"))
	}
	if dur("0.25") > 2 || dur("+Inf") != 3 {
		t.Fatalf("duration buckets 0.25 %v, +Inf %v; want the 300 ms body above 0.25", dur("0.25"), dur("+Inf"))
	}
	// Each duration holds its TTFB; the 300 ms body is in the durations only (less what
	// the head's trip took beyond the body's: 50 ms of margin).
	ttfbSum, durSum := m["h2ping_time_to_first_byte_seconds_sum"], m["h2ping_request_duration_seconds_sum"]
	if ttfbSum < 0.15 || durSum-ttfbSum < 0.25 {
		t.Fatalf("sums: ttfb %v, duration %v; want ttfb >= 0.15 and the durations about 0.3 s more", ttfbSum, durSum)
	}
	if mx := m["h2ping_request_duration_max_seconds"]; mx < 0.3 || mx > durSum {
		t.Fatalf("max: got %v; want the 300 ms request's duration, within the sum %v", mx, durSum)
	}
	origin.Close()
	if code, _ := get(t, p.url()+"/?head=0"); code != http.StatusBadGateway {
		t.Fatalf("request to a closed origin: got %d; want 502", code)
	}
	m = waitMetrics(t, p, "the 502 answered", func(m map[string]float64) bool { return m["h2ping_request_duration_seconds_count"] == 4 })
	if m["h2ping_time_to_first_byte_seconds_count"] != 3 {
		t.Fatalf("ttfb count after a 502: got %v; want 3 (no upstream head came)", m["h2ping_time_to_first_byte_seconds_count"])
	}
}

// TestE2ETrafficFileFinalCountsARequestCutOff: a drain cut short (-shutdown-grace 0) ends
// the request in flight; the final record still counts how it ended (every request
// received is answered or abandoned), and the access log has its line.
func TestE2ETrafficFileFinalCountsARequestCutOff(t *testing.T) {
	arrived := make(chan struct{}, 1)
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	dir := t.TempDir()
	path, access := filepath.Join(dir, "traffic.json"), filepath.Join(dir, "access.log")
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-traffic-file", path,
		"-access-log", access, "-shutdown-grace", "0s")
	go func() {
		if resp, err := http.Get(p.url() + "/cut"); err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
	r, err := readTraffic(t, path)
	answered := r.Responses2xx + r.Responses4xx + r.Responses5xx + r.ResponsesOther
	if err != nil || !r.Final || r.Requests != 1 || answered+r.ClientGone != 1 {
		t.Fatalf("final record %+v, %v; want 1 request, answered or abandoned", r, err)
	}
	if lines := readAccessLog(t, access); len(lines) != 1 || lines[0].Path != "/cut" {
		t.Fatalf("access log: got %+v; want the cut request's line", lines)
	}
}
