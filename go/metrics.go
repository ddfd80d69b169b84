package main

// metrics.go owns the proxy's counters and gauges and the -metrics-listen endpoint that
// serves them as GET /metrics in the Prometheus text format 0.0.4 (SPEC, "Metrics").
//
// The counters are process-wide (stats), like expvar's: the process has one front end and
// one upstream, and a package variable keeps each hook elsewhere to one line. The upstream
// counters are atomic adds on events (dials, PINGs, GOAWAYs) and count whether or not
// -metrics-listen is set; the per-request part (wrap: in flight, status codes, TTFB, one
// small allocation per request) runs only with -metrics-listen, -traffic-file or
// -access-log, since nobody could read it otherwise. The traffic record (traffic.go) reads
// these same variables; the access log (accesslog.go) gets each finished request from wrap.
//
// The frames of the upstream connections (PINGs, GOAWAY, RST_STREAM) are read by
// framewatch.go; this file only stores what it reports.
//
// Must not: take a lock on the request path other than the in-flight set's (four pointer
// writes) and, with -access-log, its buffer's (held for a copy), log, or expose anything
// about a request beyond its status code (no path, no header: Authorization must never
// reach a scrape; the access log's method and path are accesslog.go's).

import (
	"errors"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// errKind is the label of h2ping_upstream_errors_total.
type errKind int

const (
	// kindDial: the upstream was not reached: TCP connect failed (refused, unreachable,
	// DNS, timeout), or with an egress proxy, reaching the proxy or its CONNECT did
	// (a 407, 403 or 502 answer included): nothing of the upstream's TLS had begun.
	kindDial errKind = iota
	// kindTLS: the TLS handshake failed (certificate, protocol version, handshake timeout).
	kindTLS
	// kindALPN: the handshake succeeded but the upstream does not speak h2.
	kindALPN
	// kindPingTimeout: a PING went unanswered for -ping-timeout; the connection was closed.
	kindPingTimeout
	// kindReset: the upstream ended a connection or a stream with an error: TCP reset,
	// closed without GOAWAY, GOAWAY or RST_STREAM with an error code (REFUSED_STREAM and
	// CANCEL excepted: the first is re-sent, see h2ping_retries_total, the second answers
	// a stream the proxy cancelled).
	kindReset
	// kindOther: anything else (a protocol violation the client detected, a read error).
	kindOther
	numKinds
)

var kindNames = [numKinds]string{"dial", "tls", "alpn", "ping_timeout", "reset", "other"}

// maxCode bounds the status codes counted one by one; net/http refuses codes outside
// 100-999 and the proxy only passes on what the upstream sent.
const maxCode = 1000

// meters is every figure of GET /metrics. All fields are updated with atomics except
// flight.
type meters struct {
	requests   atomic.Uint64
	clientGone atomic.Uint64
	responses  [maxCode]atomic.Uint64

	conns      atomic.Int64
	dialsOK    atomic.Uint64
	dialsErr   atomic.Uint64
	errs       [numKinds]atomic.Uint64
	upstreamUp atomic.Bool

	pingsSent atomic.Uint64
	pingAcks  atomic.Uint64
	pingRTT   atomic.Uint64 // float64 bits, seconds, of the last acknowledged PING

	goaways   atomic.Uint64
	retries   atomic.Uint64
	rotations atomic.Uint64

	// NVCF's 202s (nvcf.go): followed, status polls sent, how each followed one ended.
	nvcfPending  atomic.Uint64
	nvcfPolls    atomic.Uint64
	nvcfOutcomes [numNVCFOutcomes]atomic.Uint64

	flight   inflight
	duration histogram // request to end of response, answered requests only
	// ttfb is request to the upstream's response head (requests the upstream answered,
	// whether or not their client stayed for the body); durationMax is the longest
	// duration observed, in nanoseconds: exact, where the histogram only bounds it.
	ttfb        histogram
	durationMax atomic.Uint64

	// access, when set, gets one line per finished request (accesslog.go).
	access *accessLog

	// firstCheck is the first upstream dial's verdict, nil until it ends; lastErr the
	// latest upstream failure, nil until one happens. Both are read by GET /upstream.
	firstCheck atomic.Pointer[checkVerdict]
	// check is the start-up upstream check, which GET /upstream starts at once when asked
	// before its timer; nil until main arms it.
	check   atomic.Pointer[upstreamCheck]
	lastErr atomic.Pointer[upstreamNote]
}

// checkVerdict is how the first upstream dial ended: ok, or err in the error's own words
// (one line), after seconds.
type checkVerdict struct {
	ok      bool
	err     string
	seconds float64
}

// upstreamNote is one upstream failure's text (one line, no request data: dial and
// handshake errors name only the upstream's address) and when it happened.
type upstreamNote struct {
	text string
	at   time.Time
}

// stats is the process's metrics (see the file comment for why it is a package variable).
var stats = &meters{}

// upstreamFailed counts one upstream failure, marks the upstream down and keeps text (one
// line, the error's own words) as the last error for GET /upstream. Failures are rare
// (the request path never gets here while the upstream is healthy), so the small
// allocation is paid only when something went wrong.
func (m *meters) upstreamFailed(k errKind, text string) {
	m.errs[k].Add(1)
	m.upstreamUp.Store(false)
	m.lastErr.Store(&upstreamNote{text: oneLine(text), at: time.Now()})
}

// upstreamOK marks the upstream up after a dial or a response. The load first keeps the
// per-response cost a read of a shared cache line, not a write.
func (m *meters) upstreamOK() {
	if !m.upstreamUp.Load() {
		m.upstreamUp.Store(true)
	}
}

// dialError is a failed upstream dial with the step that failed; it reads as the error it
// wraps, so the 502 body and the log line are unchanged.
type dialError struct {
	kind errKind
	err  error
}

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dialed counts the outcome of one upstream dial (transport.go's newClientConn), which
// took took. The first dial's outcome is also the start-up check's verdict (upcheck.go):
// usually that dial is the check's own, but a request that came first dialed for it.
func (m *meters) dialed(err error, took time.Duration) {
	if err == nil {
		m.dialsOK.Add(1)
		m.upstreamOK()
		m.firstCheck.CompareAndSwap(nil, &checkVerdict{ok: true, seconds: took.Seconds()})
		return
	}
	m.dialsErr.Add(1)
	kind := kindOther
	var de *dialError
	if errors.As(err, &de) {
		kind = de.kind
	}
	m.upstreamFailed(kind, err.Error())
	m.firstCheck.CompareAndSwap(nil, &checkVerdict{err: oneLine(err.Error()), seconds: took.Seconds()})
}

// countHTTP2Error is the upstream Transport's HTTP2Config.CountError: net/http's own hook
// for its HTTP/2 errors. One is a connection failure that no frame or read error shows: a
// protocol violation by the upstream, after which the client sends GOAWAY and closes. The
// others are seen as frames or read errors (framewatch.go) and are not counted twice.
// "conn_close_lost_ping" is not used: net/http reports it for any failed health-check
// PING, also one whose timer fired after the connection was closed; framewatch.go knows
// whether a PING really went unanswered.
func (m *meters) countHTTP2Error(errType string) {
	if strings.HasPrefix(errType, "conn_close_error_") {
		m.upstreamFailed(kindOther, "HTTP/2 protocol error from the upstream ("+errType+")")
	}
}

// inflight is the set of requests in flight, oldest first: a doubly linked list whose
// nodes are the requests' own flightEntry (no allocation of its own). Entries are appended
// with their start time read under mu, so the list is in start order and the oldest is
// the head: the scrape reads one node, however many requests wait (10,000 included).
//
// A mutex, not atomics: an entry is linked and unlinked with four pointer writes, so the
// lock is held for far less than the request's own locks (net/http's, the HTTP/2
// client's) and is uncontended with the proxy's single P (tuning.go).
type inflight struct {
	mu   sync.Mutex
	head flightEntry // sentinel: head.next is the oldest, head.prev the newest
	n    int
}

type flightEntry struct {
	prev, next *flightEntry
	start      time.Time
}

func (f *inflight) add(e *flightEntry) {
	f.mu.Lock()
	if f.head.next == nil {
		f.head.next, f.head.prev = &f.head, &f.head
	}
	e.start = time.Now()
	e.prev, e.next = f.head.prev, &f.head
	f.head.prev.next = e
	f.head.prev = e
	f.n++
	f.mu.Unlock()
}

func (f *inflight) remove(e *flightEntry) {
	f.mu.Lock()
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
	f.n--
	f.mu.Unlock()
}

// oldest returns the number in flight and the oldest one's age (0 when idle).
func (f *inflight) oldest(now time.Time) (int, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return 0, 0
	}
	return f.n, now.Sub(f.head.next.start)
}

// wrap counts the requests h serves: in flight, total, by status code, and those whose
// client went away. A request is in flight from the moment net/http hands it over until
// its response is complete (a streamed response until its last event).
func (m *meters) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rw := &countingWriter{ResponseWriter: w, m: m}
		m.begin(&rw.entry)
		if m.access != nil {
			rw.track(r)
		}
		// Deferred: ReverseProxy panics with http.ErrAbortHandler when the upstream body
		// breaks after the head was sent, and such a request must leave flight too (it
		// once stayed in flight forever, its age growing). net/http cancels the request's
		// context when the client's connection closes (and only after ServeHTTP returns
		// otherwise).
		defer func() {
			gone := r.Context().Err() != nil
			took := m.end(&rw.entry, rw.code, gone)
			if m.access != nil {
				rw.untrack()
				m.access.log(r, rw, took, gone)
			}
		}()
		h.ServeHTTP(rw, r)
	})
}

