package main

// nvcf_test.go: the proxy follows NVCF's 202s against nvcfOrigin, a real TLS HTTP/2 origin
// that speaks the protocol as NVIDIA/nvcf's invocation service does (window from
// NVCF-POLL-SECONDS, 202 + NVCF-REQID/NVCF-STATUS, long-polled status, 404 for an id it does
// not know or has answered, a 302 to a zip holding `<id>.response` for a large result).

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const secretAuth = "Bearer nvapi-SECRET-never-logged-7f3a"

type nvcfJob struct {
	ready  time.Time
	result []byte
}

// nvcfOrigin is the protocol's state; handler() serves it (two servers may share one).
type nvcfOrigin struct {
	work time.Duration // a job's result is ready this long after its POST
	big  bool          // answer with a 302 to a zip
	// zipOverride, when set, is served instead of the zip built from the result.
	zipOverride []byte
	// emptyID answers every POST with a 202 whose NVCF-REQID is this (no job kept).
	emptyID *string

	mu   sync.Mutex
	jobs map[string]*nvcfJob
	seq  int
	// seen holds the Authorization, NVCF-POLL-SECONDS and Accept of each poll, and the
	// header names of each zip fetch.
	pollHeaders []http.Header
	zipHeaders  []http.Header
	postWindows []string

	posts, polls, activePolls atomic.Int64
	fail503, reset            atomic.Int64 // the next N polls answer 503 (no id) / reset
}

func newNVCFOrigin(work time.Duration) *nvcfOrigin {
	return &nvcfOrigin{work: work, jobs: map[string]*nvcfJob{}}
}

func (o *nvcfOrigin) window(r *http.Request) time.Duration {
	if n, err := strconv.Atoi(r.Header.Get("NVCF-POLL-SECONDS")); err == nil && n >= 1 {
		return time.Duration(n) * time.Second
	}
	return 2 * time.Second // NVCF's 60 s, scaled down
}

func (o *nvcfOrigin) handler(zipBase *string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/nvcf/pexec/functions/{fid}", func(w http.ResponseWriter, r *http.Request) {
		o.posts.Add(1)
		body, _ := io.ReadAll(r.Body)
		o.mu.Lock()
		o.postWindows = append(o.postWindows, r.Header.Get("NVCF-POLL-SECONDS"))
		if o.emptyID != nil {
			o.mu.Unlock()
			w.Header()["Nvcf-Reqid"] = []string{*o.emptyID}
			w.Header().Set("NVCF-STATUS", "in-progress")
			w.WriteHeader(http.StatusAccepted)
			w.Write([]byte(`{"reqId":"","status":"pending-evaluation"}`))
			return
		}
		o.seq++
		id := fmt.Sprintf("0000%04d-1111-2222-3333-444455556666", o.seq)
		result := []byte(`{"id":"` + id + `","choices":[{"message":{"content":` + strconv.Quote(string(body)) + `}}]}`)
		if o.big {
			pad := bytes.Repeat([]byte("x"), 6<<20)
			result = []byte(`{"id":"` + id + `","pad":"` + string(pad) + `"}`)
		}
		o.jobs[id] = &nvcfJob{ready: time.Now().Add(o.work), result: result}
		o.mu.Unlock()
		o.answer(w, r, id, *zipBase)
	})
	mux.HandleFunc("GET /v2/nvcf/pexec/status/{id}", func(w http.ResponseWriter, r *http.Request) {
		o.polls.Add(1)
		o.activePolls.Add(1)
		defer o.activePolls.Add(-1)
		o.mu.Lock()
		h := http.Header{}
		for _, k := range []string{"Authorization", "Nvcf-Poll-Seconds", "Accept", "Content-Type", "X-Custom"} {
			if v, ok := r.Header[k]; ok {
				h[k] = v
			}
		}
		o.pollHeaders = append(o.pollHeaders, h)
		o.mu.Unlock()
		if o.fail503.Add(-1) >= 0 {
			http.Error(w, `{"title":"Service Unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		if o.reset.Add(-1) >= 0 {
			panic(http.ErrAbortHandler) // RST_STREAM mid-poll
		}
		o.answer(w, r, r.PathValue("id"), *zipBase)
	})
	mux.HandleFunc("GET /zip/{id}", func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.zipHeaders = append(o.zipHeaders, r.Header.Clone())
		o.mu.Unlock()
		if o.zipOverride != nil {
			w.Write(o.zipOverride)
			return
		}
		id := r.PathValue("id")
		w.Header().Set("Content-Type", "application/zip")
		w.Write(buildResultZip(id, o.resultOf(id)))
	})
	return mux
}

func (o *nvcfOrigin) resultOf(id string) []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	if j := o.jobs[id]; j != nil {
		return j.result
	}
	return nil
}

// answer holds the request for its window: the result when ready, else 202; a job
// answered is forgotten (a later poll gets 404, as NVCF purges the id).
func (o *nvcfOrigin) answer(w http.ResponseWriter, r *http.Request, id, zipBase string) {
	o.mu.Lock()
	j := o.jobs[id]
	o.mu.Unlock()
	if j == nil {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"title":"Not Found","status":404}`))
		return
	}
	wait := min(time.Until(j.ready), o.window(r))
	select {
	case <-time.After(max(wait, 0)):
	case <-r.Context().Done():
		return
	}
	w.Header().Set("NVCF-REQID", id)
	if time.Now().Before(j.ready) {
		w.Header().Set("NVCF-STATUS", "in-progress")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte(`{"reqId":"` + id + `","status":"pending-evaluation"}`))
		return
	}
	w.Header().Set("NVCF-STATUS", "fulfilled")
	if o.big { // the job stays for the zip download (S3's copy, in NVCF)
		w.Header().Set("Location", zipBase+"/zip/"+id+"?X-Amz-Signature=presigned")
		w.WriteHeader(http.StatusFound)
		return
	}
	o.mu.Lock()
	delete(o.jobs, id)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Write(j.result)
}

