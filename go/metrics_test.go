package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// scrape GETs /metrics from a running sidecar and parses it strictly.
func scrape(t *testing.T, p *sidecarProc) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.info.Metrics + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: got %v; want a response", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: got %d %q; want 200", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("Content-Type: got %q; want text/plain; version=0.0.4", ct)
	}
	m, err := parseExposition(string(body))
	if err != nil {
		t.Fatalf("exposition: got %v; want valid text format 0.0.4:\n%s", err, body)
	}
	return m
}

// waitMetrics scrapes until cond holds (deadline 10 s) and returns that scrape.
func waitMetrics(t *testing.T, p *sidecarProc, what string, cond func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := scrape(t, p)
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: got timeout; last scrape %v; stderr: %s", what, m, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkBalance asserts that every request received is in flight, answered or abandoned;
// only at a quiet moment (a request is counted received just before it is in flight).
func checkBalance(t *testing.T, m map[string]float64) {
	t.Helper()
	sum := m["h2ping_requests_in_flight"] + m["h2ping_client_disconnects_total"]
	for k, v := range m {
		if strings.HasPrefix(k, "h2ping_responses_total{") {
			sum += v
		}
	}
	if sum != m["h2ping_requests_total"] {
		t.Errorf("in flight + responses + disconnects: got %v; want requests_total %v", sum, m["h2ping_requests_total"])
	}
}

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelPair  = regexp.MustCompile(`^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"$`)
)

// allMetrics are the names SPEC fixes; every scrape must carry each, with HELP and TYPE.
var allMetrics = map[string]string{
	"h2ping_requests_in_flight": "gauge", "h2ping_oldest_request_age_seconds": "gauge",
	"h2ping_requests_total": "counter", "h2ping_responses_total": "counter",
	"h2ping_client_disconnects_total": "counter", "h2ping_upstream_connections": "gauge",
	"h2ping_upstream_dials_total": "counter", "h2ping_upstream_errors_total": "counter",
	"h2ping_upstream_up": "gauge", "h2ping_pings_sent_total": "counter",
	"h2ping_ping_acks_total": "counter", "h2ping_ping_rtt_seconds": "gauge",
	"h2ping_goaways_total": "counter", "h2ping_retries_total": "counter",
	"h2ping_rotations_total": "counter", "h2ping_request_duration_seconds": "histogram",
	"h2ping_build_info": "gauge", "h2ping_time_to_first_byte_seconds": "histogram",
	"h2ping_request_duration_max_seconds": "gauge",
}

// parseExposition checks text line by line against the Prometheus text format 0.0.4, as
// strictly as its parsers are: every family has one HELP and one TYPE before its samples,
// samples belong to the family just declared, no sample or family repeats, label values
// are quoted with only \\, \" and \n escapes, values are floats, the text ends with a
// newline. It also requires every name of allMetrics. Samples are keyed
// name{label="value"}.
func parseExposition(text string) (map[string]float64, error) {
	if !strings.HasSuffix(text, "\n") {
		return nil, errors.New("does not end with a newline")
	}
	samples := map[string]float64{}
	types := map[string]string{}
	helped := map[string]bool{}
	family := ""
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		where := fmt.Sprintf("line %d %q", i+1, line)
		if strings.HasPrefix(line, "#") {
			f := strings.SplitN(line, " ", 4)
			if len(f) < 4 || f[0] != "#" || !metricName.MatchString(f[2]) {
				return nil, fmt.Errorf("%s: malformed comment", where)
			}
			switch f[1] {
			case "HELP":
				if helped[f[2]] || types[f[2]] != "" {
					return nil, fmt.Errorf("%s: HELP repeated or after TYPE", where)
				}
				helped[f[2]] = true
				family = f[2]
			case "TYPE":
				if types[f[2]] != "" || f[2] != family {
					return nil, fmt.Errorf("%s: TYPE repeated or not right after its HELP", where)
				}
				if f[3] != "counter" && f[3] != "gauge" && f[3] != "histogram" {
					return nil, fmt.Errorf("%s: type %q", where, f[3])
				}
				types[f[2]] = f[3]
			default:
				return nil, fmt.Errorf("%s: only HELP and TYPE comments are written", where)
			}
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			return nil, fmt.Errorf("%s: no value", where)
		}
		key, value := line[:sp], line[sp+1:]
		name, labels := key, ""
		if j := strings.IndexByte(key, '{'); j >= 0 {
			if !strings.HasSuffix(key, "}") {
				return nil, fmt.Errorf("%s: unterminated labels", where)
			}
			name, labels = key[:j], key[j+1:len(key)-1]
			for _, pair := range strings.Split(labels, ",") {
				if !labelPair.MatchString(pair) {
					return nil, fmt.Errorf("%s: bad label %q", where, pair)
				}
			}
		}
		base := name
		if types[family] == "histogram" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if strings.TrimSuffix(name, suffix) == family {
					base = family
				}
			}
			if strings.HasSuffix(name, "_bucket") != strings.Contains(labels, "le=") {
				return nil, fmt.Errorf("%s: a histogram's _bucket samples, and only they, carry le", where)
			}
		}
		if base != family || types[base] == "" {
			return nil, fmt.Errorf("%s: sample outside its family (HELP/TYPE of %q)", where, name)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %q", where, value)
		}
		if types[base] != "gauge" && v < 0 {
			return nil, fmt.Errorf("%s: negative counter", where)
		}
		if _, dup := samples[key]; dup {
			return nil, fmt.Errorf("%s: sample repeated", where)
		}
		samples[key] = v
	}
	for name, typ := range allMetrics {
		if types[name] != typ {
			return nil, fmt.Errorf("%s: type %q; want %q", name, types[name], typ)
		}
	}
	return samples, nil
}

