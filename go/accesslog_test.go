package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// accessLine is one access log line; pointers tell null from 0.
type accessLine struct {
	Time      string   `json:"time"`
	Method    string   `json:"method"`
	Path      string   `json:"path"`
	Status    int      `json:"status"`
	TTFB      *float64 `json:"ttfb_s"`
	Duration  float64  `json:"duration_s"`
	BytesIn   int64    `json:"bytes_in"`
	BytesOut  int64    `json:"bytes_out"`
	Retried   bool     `json:"retried"`
	Error     *string  `json:"error"`
	NVCFReqID *string  `json:"nvcf_reqid"`
	NVCFPolls int      `json:"nvcf_polls"`
	seenInRaw string
}

// readAccessLog parses every line of path strictly: each a complete JSON object with
// exactly the contract's fields.
func readAccessLog(t *testing.T, path string) []accessLine {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("access log: %v", err)
	}
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		t.Fatalf("access log %s: got %q at the end; want whole lines", path, data[max(0, len(data)-80):])
	}
	var lines []accessLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var l accessLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("access log line %q: got %v; want one JSON object of the contract's fields", sc.Text(), err)
		}
		var fields map[string]any
		json.Unmarshal(sc.Bytes(), &fields)
		if len(fields) != 12 {
			t.Fatalf("access log line %q: got %d fields; want the 12 of the contract", sc.Text(), len(fields))
		}
		if _, err := time.Parse(rfc3339Milli, l.Time); err != nil {
			t.Fatalf("time %q: got %v; want RFC 3339 UTC with ms", l.Time, err)
		}
		if l.NVCFReqID == nil && l.NVCFPolls != 0 {
			t.Fatalf("access log line %q: got nvcf_polls without nvcf_reqid; want both or neither", sc.Text())
		}
		l.seenInRaw = sc.Text()
		lines = append(lines, l)
	}
	return lines
}

// TestE2EAccessLogHasNoHeaderNoQuery: a request with an Authorization header and a query
// string, then a 502: each gets its line with the contract's fields, and neither the
// header value nor the query reaches the access log, the proxy's log or the traffic file.
func TestE2EAccessLogHasNoHeaderNoQuery(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		time.Sleep(60 * time.Millisecond)
		w.WriteHeader(201)
		w.(http.Flusher).Flush()
		time.Sleep(100 * time.Millisecond)
		io.WriteString(w, "created")
	}))
	dir := t.TempDir()
	access, logFile, traffic := filepath.Join(dir, "a.access.log"), filepath.Join(dir, "a.log"), filepath.Join(dir, "a.traffic.json")
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-access-log", access,
		"-log-file", logFile, "-traffic-file", traffic, "-traffic-interval", "50ms", "-metrics-listen", "127.0.0.1:0")
	const secret, query = "Bearer access-secret-7f3a", "api_key=query-secret-91bc"
	req, _ := http.NewRequest("POST", p.url()+"/v1/chat%3Fnot-a-query?"+query, strings.NewReader("hello body"))
	req.Header.Set("Authorization", secret)
	req.Header.Set("X-Api-Key", "header-secret-22de")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	origin.Close() // the next request fails to dial: a 502 and a log line
	waitMetrics(t, p, "the closed connection gone", func(m map[string]float64) bool { return m["h2ping_upstream_connections"] == 0 })
	req, _ = http.NewRequest("GET", p.url()+"/fails?"+query, nil)
	req.Header.Set("Authorization", secret)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
	lines := readAccessLog(t, access)
	if len(lines) != 2 {
		t.Fatalf("access log: got %d lines %+v; want 2", len(lines), lines)
	}
	ok, failed := lines[0], lines[1]
	if ok.Method != "POST" || ok.Path != "/v1/chat%3Fnot-a-query" || ok.Status != 201 || ok.BytesIn != 10 ||
		ok.BytesOut != int64(len(body)) || ok.Retried || ok.Error != nil || ok.TTFB == nil {
		t.Fatalf("first line %s; want POST, the escaped path, 201, 10 bytes in, %d out, not retried, no error, a ttfb", ok.seenInRaw, len(body))
	}
	if *ok.TTFB < 0.06 || *ok.TTFB > ok.Duration || ok.Duration < 0.16 {
		t.Fatalf("first line ttfb %v, duration %v; want the 60 ms head wait, within the 160 ms duration", *ok.TTFB, ok.Duration)
	}
	if failed.Status != 502 || failed.Error == nil || *failed.Error != "dial" || failed.TTFB != nil || failed.Path != "/fails" {
		t.Fatalf("second line %s; want 502 with error \"dial\" and no ttfb", failed.seenInRaw)
	}
	for _, f := range []string{access, logFile, traffic} {
		data, _ := os.ReadFile(f)
		for _, leak := range []string{"access-secret", "query-secret", "header-secret", "api_key"} {
			if bytes.Contains(data, []byte(leak)) {
				t.Fatalf("%s: got %q in it; want no header value and no query", f, leak)
			}
		}
	}
	if logs, _ := os.ReadFile(logFile); !bytes.Contains(logs, []byte("502")) || !bytes.Contains(logs, []byte("listening on")) {
		t.Fatalf("log file: got %q; want the start line and the 502 there", logs)
	}
}