// begin counts a request received and puts it in flight.
func (m *meters) begin(e *flightEntry) {
	m.requests.Add(1)
	m.flight.add(e)
}

// end takes a request out of flight and counts it either as a response with its status
// code (0: the handler wrote none) or, when the client went away before the response was
// complete, as a disconnect, whatever was written to the dead connection. So every request
// received is in flight, answered or abandoned: requests_total = in_flight +
// sum(responses_total) + client_disconnects_total.
func (m *meters) end(e *flightEntry, code int, gone bool) time.Duration {
	m.flight.remove(e)
	took := time.Since(e.start)
	if gone {
		m.clientGone.Add(1)
		return took
	}
	if code == 0 {
		code = http.StatusOK // net/http sends 200 for a handler that wrote nothing
	}
	if code < maxCode {
		m.responses[code].Add(1)
	}
	m.duration.observe(took)
	// A compare-and-swap loop only while took is a new maximum: after the first minutes of
	// a run that is rare, so the usual cost is one load.
	for n := uint64(max(took, 0)); ; {
		old := m.durationMax.Load()
		if n <= old || m.durationMax.CompareAndSwap(old, n) {
			break
		}
	}
	return took
}

// countingWriter records the final status code of a response and when its head came from
// the upstream. It carries the request's in-flight entry (and, with an access log, the
// rest of the request's line) so that a request costs one allocation here, not several.
type countingWriter struct {
	http.ResponseWriter
	m     *meters
	code  int
	entry flightEntry
	// ttfb is the time from the request to the upstream's response head (0: none came).
	ttfb time.Duration
	// answered is set by the proxy's ErrorHandler (proxyAnswered): the status is the
	// proxy's own, no upstream head came.
	answered proxyAnswer
	access   accessFields
}