func TestExpositionCheckerRejectsWhatParsersReject(t *testing.T) {
	good := string((&meters{}).appendText(nil, time.Now()))
	if _, err := parseExposition(good); err != nil {
		t.Fatalf("our own output: got %v; want valid", err)
	}
	bad := map[string]string{
		"no final newline": strings.TrimSuffix(good, "\n"),
		"sample repeated":  good + "h2ping_rotations_total 0\n",
		"sample w/o TYPE":  good + "h2ping_other 1\n",
		"bad label quote":  strings.Replace(good, `{result="ok"}`, `{result=ok}`, 1),
		"bad value":        strings.Replace(good, "h2ping_requests_total 0", "h2ping_requests_total zero", 1),
		"metric missing":   strings.Replace(good, "h2ping_goaways_total", "h2ping_goaway_total", -1),
	}
	for name, text := range bad {
		if _, err := parseExposition(text); err == nil {
			t.Errorf("%s: got valid; want an error", name)
		}
	}
}

// TestMetricsDuringASlowRequest: while a request waits, it is in flight with a growing
// age and PINGs go out and come back; afterwards nothing is in flight and its 200 counted.
func TestMetricsDuringASlowRequest(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		io.WriteString(w, "late")
	}))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin),
		"-ping-interval", "50ms", "-metrics-listen", "127.0.0.1:0")
	if host, port, err := net.SplitHostPort(p.info.Metrics); err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("ready file metrics: got %q; want the bound 127.0.0.1 port", p.info.Metrics)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(p.url() + "/slow")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	<-arrived
	first := waitMetrics(t, p, "1 in flight", func(m map[string]float64) bool {
		return m["h2ping_requests_in_flight"] == 1 && m["h2ping_oldest_request_age_seconds"] > 0
	})
	during := waitMetrics(t, p, "PINGs sent and all acknowledged", func(m map[string]float64) bool {
		return m["h2ping_pings_sent_total"] >= 2 && m["h2ping_ping_acks_total"] == m["h2ping_pings_sent_total"]
	})
	if during["h2ping_oldest_request_age_seconds"] <= first["h2ping_oldest_request_age_seconds"] {
		t.Fatalf("oldest age: got %v then %v; want it to grow", first["h2ping_oldest_request_age_seconds"], during["h2ping_oldest_request_age_seconds"])
	}
	if rtt := during["h2ping_ping_rtt_seconds"]; rtt <= 0 || rtt > 5 {
		t.Fatalf("ping rtt: got %v; want a loopback round trip above 0", rtt)
	}
	if during["h2ping_requests_in_flight"] != 1 || during["h2ping_upstream_up"] != 1 {
		t.Fatalf("during: got in flight %v, up %v; want 1 and 1 %v", during["h2ping_requests_in_flight"], during["h2ping_upstream_up"], during)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("slow request: got %v; want its response", err)
	}
	after := waitMetrics(t, p, "the request done", func(m map[string]float64) bool {
		return m["h2ping_requests_in_flight"] == 0
	})
	checkBalance(t, after)
	want := map[string]float64{
		"h2ping_oldest_request_age_seconds":           0,
		"h2ping_requests_total":                       1,
		`h2ping_responses_total{code="200"}`:          1,
		"h2ping_client_disconnects_total":             0,
		`h2ping_upstream_errors_total{kind="dial"}`:   0,
		`h2ping_upstream_errors_total{kind="reset"}`:  0,
		`h2ping_upstream_dials_total{result="error"}`: 0,
		"h2ping_upstream_up":                          1,
		"h2ping_goaways_total":                        0,
		"h2ping_retries_total":                        0,
		"h2ping_rotations_total":                      0,
	}
	for k, v := range want {
		if after[k] != v {
			t.Errorf("%s: got %v; want %v", k, after[k], v)
		}
	}
	// The start-up check's connection carried the request: one dial, one connection.
	if after[`h2ping_upstream_dials_total{result="ok"}`] != 1 || after["h2ping_upstream_connections"] != 1 {
		t.Errorf("dials ok %v, connections open %v; want 1 and 1", after[`h2ping_upstream_dials_total{result="ok"}`], after["h2ping_upstream_connections"])
	}
}

