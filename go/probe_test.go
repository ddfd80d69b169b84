package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestProbeVerdicts: each combination of what the two connections and the request saw reads
// as the verdict a user acts on, with its exit code.
func TestProbeVerdicts(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	s := func(v string) *string { return &v }
	n := func(v int) *int { return &v }
	open := probeConnReport{Open: true}
	pinged := func(pings, acks int) probeConnReport {
		return probeConnReport{Open: true, Pings: n(pings), Acks: n(acks)}
	}
	dropped := probeConnReport{ClosedAfterS: f(340.2), How: s("EOF (closed without GOAWAY)")}
	p := &probeConfig{forText: "400s", intervalText: "60s"}
	cases := []struct {
		name           string
		silent, pinged probeConnReport
		req            *probeRequestReport
		exit           int
		verdict        string
	}{
		{"idle drop, PINGs keep it", dropped, pinged(6, 6), nil, 0,
			"idle connections are dropped after ~340s; PINGs every 60s keep them open: the sidecar helps here (idle connections only"},
		{"nothing drops", open, pinged(6, 6), nil, 0,
			"no idle drop within 400s: the sidecar is not needed on this path (idle connections only"},
		{"PINGed one closed", dropped, probeConnReport{ClosedAfterS: f(61), How: s("GOAWAY ENHANCE_YOUR_CALM"), Pings: n(1), Acks: n(0)}, nil, 1,
			"PINGs do not keep the connection open (closed after 61.0s with GOAWAY ENHANCE_YOUR_CALM): the sidecar cannot help here; ENHANCE_YOUR_CALM"},
		{"PINGs unanswered", open, pinged(1, 0), nil, 1,
			"PINGs are not answered (1 sent, none answered): the sidecar cannot help here"},
		{"504 while PINGs answered", dropped, pinged(8, 8), &probeRequestReport{Done: true, Status: n(504), AfterS: f(3.0), TimedOut: true}, 1,
			"the load balancer times out a silent response after ~3.0s; PINGs cannot help: raise that timeout"},
		{"dropped before the first PING", dropped, probeConnReport{ClosedAfterS: f(20.1), How: s("EOF (closed without GOAWAY)"), Pings: n(0), Acks: n(0)}, nil, 3,
			"the path dropped the PINGed connection after ~20s, before its first PING (every 60s): inconclusive; " +
				"a ping_interval under ~20s should keep it open: try --ping-interval 10s"},
		{"a 202 with NVCF-REQID", dropped, pinged(8, 8), &probeRequestReport{Done: true, Status: n(202), AfterS: f(5.2), NVCFPending: true}, 0,
			"idle connections are dropped after ~340s; PINGs every 60s keep them open: the sidecar helps here; got 202 with NVCF-REQID after 5.2s: " +
				"NVCF's poll window ended (the request is still running on NVCF); the sidecar follows these (nvcf.follow)"},
		{"request answered", dropped, pinged(8, 8), &probeRequestReport{Done: true, Status: n(200), AfterS: f(8.0)}, 0,
			"idle connections are dropped after ~340s; PINGs every 60s keep them open: the sidecar helps here; the request waited 8.0s and got 200"},
	}
	for _, tc := range cases {
		r := &probeResult{Silent: tc.silent, Pinged: tc.pinged, Request: tc.req}
		r.judge(p)
		if r.ExitCode != tc.exit || !strings.HasPrefix(r.Verdict, tc.verdict) {
			t.Errorf("%s: got exit %d %q; want exit %d %q...", tc.name, r.ExitCode, r.Verdict, tc.exit, tc.verdict)
		}
	}
}

// TestProbeFlagsAreCheckedBeforeAnyDial: bad flags are one line each, as the proxy's are.
func TestProbeFlagsAreCheckedBeforeAnyDial(t *testing.T) {
	env := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-upstream", "http://x"}, `-upstream "http://x": must be https://`},
		{[]string{"-upstream", "https://x", "-for", "30s", "-ping-interval", "60s"}, `-for "30s": must be longer than -ping-interval 60s`},
		{[]string{"-upstream", "https://x", "-request", "slow"}, `-request "slow": must be a path starting with /`},
	} {
		_, err := parseProbeConfig(tc.args, env, nil)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%v: got %v; want %q...", tc.args, err, tc.want)
		}
	}
}

// TestProbeIntervalDefaultsToAQuarterOfFor: without -ping-interval a short probe still PINGs
// (a quarter of -for), and a long one PINGs as the sidecar does (60s).
func TestProbeIntervalDefaultsToAQuarterOfFor(t *testing.T) {
	env := func(string) string { return "" }
	for forText, want := range map[string]string{"15s": "3.75s", "400s": "60s", "4m": "60s"} {
		p, err := parseProbeConfig([]string{"-upstream", "https://x", "-for", forText}, env, nil)
		if err != nil || p.intervalText != want {
			t.Errorf("-for %s: got %v %q; want %q", forText, err, p.intervalText, want)
		}
	}
}

// TestProbeNamesNVCFs202: a 202 with NVCF-REQID on -request is NVCF's poll window, said so,
// exit 0; the header's value is not printed.
func TestProbeNamesNVCFs202(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("NVCF-REQID", "req-id-value-7f3a")
		w.Header().Set("NVCF-STATUS", "pending-evaluation")
		w.WriteHeader(http.StatusAccepted)
	}))
	var stdout, stderr bytes.Buffer
	code := runProbe([]string{"-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-for", "1s",
		"-ping-interval", "0.5s", "-request", "/v1/slow"}, func(string) string { return "" }, nil, &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var result probeResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &result); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s %s", code, err, stdout.String(), stderr.String())
	}
	if !result.Request.NVCFPending || !strings.Contains(result.Verdict, "; got 202 with NVCF-REQID after ") ||
		!strings.HasSuffix(result.Verdict, "NVCF's poll window ended (the request is still running on NVCF); the sidecar follows these (nvcf.follow)") {
		t.Errorf("verdict %q, request %+v", result.Verdict, result.Request)
	}
	if strings.Contains(stdout.String(), "req-id-value") {
		t.Errorf("the NVCF-REQID value was printed: %s", stdout.String())
	}
}