// TestE2EAccessLogErrorKindsAndClientGone: a 502 carries its upstream failure kind (the
// same words as h2ping_upstream_errors_total), and a client that went away before any
// status gets status 0.
func TestE2EAccessLogErrorKindsAndClientGone(t *testing.T) {
	for _, tc := range []struct {
		kind  string
		reset bool
	}{{"ping_timeout", false}, {"reset", true}} {
		t.Run(tc.kind, func(t *testing.T) {
			url, ca := silentH2Origin(t, tc.reset)
			access := filepath.Join(t.TempDir(), "access.log")
			p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-ping-interval", "50ms", "-ping-timeout", "200ms", "-access-log", access,
				"-metrics-listen", "127.0.0.1:0")
			if code, _ := get(t, p.url()+"/hangs"); code != http.StatusBadGateway {
				t.Fatalf("request: got %d; want 502", code)
			}
			if !tc.reset {
				// A client that leaves while its request waits for the (silent) upstream.
				c, err := net.Dial("tcp", p.info.Listen)
				if err != nil {
					t.Fatal(err)
				}
				io.WriteString(c, "GET /left HTTP/1.1\r\nHost: x\r\n\r\n")
				waitMetrics(t, p, "/left in flight", func(m map[string]float64) bool { return m["h2ping_requests_in_flight"] == 1 })
				c.Close()
			}
			p.cmd.Process.Signal(syscall.SIGTERM)
			p.waitExit(t, 10*time.Second)
			lines := readAccessLog(t, access)
			if len(lines) < 1 || lines[0].Status != 502 || lines[0].Error == nil || *lines[0].Error != tc.kind {
				t.Fatalf("access log %+v; want the 502 first with error %q", lines, tc.kind)
			}
			if !tc.reset {
				if len(lines) != 2 || lines[1].Path != "/left" || lines[1].Status != 0 || lines[1].Error != nil {
					t.Fatalf("access log %+v; want /left with status 0 and no error", lines)
				}
			}
		})
	}
}