// TestMetricsGOAWAYRefusalIsCountedAndRetried: a POST refused by a graceful GOAWAY is
// re-sent on a fresh connection; the GOAWAY and the re-send are counted, and a graceful
// GOAWAY is no upstream error.
func TestMetricsGOAWAYRefusalIsCountedAndRetried(t *testing.T) {
	slowIn, release := make(chan struct{}), make(chan struct{})
	var slowOnce atomic.Bool
	o := newConnOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			if slowOnce.CompareAndSwap(false, true) {
				close(slowIn)
			}
			<-release
			return
		}
		io.Copy(w, r.Body)
	}), 0)
	var releaseOnce sync.Once
	closeRelease := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(closeRelease)
	access := filepath.Join(t.TempDir(), "access.log")
	p := runSidecar(t, "-upstream", o.url, "-ca-file", o.caFile, "-metrics-listen", "127.0.0.1:0", "-access-log", access)
	// The start-up check's connection is the one the slow request then uses.
	waitMetrics(t, p, "the start-up check", func(m map[string]float64) bool {
		return m[`h2ping_upstream_dials_total{result="ok"}`] == 1
	})
	slowDone := make(chan error, 1)
	go func() {
		resp, err := http.Get(p.url() + "/slow")
		if err == nil {
			resp.Body.Close()
		}
		slowDone <- err
	}()
	<-slowIn
	first := o.connections()[0]
	first.gate.pause()
	go first.srv.Shutdown(context.Background())
	waitFor(t, "the GOAWAY to be written and held", 5*time.Second, func() bool { return first.gate.blockedWriters() > 0 })
	readBefore := first.gate.read.Load()
	body := strings.Repeat("b", 100)
	done := make(chan string, 1)
	go func() {
		resp, err := http.Post(p.url()+"/post", "text/plain", strings.NewReader(body))
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	waitFor(t, "the POST to reach the first connection", 5*time.Second, func() bool {
		return first.gate.read.Load() >= readBefore+int64(len(body))
	})
	first.gate.resume()
	if got := <-done; got != "200 "+body {
		t.Fatalf("POST: got %q; want 200 and the body echoed", got)
	}
	closeRelease()
	if err := <-slowDone; err != nil {
		t.Fatalf("slow request: got %v; want it to finish", err)
	}
	m := waitMetrics(t, p, "both requests done", func(m map[string]float64) bool {
		return m["h2ping_requests_in_flight"] == 0 && m[`h2ping_responses_total{code="200"}`] == 2
	})
	checkBalance(t, m)
	if m["h2ping_goaways_total"] < 1 || m["h2ping_retries_total"] != 1 {
		t.Fatalf("goaways %v, retries %v; want >= 1 and 1", m["h2ping_goaways_total"], m["h2ping_retries_total"])
	}
	for _, k := range kindNames {
		if v := m[`h2ping_upstream_errors_total{kind="`+k+`"}`]; v != 0 {
			t.Errorf("errors{kind=%q}: got %v; want 0 (a graceful GOAWAY is no error)", k, v)
		}
	}
	if m["h2ping_upstream_up"] != 1 {
		t.Errorf("up: got %v; want 1", m["h2ping_upstream_up"])
	}
	// The access log says which request was re-sent.
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.waitExit(t, 10*time.Second)
	retried := map[string]bool{}
	for _, l := range readAccessLog(t, access) {
		retried[l.Method+" "+l.Path] = l.Retried
	}
	if len(retried) != 2 || !retried["POST /post"] || retried["GET /slow"] {
		t.Errorf("access log retried: got %v; want POST /post true and GET /slow false", retried)
	}
}

