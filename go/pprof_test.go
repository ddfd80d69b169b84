package main

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

func getProfile(t *testing.T, p *sidecarProc, path string) (int, []byte) {
	t.Helper()
	resp, err := http.Get("http://" + p.info.Metrics + path)
	if err != nil {
		t.Fatalf("GET %s: got %v; want a response", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func TestPprofServesProfilesOnTheMetricsListenerOnlyWhenAsked(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-metrics-listen", "127.0.0.1:0", "-pprof")
	// The protobuf go tool pprof reads is gzipped.
	if code, body := getProfile(t, p, "/debug/pprof/heap?gc=1"); code != 200 || !bytes.HasPrefix(body, []byte{0x1f, 0x8b}) {
		t.Fatalf("heap profile: got %d and %d bytes (%.20q); want 200 and a gzipped profile", code, len(body), body)
	}
	if code, body := getProfile(t, p, "/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(string(body), "goroutine profile:") {
		t.Fatalf("goroutine profile: got %d %.80q; want 200 and the text form", code, body)
	}
	if code, _ := getProfile(t, p, "/debug/pprof/nosuch"); code != 404 {
		t.Fatalf("unknown profile: got %d; want 404", code)
	}
	plain := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-metrics-listen", "127.0.0.1:0")
	if code, _ := getProfile(t, plain, "/debug/pprof/heap"); code != 404 {
		t.Fatalf("heap profile without -pprof: got %d; want 404", code)
	}
}

func TestPprofNeedsTheMetricsListener(t *testing.T) {
	_, err := parseConfig([]string{"-upstream", "https://example.com", "-pprof"}, func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-pprof") || !strings.Contains(err.Error(), "-metrics-listen") {
		t.Fatalf("-pprof alone: got %v; want an error naming -pprof and -metrics-listen", err)
	}
}