func (w *countingWriter) WriteHeader(code int) {
	// 1xx are interim (100 Continue, 103 Early Hints): the final code comes later.
	if w.code == 0 && code >= 200 {
		w.head(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

// head records the final status. ReverseProxy writes the upstream's head as soon as
// RoundTrip returned it (after copying its header fields): this is when it arrived.
func (w *countingWriter) head(code int) {
	w.code = code
	if w.answered.err == nil {
		w.ttfb = max(time.Since(w.entry.start), 1)
		w.m.ttfb.observe(w.ttfb)
	}
}

func (w *countingWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.head(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(p)
	w.access.bytesOut += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController (ReverseProxy's flushes of SSE) reach net/http's
// writer, so wrapping loses no Flush.
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// serveMetrics answers GET /metrics (and with profiles, pprof.go's) on ln until it is
// closed; the returned server is closed at exit. It keeps answering during a drain, which
// is when an operator watches the requests in flight go down.
func serveMetrics(ln net.Listener, profiles bool) *http.Server {
	mux := http.NewServeMux()
	if profiles {
		servePprof(mux)
	}
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		b := stats.appendText(make([]byte, 0, 8192), time.Now())
		w.Write(appendProcessText(b))
	})
	mux.HandleFunc("GET /upstream", serveUpstream) // procmetrics.go
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return srv
}

// appendText appends every metric in the text exposition format 0.0.4: HELP and TYPE
// lines, then the samples. Every label value of dials and errors is always present (0
// until it happens) so that dashboards and alerts need no absent() case.
func (m *meters) appendText(b []byte, now time.Time) []byte {
	n, age := m.flight.oldest(now)
	b = gauge(b, "h2ping_requests_in_flight", "Client requests received and not yet answered in full.", float64(n))
	b = gauge(b, "h2ping_oldest_request_age_seconds", "Age of the oldest request in flight (0 when idle).", age.Seconds())
	b = counter(b, "h2ping_requests_total", "Client requests received.", m.requests.Load())
	b = head(b, "h2ping_responses_total", "Responses completed to clients, by status code.", "counter")
	for code := range m.responses {
		if v := m.responses[code].Load(); v > 0 {
			b = sample(b, "h2ping_responses_total", "code", strconv.Itoa(code), v)
		}
	}
	b = counter(b, "h2ping_client_disconnects_total", "Requests whose client went away before the response was complete.", m.clientGone.Load())

	b = gauge(b, "h2ping_upstream_connections", "Upstream HTTP/2 connections open.", float64(m.conns.Load()))
	b = head(b, "h2ping_upstream_dials_total", "Upstream connections dialled (TCP, TLS, ALPN h2), by result.", "counter")
	b = sample(b, "h2ping_upstream_dials_total", "result", "ok", m.dialsOK.Load())
	b = sample(b, "h2ping_upstream_dials_total", "result", "error", m.dialsErr.Load())
	b = head(b, "h2ping_upstream_errors_total", "Upstream failures, by kind (dial, tls, alpn, ping_timeout, reset, other).", "counter")
	for k := range numKinds {
		b = sample(b, "h2ping_upstream_errors_total", "kind", kindNames[k], m.errs[k].Load())
	}
	up := 0.0
	if m.upstreamUp.Load() {
		up = 1
	}
	b = gauge(b, "h2ping_upstream_up", "1 after a successful upstream dial or response, 0 after a failure (and before the first dial).", up)

	b = counter(b, "h2ping_pings_sent_total", "HTTP/2 PING frames sent upstream.", m.pingsSent.Load())
	b = counter(b, "h2ping_ping_acks_total", "HTTP/2 PING acknowledgements received for them.", m.pingAcks.Load())
	b = gauge(b, "h2ping_ping_rtt_seconds", "Round trip of the last acknowledged PING (0 before the first).", math.Float64frombits(m.pingRTT.Load()))
	b = counter(b, "h2ping_goaways_total", "GOAWAY frames received from the upstream.", m.goaways.Load())
	b = counter(b, "h2ping_retries_total", "Requests re-sent on another connection after a GOAWAY or REFUSED_STREAM refusal.", m.retries.Load())
	b = counter(b, "h2ping_rotations_total", "Upstream connections retired by -max-conn-age.", m.rotations.Load())
	b = counter(b, "h2ping_nvcf_pending_total", "NVCF 202s with NVCF-REQID followed with status polls.", m.nvcfPending.Load())
	b = counter(b, "h2ping_nvcf_polls_total", "NVCF status polls sent (not counted in h2ping_requests_total).", m.nvcfPolls.Load())
	b = head(b, "h2ping_nvcf_outcomes_total", "How followed NVCF requests ended (answered, budget, client_gone, error).", "counter")
	for o := range numNVCFOutcomes {
		b = sample(b, "h2ping_nvcf_outcomes_total", "outcome", nvcfOutcomeNames[o], m.nvcfOutcomes[o].Load())
	}
	b = m.duration.appendText(b, "h2ping_request_duration_seconds",
		"Time from a client request to the end of its response (answered requests; waits of an hour are the point).")
	b = m.ttfb.appendText(b, "h2ping_time_to_first_byte_seconds",
		"Time from a client request to the upstream's response head (requests the upstream answered).")
	b = gauge(b, "h2ping_request_duration_max_seconds", "Longest request duration of this process (answered requests; 0 before the first).",
		float64(m.durationMax.Load())/1e9)
	b = head(b, "h2ping_build_info", "Build of this h2-ping-sidecar; always 1.", "gauge")
	return append(b, buildInfoSample...)
}

func head(b []byte, name, help, typ string) []byte {
	b = append(b, "# HELP "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, help...)
	b = append(b, "\n# TYPE "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, typ...)
	return append(b, '\n')
}

func counter(b []byte, name, help string, v uint64) []byte {
	b = head(b, name, help, "counter")
	b = append(b, name...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, v, 10)
	return append(b, '\n')
}

func gauge(b []byte, name, help string, v float64) []byte {
	b = head(b, name, help, "gauge")
	b = append(b, name...)
	b = append(b, ' ')
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	return append(b, '\n')
}

// sample appends one labelled counter sample; label values here are ours (codes, fixed
// words), so they need no escaping.
func sample(b []byte, name, label, value string, v uint64) []byte {
	b = append(b, name...)
	b = append(b, '{')
	b = append(b, label...)
	b = append(b, `="`...)
	b = append(b, value...)
	b = append(b, `"} `...)
	b = strconv.AppendUint(b, v, 10)
	return append(b, '\n')
}