// TestMetricsShowABadUpstreamWithoutARequest: right after readiness the proxy dials once,
// so a closed port, an untrusted certificate or a server without h2 shows as down, with
// its kind and one log line, within 2 s and before any request.
func TestMetricsShowABadUpstreamWithoutARequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	h2 := newH2Origin(t, http.HandlerFunc(echoHandler))
	h1 := httptest.NewUnstartedServer(http.HandlerFunc(echoHandler))
	h1.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	h1.StartTLS()                                   // offers http/1.1 only
	t.Cleanup(h1.Close)
	cases := []struct {
		name, kind, logged string
		args               []string
	}{
		{"closed port", "dial", "connection refused", []string{"-upstream", "https://" + closed}},
		{"untrusted certificate", "tls", "certificate", []string{"-upstream", h2.URL}},
		{"no h2", "alpn", "h2", []string{"-upstream", h1.URL, "-ca-file", caFileOf(t, h1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := runSidecar(t, append(tc.args, "-metrics-listen", "127.0.0.1:0")...)
			readyAt := time.Now()
			var m map[string]float64
			for {
				m = scrape(t, p)
				if m[`h2ping_upstream_dials_total{result="error"}`] == 1 {
					break
				}
				if time.Since(readyAt) > 2*time.Second {
					t.Fatalf("dial error: got none 2 s after ready; want one; last scrape %v", m)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if m["h2ping_upstream_up"] != 0 || m[`h2ping_upstream_errors_total{kind="`+tc.kind+`"}`] != 1 || m["h2ping_requests_total"] != 0 {
				t.Fatalf("got up %v, errors{kind=%q} %v, requests %v; want 0, 1, 0", m["h2ping_upstream_up"], tc.kind,
					m[`h2ping_upstream_errors_total{kind="`+tc.kind+`"}`], m["h2ping_requests_total"])
			}
			waitFor(t, "the upstream check's log line", 2*time.Second, func() bool {
				return strings.Contains(p.stderr.String(), "upstream check: ")
			})
			var line string
			for _, l := range strings.Split(p.stderr.String(), "\n") {
				if strings.Contains(l, "upstream check: ") {
					line = l
				}
			}
			if !strings.Contains(line, tc.logged) {
				t.Fatalf("log: got %q; want one line naming %q", line, tc.logged)
			}
		})
	}
}

// silentH2Origin accepts TLS with ALPN h2, answers the HTTP/2 preface with an empty
// SETTINGS and its ACK, then reads everything and answers nothing (no PING ACK, no
// response): an upstream that hangs. With reset set it instead resets the TCP connection
// as soon as a request's HEADERS arrive.
func silentH2Origin(t *testing.T, reset bool) (url, caFile string) {
	t.Helper()
	donor := httptest.NewUnstartedServer(nil)
	donor.EnableHTTP2 = true
	donor.StartTLS()
	conf := &tls.Config{Certificates: donor.TLS.Certificates, NextProtos: []string{"h2"}}
	caFile = caFileOf(t, donor)
	donor.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				// SETTINGS (empty) and SETTINGS ACK: type 0x4, flags 0 and 0x1.
				c.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 4, 1, 0, 0, 0, 0})
				preface := make([]byte, clientPrefaceLen)
				if _, err := io.ReadFull(c, preface); err != nil {
					return
				}
				hdr := make([]byte, 9)
				for {
					if _, err := io.ReadFull(c, hdr); err != nil {
						return
					}
					n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
					if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
						return
					}
					if reset && hdr[3] == frameHeaders {
						c.(*tls.Conn).NetConn().(*net.TCPConn).SetLinger(0)
						c.(*tls.Conn).NetConn().Close()
						return
					}
				}
			}()
		}
	}()
	return "https://" + ln.Addr().String(), caFile
}