func buildResultZip(id string, result []byte) []byte {
	var b bytes.Buffer
	zw := zip.NewWriter(&b)
	// Stored, not deflated: a test can then corrupt the body's bytes in place.
	f, _ := zw.CreateHeader(&zip.FileHeader{Name: id + ".response", Method: zip.Store})
	f.Write(result)
	zw.Close()
	return b.Bytes()
}

// startNVCF serves o on a TLS h2 origin; its URL is also where its zips are downloaded.
func startNVCF(t *testing.T, o *nvcfOrigin) *httptest.Server {
	t.Helper()
	base := new(string)
	srv := newH2Origin(t, o.handler(base))
	*base = srv.URL
	return srv
}

// invoke POSTs body to the proxy with the client's headers as NVCF's callers send them.
func invoke(t *testing.T, ctx context.Context, proxyURL, body string, hdr map[string]string) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, proxyURL+"/v2/nvcf/pexec/functions/f1", strings.NewReader(body))
	req.Header.Set("Authorization", secretAuth)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Custom", "not-for-polls")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func wantResult(o *nvcfOrigin, id, body string) string {
	return `{"id":"` + id + `","choices":[{"message":{"content":` + strconv.Quote(body) + `}}]}`
}

// TestNVCFFollowGivesTheAnswerOnce: a request past the window gets the result, byte
// exact, with the POST sent once, polls within work/window + 1, and each poll carrying
// the original Authorization, NVCF-POLL-SECONDS and Accept and nothing else of the request.
func TestNVCFFollowGivesTheAnswerOnce(t *testing.T) {
	o := newNVCFOrigin(2500 * time.Millisecond)
	srv := startNVCF(t, o)
	p := startProxy(t, srv.URL, caFileOf(t, srv))
	body := `{"messages":[{"role":"user","content":"judge this \u00e9"}]}`
	resp, got, err := invoke(t, context.Background(), p.url, body, map[string]string{"NVCF-POLL-SECONDS": "1"})
	if err != nil {
		t.Fatal(err)
	}
	id := "00000001-1111-2222-3333-444455556666"
	if resp.StatusCode != 200 || string(got) != wantResult(o, id, body) {
		t.Fatalf("answer: got %d %q; want 200 with the result", resp.StatusCode, got)
	}
	if resp.Header.Get("NVCF-REQID") != id || resp.Header.Get("NVCF-STATUS") != "fulfilled" {
		t.Fatalf("answer headers: got %v; want the result's NVCF-REQID and NVCF-STATUS", resp.Header)
	}
	if n := o.posts.Load(); n != 1 {
		t.Fatalf("POSTs at the origin: got %d; want 1 (never re-sent)", n)
	}
	if n := o.polls.Load(); n < 1 || n > 3 { // work 2.5 s / window 1 s + 1
		t.Fatalf("status polls: got %d; want 1-3", n)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, h := range o.pollHeaders {
		want := http.Header{"Authorization": {secretAuth}, "Nvcf-Poll-Seconds": {"1"}, "Accept": {"application/json"}}
		if fmt.Sprint(h) != fmt.Sprint(want) {
			t.Fatalf("poll %d headers: got %v; want exactly %v", i+1, h, want)
		}
	}
	if strings.Contains(p.logs.String(), "SECRET") {
		t.Fatalf("log: got %q; want no Authorization in it", p.logs)
	}
}

// TestNVCFPollWindowFlagYieldsToTheClient: -nvcf-poll-window fills NVCF-POLL-SECONDS in
// only when the client sent none.
func TestNVCFPollWindowFlagYieldsToTheClient(t *testing.T) {
	o := newNVCFOrigin(1500 * time.Millisecond)
	srv := startNVCF(t, o)
	p := startProxy(t, srv.URL, caFileOf(t, srv), "-nvcf-poll-window", "5s")
	if resp, _, err := invoke(t, context.Background(), p.url, "a", map[string]string{"NVCF-POLL-SECONDS": "1"}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("client window: got %v %v; want 200", resp, err)
	}
	if resp, _, err := invoke(t, context.Background(), p.url, "b", nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("flag window: got %v %v; want 200", resp, err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if fmt.Sprint(o.postWindows) != "[1 5]" {
		t.Fatalf("NVCF-POLL-SECONDS at the origin: got %v; want [1 5] (client's first, flag's second)", o.postWindows)
	}
	// The first request was answered 202 after 1 s and polled with the client's "1"; the
	// second waited its 5 s window on the POST itself: no poll.
	if len(o.pollHeaders) < 1 || o.pollHeaders[0].Get("Nvcf-Poll-Seconds") != "1" || o.polls.Load() != int64(len(o.pollHeaders)) {
		t.Fatalf("polls: got %v; want the client's window on each", o.pollHeaders)
	}
}

// TestNVCFBudgetIs504WithTheID: past -nvcf-budget the client gets 504, NVCF-REQID and a
// one-line JSON error naming the id.
func TestNVCFBudgetIs504WithTheID(t *testing.T) {
	o := newNVCFOrigin(time.Minute)
	srv := startNVCF(t, o)
	p := startProxy(t, srv.URL, caFileOf(t, srv), "-nvcf-budget", "2s")
	before := stats.nvcfOutcomes[nvcfBudget].Load()
	start := time.Now()
	resp, got, err := invoke(t, context.Background(), p.url, "x", map[string]string{"NVCF-POLL-SECONDS": "1"})
	if err != nil {
		t.Fatal(err)
	}
	id := "00000001-1111-2222-3333-444455556666"
	var e struct {
		Error string `json:"error"`
		ReqID string `json:"nvcf_reqid"`
	}
	if resp.StatusCode != 504 || resp.Header.Get("NVCF-REQID") != id || json.Unmarshal(got, &e) != nil ||
		e.ReqID != id || !strings.Contains(e.Error, id) || bytes.Count(got, []byte("\n")) != 1 {
		t.Fatalf("over budget: got %d %v %q; want 504, NVCF-REQID %s, one JSON line naming it", resp.StatusCode, resp.Header, got, id)
	}
	if took := time.Since(start); took < 2*time.Second || took > 5*time.Second {
		t.Fatalf("over budget after %s; want about 2s", took)
	}
	if stats.nvcfOutcomes[nvcfBudget].Load() != before+1 {
		t.Fatalf("outcome budget: got %d; want %d", stats.nvcfOutcomes[nvcfBudget].Load(), before+1)
	}
}

// TestNVCFStatusFailuresAreRetried: polls answered 503 (no NVCF-REQID: the platform's) or
// reset mid-poll are retried; the client still gets the answer, the POST sent once.
func TestNVCFStatusFailuresAreRetried(t *testing.T) {
	o := newNVCFOrigin(1500 * time.Millisecond)
	o.fail503.Store(2)
	o.reset.Store(2)
	srv := startNVCF(t, o)
	p := startProxy(t, srv.URL, caFileOf(t, srv))
	resp, got, err := invoke(t, context.Background(), p.url, "r", map[string]string{"NVCF-POLL-SECONDS": "1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || string(got) != wantResult(o, "00000001-1111-2222-3333-444455556666", "r") {
		t.Fatalf("after failing polls: got %d %q; want 200 with the result", resp.StatusCode, got)
	}
	if o.posts.Load() != 1 || o.polls.Load() < 5 {
		t.Fatalf("origin: got %d POSTs, %d polls; want 1 POST and the 4 failed polls retried", o.posts.Load(), o.polls.Load())
	}
}

// TestNVCFClientGoneStopsPolling: a client that goes away ends the polling: the follower
// returns (outcome client_gone) and the origin's poll in flight is cancelled.
func TestNVCFClientGoneStopsPolling(t *testing.T) {
	o := newNVCFOrigin(time.Minute)
	srv := startNVCF(t, o)
	p := startProxy(t, srv.URL, caFileOf(t, srv))
	before := stats.nvcfOutcomes[nvcfClientGone].Load()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := invoke(t, ctx, p.url, "c", map[string]string{"NVCF-POLL-SECONDS": "1"})
		done <- err
	}()
	waitFor(t, "a status poll in flight", 10*time.Second, func() bool { return o.activePolls.Load() == 1 })
	cancel()
	<-done
	waitFor(t, "outcome client_gone", 5*time.Second, func() bool { return stats.nvcfOutcomes[nvcfClientGone].Load() == before+1 })
	// The follower has returned, so no poll can start any more; the one in flight ends.
	sent := o.polls.Load()
	waitFor(t, "the origin's poll cancelled", 5*time.Second, func() bool { return o.activePolls.Load() == 0 })
	if n := o.polls.Load(); n != sent || n < 1 {
		t.Fatalf("polls: got %d; want %d, none after the client left", n, sent)
	}
}

// TestNVCFOddIDAndFollowOffPassThrough: a 202 whose NVCF-REQID is empty or not a token,
// and any 202 with -nvcf-follow=false, reach the client unchanged, with no poll.
func TestNVCFOddIDAndFollowOffPassThrough(t *testing.T) {
	for _, tc := range []struct {
		name, id string
		args     []string
	}{
		{"empty id", "", nil},
		{"not a token", "a b/../c", nil},
		{"follow off", "00000009-1111-2222-3333-444455556666", []string{"-nvcf-follow=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newNVCFOrigin(time.Minute)
			o.emptyID = &tc.id
			srv := startNVCF(t, o)
			p := startProxy(t, srv.URL, caFileOf(t, srv), tc.args...)
			before := stats.nvcfOutcomes[nvcfError].Load()
			resp, got, err := invoke(t, context.Background(), p.url, "e", nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 202 || string(got) != `{"reqId":"","status":"pending-evaluation"}` || resp.Header.Get("NVCF-REQID") != tc.id {
				t.Fatalf("got %d %v %q; want the 202 unchanged", resp.StatusCode, resp.Header, got)
			}
			if o.polls.Load() != 0 {
				t.Fatalf("polls: got %d; want 0", o.polls.Load())
			}
			wantErr := before + 1
			if tc.args != nil {
				wantErr = before
			}
			if n := stats.nvcfOutcomes[nvcfError].Load(); n != wantErr {
				t.Fatalf("outcome error: got %d; want %d", n, wantErr)
			}
		})
	}
}

// TestNVCFZipResultIsUnpacked: a 302 to a zip gives the client the response inside it,
// byte exact, typed JSON, and the download never carries the client's Authorization.
func TestNVCFZipResultIsUnpacked(t *testing.T) {
	o := newNVCFOrigin(1500 * time.Millisecond)
	o.big = true
	srv := startNVCF(t, o)
	p := startProxy(t, srv.URL, caFileOf(t, srv))
	resp, got, err := invoke(t, context.Background(), p.url, "z", map[string]string{"NVCF-POLL-SECONDS": "1"})
	if err != nil {
		t.Fatal(err)
	}
	id := "00000001-1111-2222-3333-444455556666"
	want := o.resultOf(id)
	if resp.StatusCode != 200 || !bytes.Equal(got, want) || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("zip result: got %d %s, %d bytes; want 200 application/json with the %d bytes of %s.response",
			resp.StatusCode, resp.Header.Get("Content-Type"), len(got), len(want), id)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.zipHeaders) != 1 || o.zipHeaders[0].Get("Authorization") != "" {
		t.Fatalf("zip downloads: got %v; want one, without Authorization", o.zipHeaders)
	}
	if strings.Contains(p.logs.String(), "presigned") {
		t.Fatalf("log: got %q; want no Location query", p.logs)
	}
}

// TestNVCFCorruptZipIs502: a zip the proxy cannot unpack is a 502 with one line naming
// the request and why, never the zip.
func TestNVCFCorruptZipIs502(t *testing.T) {
	id := "00000001-1111-2222-3333-444455556666"
	good := buildResultZip(id, bytes.Repeat([]byte("{}"), 1000))
	for _, tc := range []struct {
		name, why string
		zip       []byte
	}{
		{"not a zip", "not a valid zip file", []byte("PK\x03\x04 this is not a zip at all")},
		{"bad crc", "checksum error", bytes.Replace(good, []byte("{}{}"), []byte("{}{]"), 1)},
		{"no entry", "holds no " + id + ".response entry", buildResultZip("other", []byte("{}"))},
	} {
		z := tc.zip
		t.Run(tc.name, func(t *testing.T) {
			o := newNVCFOrigin(0)
			o.big = true
			o.zipOverride = z
			srv := startNVCF(t, o)
			p := startProxy(t, srv.URL, caFileOf(t, srv))
			resp, got, err := invoke(t, context.Background(), p.url, "z", nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 502 || bytes.Count(got, []byte("\n")) != 1 || !strings.Contains(string(got), id) || !strings.Contains(string(got), tc.why) {
				t.Fatalf("got %d %q; want a one-line 502 naming %s and %q", resp.StatusCode, got, id, tc.why)
			}
		})
	}
}

// TestNVCFStatusOnAnotherHost: -nvcf-status-url on a second origin: polls go there, on its
// own PINGed connection, the POST to the upstream.
func TestNVCFStatusOnAnotherHost(t *testing.T) {
	o := newNVCFOrigin(1500 * time.Millisecond)
	var invokeHits, statusHits atomic.Int64
	base := new(string)
	h := o.handler(base)
	inv := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { invokeHits.Add(1); h.ServeHTTP(w, r) }))
	st := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { statusHits.Add(1); h.ServeHTTP(w, r) }))
	*base = inv.URL
	p := startProxy(t, inv.URL, caFileOf(t, inv), "-nvcf-status-url", st.URL+"/v2/nvcf/pexec/status/{reqid}")
	resp, got, err := invoke(t, context.Background(), p.url, "s", map[string]string{"NVCF-POLL-SECONDS": "1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || string(got) != wantResult(o, "00000001-1111-2222-3333-444455556666", "s") {
		t.Fatalf("got %d %q; want 200 with the result", resp.StatusCode, got)
	}
	if invokeHits.Load() != 1 || statusHits.Load() < 1 || statusHits.Load() != o.polls.Load() {
		t.Fatalf("hits: got upstream %d, status host %d (polls %d); want the POST upstream and every poll on the status host",
			invokeHits.Load(), statusHits.Load(), o.polls.Load())
	}
	if p.up.statusUp == nil {
		t.Fatal("status host: got no upstream of its own; want one")
	}
	if n, _ := p.up.statusUp.pool.stats(); n != 1 {
		t.Fatalf("status host connections: got %d; want 1", n)
	}
}

// TestE2ENVCFCountedAndNoAuthorizationWritten: through the binary, a followed request is
// one request in /metrics and the traffic record, with its polls counted apart, TTFB and
// duration run to the final answer, and the access log line names the id and the polls;
// no output holds the Authorization.
func TestE2ENVCFCountedAndNoAuthorizationWritten(t *testing.T) {
	o := newNVCFOrigin(2500 * time.Millisecond)
	srv := startNVCF(t, o)
	dir := t.TempDir()
	access, traffic, logf := filepath.Join(dir, "access.log"), filepath.Join(dir, "traffic.json"), filepath.Join(dir, "proxy.log")
	p := runSidecar(t, "-upstream", srv.URL, "-ca-file", caFileOf(t, srv), "-metrics-listen", "127.0.0.1:0",
		"-access-log", access, "-traffic-file", traffic, "-traffic-interval", "100ms", "-log-file", logf)
	resp, _, err := invoke(t, context.Background(), p.url(), "m", map[string]string{"NVCF-POLL-SECONDS": "1"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v %v; want 200", resp, err)
	}
	m := scrape(t, p)
	polls := float64(o.polls.Load())
	if m["h2ping_requests_total"] != 1 || m["h2ping_nvcf_pending_total"] != 1 || m["h2ping_nvcf_polls_total"] != polls ||
		m[`h2ping_nvcf_outcomes_total{outcome="answered"}`] != 1 || polls < 1 {
		t.Fatalf("metrics: got requests %v, pending %v, polls %v (origin %v), answered %v; want 1, 1, the origin's, 1",
			m["h2ping_requests_total"], m["h2ping_nvcf_pending_total"], m["h2ping_nvcf_polls_total"], polls,
			m[`h2ping_nvcf_outcomes_total{outcome="answered"}`])
	}
	if m["h2ping_time_to_first_byte_seconds_sum"] < 2.4 {
		t.Fatalf("TTFB: got %vs; want it to run to the final answer (>= 2.5s), not the 202", m["h2ping_time_to_first_byte_seconds_sum"])
	}
	rec := waitTraffic(t, traffic, "the followed request", func(r trafficRecord) bool { return r.NVCFFollowed == 1 })
	if rec.Version != 2 || rec.Requests != 1 || rec.NVCFPolls != uint64(polls) || rec.NVCFBudgetExceeded != 0 {
		t.Fatalf("traffic record: got %+v; want version 2, 1 request, %v polls", rec, polls)
	}
	p.cmd.Process.Signal(os.Interrupt)
	p.waitExit(t, 10*time.Second)
	raw, _ := os.ReadFile(access)
	var line struct {
		TTFB      float64 `json:"ttfb_s"`
		NVCFReqID *string `json:"nvcf_reqid"`
		NVCFPolls int     `json:"nvcf_polls"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(raw), &line); err != nil || line.NVCFReqID == nil ||
		*line.NVCFReqID != "00000001-1111-2222-3333-444455556666" || line.NVCFPolls != int(polls) || line.TTFB < 2.4 {
		t.Fatalf("access log: got %q (%v); want one line with nvcf_reqid, nvcf_polls %v, ttfb_s >= 2.5", raw, err, polls)
	}
	for _, path := range []string{access, traffic, logf} {
		if b, _ := os.ReadFile(path); bytes.Contains(b, []byte("SECRET")) {
			t.Fatalf("%s: got the Authorization in it; want never", filepath.Base(path))
		}
	}
	if strings.Contains(p.stderr.String(), "SECRET") {
		t.Fatal("stderr: got the Authorization in it; want never")
	}
}

// TestNVCFFlags: bad values are one line naming the flag; the status URL defaults to
// where NVCF serves a host's status.
func TestNVCFFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-nvcf-poll-window", "0s"}, {"-nvcf-poll-window", "3601s"}, {"-nvcf-poll-window", "1.5s"},
		{"-nvcf-budget", "-1s"}, {"-nvcf-budget", "0"},
		{"-nvcf-status-url", "http://h/v2/nvcf/pexec/status/{reqid}"}, {"-nvcf-status-url", "https://h/v2/status"},
		{"-nvcf-status-url", "https://u:p@h/{reqid}"},
	} {
		_, err := parseConfig(append([]string{"-upstream", "https://up.example"}, args...), func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), args[0]) || !strings.Contains(err.Error(), strings.ReplaceAll(args[1], "u:p@", "")) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: got %v; want one line naming the flag and the value", args, err)
		}
	}
	for up, want := range map[string]string{
		"https://0e349b44-440a-44e1-93e9-abe8dcb27158.invocation.api.nvcf.nvidia.com": "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}",
		"https://ai.api.nvidia.com": "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}",
		"https://0e349b44-440a-44e1-93e9-abe8dcb27158.invocation.nvcf.example.com:8443": "https://invocation.nvcf.example.com:8443/v2/nvcf/pexec/status/{reqid}",
		"https://api.nvcf.nvidia.com": "https://api.nvcf.nvidia.com/v2/nvcf/pexec/status/{reqid}",
		"https://127.0.0.1:9443":      "https://127.0.0.1:9443/v2/nvcf/pexec/status/{reqid}",
	} {
		cfg, err := parseConfig([]string{"-upstream", up}, func(string) string { return "" }, io.Discard)
		if err != nil || cfg.NVCF.StatusURL != want || !cfg.NVCF.Follow || cfg.NVCF.Budget != time.Hour || cfg.NVCF.PollWindow != 0 {
			t.Errorf("-upstream %s: got %+v, %v; want status %s, follow on, budget 60m, no window", up, cfg.NVCF, err, want)
		}
	}
}
