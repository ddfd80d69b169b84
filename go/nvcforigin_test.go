package main

// nvcforigin_test.go: nvcfOrigin, a test origin that speaks NVCF's protocol as NVIDIA/nvcf's
// invocation service does (window from NVCF-POLL-SECONDS, 202 + NVCF-REQID/NVCF-STATUS,
// long-polled status, 404 for an id it does not know or has answered, a 302 to a zip
// holding `<id>.response` for a large result), and the client call the tests make.

import (
	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
	// sse, when set, makes the result an event stream: one event, then the second once
	// sse is closed.
	sse chan struct{}
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
	if o.sse != nil {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: 1\n\n"))
		w.(http.Flusher).Flush()
		<-o.sse
		w.Write([]byte("data: [DONE]\n\n"))
		return
	}
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