// TestMetricsPingTimeoutAndReset: a connection closed for an unanswered PING and one the
// upstream resets are each counted under their kind, and mark the upstream down.
func TestMetricsPingTimeoutAndReset(t *testing.T) {
	for _, tc := range []struct {
		kind  string
		reset bool
	}{{"ping_timeout", false}, {"reset", true}} {
		t.Run(tc.kind, func(t *testing.T) {
			url, ca := silentH2Origin(t, tc.reset)
			p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-ping-interval", "50ms", "-ping-timeout", "200ms",
				"-metrics-listen", "127.0.0.1:0")
			waitMetrics(t, p, "the start-up check", func(m map[string]float64) bool {
				return m["h2ping_upstream_up"] == 1
			})
			code, body := get(t, p.url()+"/hangs")
			if code != http.StatusBadGateway {
				t.Fatalf("request: got %d; want 502", code)
			}
			// The 502 names the flag whose limit the silent upstream overran.
			if want := "no PING ack within 200ms (-ping-timeout)"; tc.kind == "ping_timeout" && !strings.Contains(body, want) {
				t.Fatalf("502 body: got %q; want it to contain %q", body, want)
			}
			m := waitMetrics(t, p, "the error and the 502 counted", func(m map[string]float64) bool {
				return m[`h2ping_upstream_errors_total{kind="`+tc.kind+`"}`] >= 1 && m["h2ping_requests_in_flight"] == 0
			})
			if m["h2ping_upstream_up"] != 0 || m[`h2ping_responses_total{code="502"}`] != 1 || m["h2ping_upstream_connections"] != 0 {
				t.Fatalf("got up %v, 502s %v, connections %v; want 0, 1, 0", m["h2ping_upstream_up"],
					m[`h2ping_responses_total{code="502"}`], m["h2ping_upstream_connections"])
			}
			if tc.kind == "ping_timeout" && m["h2ping_pings_sent_total"] <= m["h2ping_ping_acks_total"] {
				t.Fatalf("pings sent %v, acks %v; want more sent than acknowledged", m["h2ping_pings_sent_total"], m["h2ping_ping_acks_total"])
			}
		})
	}
}

func TestMetricsListenFlagIsCheckedBeforeBinding(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct{ value, want string }{
		{"0.0.0.0:0", "not loopback"},
		{":9100", "not loopback"},
		{"10.1.2.3:9100", "not loopback"},
		{"127.0.0.1", "host:port"},
		{"127.0.0.1:70000", "port"},
		{busy.Addr().String(), "in use"},
	} {
		t.Run(tc.value, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			cmd := exec.Command(sidecarBin, "-upstream", "https://example.com", "-listen", "127.0.0.1:0",
				"-ready-file", ready, "-metrics-listen", tc.value)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			want := exitUsage
			if tc.want == "in use" {
				want = exitMetricsInUse
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != want {
				t.Fatalf("exit: got %v; want exit status %d; stderr %q", err, want, stderr.String())
			}
			line := stderr.String()
			if strings.Count(line, "\n") != 1 || !strings.Contains(line, `-metrics-listen "`+tc.value+`"`) || !strings.Contains(line, tc.want) {
				t.Fatalf("stderr: got %q; want one line naming -metrics-listen %q and %q", line, tc.value, tc.want)
			}
			if _, err := os.Stat(ready); !os.IsNotExist(err) {
				t.Fatalf("ready file: got %v; want none", err)
			}
		})
	}
}