// TestE2EAccessLogRotates: at 4 KiB per file and 2 backups, 300 requests leave the access
// log, .1 and .2 only, each at most 4 KiB of whole lines, the newest lines in order.
func TestE2EAccessLogRotates(t *testing.T) {
	url, ca := statusOrigin(t)
	dir := t.TempDir()
	access := filepath.Join(dir, "x.access.log")
	p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-access-log", access, "-log-max-bytes", "4096", "-log-backups", "2")
	for i := range 300 {
		get(t, p.url()+"/n/"+strconv.Itoa(i))
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.waitExit(t, 10*time.Second)
	names, _ := filepath.Glob(filepath.Join(dir, "x.access.log*"))
	want := []string{access, access + ".1", access + ".2"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("files: got %v; want %v", names, want)
	}
	last := -1
	for _, name := range []string{access + ".2", access + ".1", access} {
		st, _ := os.Stat(name)
		if st.Size() > 4096 {
			t.Fatalf("%s: got %d bytes; want at most 4096", name, st.Size())
		}
		for _, l := range readAccessLog(t, name) {
			n, _ := strconv.Atoi(strings.TrimPrefix(l.Path, "/n/"))
			if last >= 0 && n != last+1 {
				t.Fatalf("%s: got request %d after %d; want the lines in order, none lost between files", name, n, last)
			}
			last = n
		}
	}
	if last != 299 {
		t.Fatalf("last line: got request %d; want 299", last)
	}
}

// TestE2EAccessLogOnAFullDisk: every write of the access log failing (ENOSPC: /dev/full,
// which is also never renamed) is logged once and never stops serving.
func TestE2EAccessLogOnAFullDisk(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	url, ca := statusOrigin(t)
	p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-access-log", "/dev/full", "-log-max-bytes", "100")
	for i := range 5 {
		if code, _ := get(t, p.url()+"/full"); code != 200 {
			t.Fatalf("request %d: got %d; want 200", i, code)
		}
		if i == 0 {
			waitFor(t, "the failure logged", 5*time.Second, func() bool { return strings.Contains(p.stderr.String(), "access log not written") })
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
	if n := strings.Count(p.stderr.String(), "access log not written"); n != 1 {
		t.Fatalf("failure lines: got %d; want 1: %s", n, p.stderr)
	}
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Fatalf("/dev/full: got %v; want it untouched", err)
	}
}

// BenchmarkAccessLog is what -access-log adds to a counted request (the line formatted and
// buffered; the file written by the flusher goroutine): compare with
// BenchmarkRequestCounting and the proxy's CPU per request in bench/results/traffic.md.
func BenchmarkAccessLog(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("ok"))
	})
	r, _ := http.NewRequest("POST", "http://x/v1/chat/completions?k=v", strings.NewReader("body"))
	body := r.Body // the server gives each request its own; track wraps it
	w := &nullWriter{h: http.Header{}}
	counted := &meters{}
	b.Run("counted", func(b *testing.B) {
		wrapped := counted.wrap(h)
		for b.Loop() {
			wrapped.ServeHTTP(w, r)
		}
	})
	b.Run("logged", func(b *testing.B) {
		rf, err := openRotating(filepath.Join(b.TempDir(), "a.log"), 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		logged := &meters{access: startAccessLog(rf, b.Logf)}
		wrapped := logged.wrap(h)
		for b.Loop() {
			r.Body = body
			wrapped.ServeHTTP(w, r)
		}
		logged.access.close()
	})
}

type nullWriter struct{ h http.Header }

func (w *nullWriter) Header() http.Header         { return w.h }
func (w *nullWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nullWriter) WriteHeader(int)             {}

func TestAppendSecondsIsAppendFloat(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 499, 1501, time.Millisecond, 123456789 * time.Nanosecond, time.Hour + 7*time.Microsecond} {
		got, want := string(appendSeconds(nil, d)), strconv.FormatFloat(d.Seconds(), 'f', 6, 64)
		if got != want {
			t.Errorf("appendSeconds(%v): got %q; want %q", d, got, want)
		}
	}
}

func TestAppendTimeMilliIsTheLayout(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2026, 12, 1, 20, 0, 0, 123456789, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 16, 59, 59, 999999999, time.FixedZone("x", -7*3600)),
		time.Date(2026, 6, 30, 23, 59, 59, 999999999, time.FixedZone("y", -7*3600)),
		time.Now(),
	} {
		if got, want := string(appendTimeMilli(nil, tm)), tm.UTC().Format(rfc3339Milli); got != want {
			t.Errorf("appendTimeMilli(%v): got %q; want %q", tm, got, want)
		}
	}
}