// TestInflightOldestIsTheHeadAtAnyScale: the oldest age is the oldest request's still in
// flight whichever ends first, and a scrape with 10,000 in flight is cheap.
func TestInflightOldestIsTheHeadAtAnyScale(t *testing.T) {
	m := &meters{}
	entries := make([]flightEntry, 10000)
	for i := range entries {
		m.flight.add(&entries[i])
	}
	start := time.Now()
	const scrapes = 10
	for range scrapes {
		m.appendText(nil, time.Now())
	}
	if per := time.Since(start) / scrapes; per > 50*time.Millisecond {
		t.Fatalf("scrape with 10,000 in flight: got %v; want < 50ms", per)
	}
	now := entries[len(entries)-1].start.Add(time.Hour)
	if n, age := m.flight.oldest(now); n != 10000 || age != now.Sub(entries[0].start) {
		t.Fatalf("got %d, %v; want 10000 and the first entry's age", n, age)
	}
	m.flight.remove(&entries[0])
	m.flight.remove(&entries[5000])
	if n, age := m.flight.oldest(now); n != 9998 || age != now.Sub(entries[1].start) {
		t.Fatalf("after removing the oldest: got %d, %v; want 9998 and the second entry's age", n, age)
	}
	for i := range entries {
		if i != 0 && i != 5000 {
			m.flight.remove(&entries[i])
		}
	}
	if n, age := m.flight.oldest(now); n != 0 || age != 0 {
		t.Fatalf("idle: got %d, %v; want 0, 0", n, age)
	}
}

// TestFrameScannerFindsFramesWhereverTheStreamIsCut: the watcher follows frame boundaries
// across Read/Write calls cut anywhere, one byte at a time included, and counts the same.
func TestFrameScannerFindsFramesWhereverTheStreamIsCut(t *testing.T) {
	frame := func(typ, flags byte, payload ...byte) []byte {
		n := len(payload)
		return append([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags, 0, 0, 0, 0}, payload...)
	}
	ping := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	var out, in []byte
	out = append(out, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"...)
	out = append(out, frame(0x4, 0, make([]byte, 12)...)...)                // SETTINGS
	out = append(out, frame(framePing, 0, ping...)...)                      // our PING
	out = append(out, frame(0x0, 0, make([]byte, 70000%16384)...)...)       // DATA
	out = append(out, frame(framePing, flagAck, 9, 9, 9, 9, 9, 9, 9, 9)...) // our ACK of theirs: not a PING sent
	in = append(in, frame(0x4, 0)...)
	in = append(in, frame(framePing, 0, 9, 9, 9, 9, 9, 9, 9, 9)...) // theirs: not an ack of ours
	in = append(in, frame(frameHeaders, 0x4, make([]byte, 30)...)...)
	in = append(in, frame(framePing, flagAck, ping...)...)
	in = append(in, frame(frameRSTStream, 0, 0, 0, 0, errCodeRefused)...) // refused: re-sent, no error
	in = append(in, frame(frameRSTStream, 0, 0, 0, 0, errCodeCancel)...)  // answers our cancel: no error
	in = append(in, frame(frameRSTStream, 0, 0, 0, 0, 0x2)...)            // INTERNAL_ERROR
	in = append(in, frame(frameGoAway, 0, 0, 0, 0, 5, 0, 0, 0, 0)...)     // graceful
	for _, cut := range []int{1, 2, 3, 7, 9, 10, 17, 64, 1 << 20} {
		m := &meters{}
		c := m.watch(nil, time.Minute)
		for p := out; len(p) > 0; p = p[min(cut, len(p)):] {
			c.out.feed(p[:min(cut, len(p))], c)
		}
		for p := in; len(p) > 0; p = p[min(cut, len(p)):] {
			c.in.feed(p[:min(cut, len(p))], c)
		}
		got := [...]uint64{m.pingsSent.Load(), m.pingAcks.Load(), m.goaways.Load(), m.errs[kindReset].Load()}
		if got != [...]uint64{1, 1, 1, 1} || m.pingRTT.Load() == 0 {
			t.Fatalf("cut %d: got pings, acks, goaways, resets %v, rtt bits %d; want 1 1 1 1 and an rtt", cut, got, m.pingRTT.Load())
		}
	}
}

// TestMetricsCountClientDisconnectsAndRotations: a client that goes away while its request
// waits is counted (and no response for it); a connection retired by -max-conn-age is.
func TestMetricsCountClientDisconnectsAndRotations(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release) })
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin),
		"-max-conn-age", "300ms", "-metrics-listen", "127.0.0.1:0")
	c, err := net.Dial("tcp", p.info.Listen)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
	<-arrived
	waitMetrics(t, p, "1 in flight", func(m map[string]float64) bool { return m["h2ping_requests_in_flight"] == 1 })
	c.Close()
	m := waitMetrics(t, p, "the disconnect counted", func(m map[string]float64) bool {
		return m["h2ping_requests_in_flight"] == 0 && m["h2ping_client_disconnects_total"] == 1
	})
	checkBalance(t, m)
	for k, v := range m {
		if strings.HasPrefix(k, "h2ping_responses_total{") {
			t.Errorf("%s: got %v; want no response counted for a client that went away", k, v)
		}
	}
	if m["h2ping_requests_total"] != 1 || m[`h2ping_upstream_errors_total{kind="other"}`] != 0 || m[`h2ping_upstream_errors_total{kind="reset"}`] != 0 {
		t.Errorf("requests %v, errors other %v reset %v; want 1, 0, 0 (a client going away is no upstream error)",
			m["h2ping_requests_total"], m[`h2ping_upstream_errors_total{kind="other"}`], m[`h2ping_upstream_errors_total{kind="reset"}`])
	}
	waitMetrics(t, p, "a rotation", func(m map[string]float64) bool {
		return m["h2ping_rotations_total"] >= 1 && m["h2ping_upstream_connections"] == 0
	})
}

// BenchmarkRequestCounting is what metrics.wrap adds to one request (in flight, counts, the
// status code): compare with the proxy's CPU per request in bench/results/metrics.md.
func BenchmarkRequestCounting(b *testing.B) {
	m := &meters{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	wrapped := m.wrap(h)
	r := httptest.NewRequest("GET", "/", nil)
	w := httptest.NewRecorder()
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			h.ServeHTTP(w, r)
		}
	})
	b.Run("counted", func(b *testing.B) {
		for b.Loop() {
			wrapped.ServeHTTP(w, r)
		}
	})
}

// BenchmarkFrameWatch is the watcher's cost per byte of upstream traffic, in 16 KiB DATA
// frames as a large response arrives.
func BenchmarkFrameWatch(b *testing.B) {
	m := &meters{}
	c := m.watch(nil, time.Minute)
	frame := append([]byte{0, 0x40, 0, 0, 0, 0, 0, 0, 1}, make([]byte, 16384)...)
	buf := bytes.Repeat(frame, 4)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		c.in.feed(buf, c)
	}
}

// TestMetricsAResponseCutOffMidBodyLeavesFlight: an upstream that breaks its body after the
// head makes ReverseProxy abort the handler with a panic; the request still leaves
// h2ping_requests_in_flight, counted under the status its client received.
func TestMetricsAResponseCutOffMidBodyLeavesFlight(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "the first half")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	up.EnableHTTP2 = true
	up.Config.ErrorLog = log.New(io.Discard, "", 0)
	up.StartTLS()
	t.Cleanup(up.Close)
	p := runSidecar(t, "-upstream", up.URL, "-ca-file", caFileOf(t, up), "-metrics-listen", "127.0.0.1:0")
	resp, err := http.Get(p.url() + "/cut")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatalf("reading a body the upstream cut off: got no error; want a truncated response")
	}
	m := waitMetrics(t, p, "the cut-off request out of flight", func(m map[string]float64) bool {
		return m["h2ping_requests_total"] == 1 && m["h2ping_requests_in_flight"] == 0
	})
	if m[`h2ping_responses_total{code="200"}`] != 1 || m["h2ping_oldest_request_age_seconds"] != 0 {
		t.Fatalf("got 200s %v, oldest age %v; want 1 and 0", m[`h2ping_responses_total{code="200"}`], m["h2ping_oldest_request_age_seconds"])
	}
}
