package main

// nvcf.go owns NVIDIA Cloud Functions' long-request protocol (SPEC, "NVCF: long requests
// past the poll window"). NVCF holds a request for at most its poll window
// (NVCF-POLL-SECONDS), then answers 202 with NVCF-REQID; the result is fetched with
// GET .../v2/nvcf/pexec/status/{reqid}, which long-polls the same way. OpenAI clients take
// that 202's metadata body for the completion, silently. nvcfFollower is a RoundTripper
// around the upstream: it follows the 202 with status polls and hands ReverseProxy only
// the final answer, so the client, the metrics (TTFB, duration) and the access log see one
// request with its real answer. A result over 5 MiB comes as a 302 to a zip (nvcfzip.go).
//
// Facts from NVIDIA/nvcf (src/invocation-plane-services/http-invocation/crates/server/src):
// every gateway answer carries nvcf-reqid and nvcf-status (routes/post_pexec.rs
// handle_streaming_response); platform errors (problem+json, e.g. "worker did not
// acknowledge the status request") carry no nvcf-reqid; a non-202 status answer purges the
// id, so a second poll after the answer gets 404. On a host whose first label is a UUID
// (`<function-id>.invocation.api.nvcf.nvidia.com`) every path goes to the function itself
// (app.rs host_router, routes/tlb.rs): its status must be polled elsewhere (defaults below).
//
// Must not: re-send the original request (only GETs of the status URL, idempotent, are
// retried), send a poll anything but the original Authorization, NVCF-POLL-SECONDS and
// Accept, or log or store a header value (only the request id, a plain token, is named).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	hdrReqID       = "Nvcf-Reqid"
	hdrPollSeconds = "Nvcf-Poll-Seconds"
	// statusPath is NVCF's status route (app.rs); {reqid} is replaced by the id.
	statusPath = "/v2/nvcf/pexec/status/{reqid}"
	// nvcfStatusHost serves the status of NVCF-hosted functions whatever host invoked them
	// (public clients of ai.api.nvidia.com and of function hosts poll it).
	nvcfStatusHost = "api.nvcf.nvidia.com"
	// maxPollWindow is NVCF's limit for NVCF-POLL-SECONDS (post_pexec.rs poll_duration).
	maxPollWindow = 3600 * time.Second
	// pollBackoffMin/Max space the retries of a poll that failed in transit or got a
	// platform 5xx: short, since a status GET is idempotent and the client is waiting.
	pollBackoffMin = 100 * time.Millisecond
	pollBackoffMax = 2 * time.Second
	// minPollGap is the least time between the starts of two polls that answered 202:
	// NVCF holds each poll for its window (at least 1 s), so this never slows a real long
	// poll, but an endpoint that answers 202 at once cannot turn it into a busy loop.
	minPollGap = time.Second
	// maxDiscard bounds how much of a 202's small metadata body is read before closing.
	maxDiscard = 64 << 10
)

// nvcfOutcome is the label of h2ping_nvcf_outcomes_total: how a followed 202 ended.
type nvcfOutcome int

const (
	nvcfAnswered nvcfOutcome = iota
	nvcfBudget
	nvcfClientGone
	nvcfError
	numNVCFOutcomes
)

var nvcfOutcomeNames = [numNVCFOutcomes]string{"answered", "budget", "client_gone", "error"}

// NVCF is the validated part of Config for the protocol (flags -nvcf-*).
type NVCF struct {
	// Follow polls the status URL on a 202 with NVCF-REQID and unpacks a 302 zip result
	// (-nvcf-follow, default true); false passes both through as any proxy would.
	Follow bool
	// PollWindow sets NVCF-POLL-SECONDS on requests lacking it (-nvcf-poll-window, whole
	// seconds 1s-3600s; 0 = unset, NVCF's own default of 60 s applies).
	PollWindow time.Duration
	// Budget bounds a followed request from its start to its answer (-nvcf-budget, 60m).
	Budget time.Duration
	// StatusURL is the status template with {reqid} (-nvcf-status-url, default derived
	// from the upstream by defaultStatusURL). StatusOrigin, StatusAddr, StatusServerName
	// and StatusEgress are its origin as Config holds the upstream's.
	StatusURL        string
	StatusOrigin     *url.URL
	StatusAddr       string
	StatusServerName string
	StatusEgress     *egressProxy
}

type nvcfFlags struct {
	follow                        *bool
	pollWindow, budget, statusURL *string
}

// defineNVCFFlags registers the -nvcf-* flags on fs (config.go calls it once).
func defineNVCFFlags(fs *flag.FlagSet) *nvcfFlags {
	return &nvcfFlags{
		follow:     fs.Bool("nvcf-follow", true, "on an NVCF 202 with NVCF-REQID, poll the status URL and answer with the result (false = pass 202s through)"),
		pollWindow: fs.String("nvcf-poll-window", "", "set NVCF-POLL-SECONDS to this `duration` (whole seconds, 1s-3600s) on requests lacking it (default unset)"),
		budget:     fs.String("nvcf-budget", "60m", "answer 504 when a followed NVCF request has no result after this `duration` from its start (> 0)"),
		statusURL:  fs.String("nvcf-status-url", "", "NVCF status `template` with {reqid}, https (default: the upstream's origin + "+statusPath+"; api.nvcf.nvidia.com for NVCF's own hosts)"),
	}
}

// validate checks the flags against the already validated upstream.
func (f *nvcfFlags) validate(upstream *url.URL, getenv func(string) string) (NVCF, error) {
	n := NVCF{Follow: *f.follow}
	var err error
	if v := *f.pollWindow; v != "" {
		if n.PollWindow, err = parseDuration("nvcf-poll-window", v); err != nil {
			return n, err
		}
		if n.PollWindow < time.Second || n.PollWindow > maxPollWindow || n.PollWindow%time.Second != 0 {
			return n, badFlag("nvcf-poll-window", v, "must be whole seconds from 1s to 3600s (NVCF's limits); try 60s")
		}
	}
	if n.Budget, err = parseDuration("nvcf-budget", *f.budget); err != nil {
		return n, err
	}
	if n.Budget <= 0 {
		return n, badFlag("nvcf-budget", *f.budget, "must be above 0; try 60m, below your client's own timeout")
	}
	tmpl := *f.statusURL
	if tmpl == "" {
		tmpl = defaultStatusURL(upstream)
	}
	u, err := url.Parse(strings.ReplaceAll(tmpl, "{reqid}", "x"))
	shown := tmpl // as given (braces unescaped), but never with userinfo
	if err == nil && u.User != nil {
		shown = strings.Replace(tmpl, u.User.String()+"@", "", 1)
	} else if err != nil {
		shown = redactURL(tmpl)
	}
	switch {
	case err != nil:
		return n, badFlag("nvcf-status-url", shown, "not a URL; give https://host/v2/nvcf/pexec/status/{reqid}")
	case u.Scheme != "https":
		return n, badFlag("nvcf-status-url", shown, "must be https:// (polls run on HTTP/2 connections)")
	case u.User != nil:
		return n, badFlag("nvcf-status-url", shown, "must not carry userinfo; polls send the request's own Authorization")
	case u.Hostname() == "":
		return n, badFlag("nvcf-status-url", shown, "has no host; give https://host/v2/nvcf/pexec/status/{reqid}")
	case !strings.Contains(tmpl, "{reqid}"):
		return n, badFlag("nvcf-status-url", shown, "must contain {reqid}, where the request id goes")
	}
	if n.StatusOrigin, n.StatusAddr, n.StatusServerName, err = validateUpstream(u.Scheme + "://" + u.Host); err != nil {
		return n, badFlag("nvcf-status-url", shown, "host or port is not valid (%v)", err)
	}
	if n.StatusEgress, err = egressFromEnvironment(n.StatusOrigin, getenv); err != nil {
		return n, err
	}
	n.StatusURL = tmpl
	return n, nil
}

// defaultStatusURL is where NVCF serves the status of a request made to upstream. A host
// whose first label is a UUID routes every path to the function (routes/tlb.rs), so its
// status lives on the host without the UUID labels: api.nvcf.nvidia.com for NVCF's own
// `<function-id>.invocation.api.nvcf.nvidia.com`, `invocation.<domain>` for a self-hosted
// `<function-id>.invocation.<domain>` (docs/user/gateway-routing.md routes both names to
// the invocation service). ai.api.nvidia.com-style hosts (`*.api.nvidia.com`) front NVCF
// functions whose status is at api.nvcf.nvidia.com. Any other upstream: its own origin.
func defaultStatusURL(upstream *url.URL) string {
	host := strings.ToLower(upstream.Hostname())
	if strings.HasSuffix(host, ".api.nvidia.com") {
		return "https://" + nvcfStatusHost + statusPath
	}
	rest, stripped := host, false
	for i := 0; i < 2; i++ { // `<version-id>.<function-id>.rest` at most (split_hostname)
		label, after, ok := strings.Cut(rest, ".")
		if !ok || !isUUID(label) {
			break
		}
		rest, stripped = after, true
	}
	if !stripped {
		return upstream.Scheme + "://" + upstream.Host + statusPath
	}
	if rest == "nvcf.nvidia.com" || strings.HasSuffix(rest, ".nvcf.nvidia.com") {
		return "https://" + nvcfStatusHost + statusPath
	}
	if port := upstream.Port(); port != "" {
		rest = net.JoinHostPort(rest, port)
	}
	return "https://" + rest + statusPath
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// plainToken reports whether id can go into a URL path and a log line as it is: NVCF's
// ids are UUIDs; anything with other bytes is not followed.
func plainToken(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-' || c == '_' || c == '.' || c == '~') {
			return false
		}
	}
	return true
}

// nvcfFollower is the proxy's Transport when -nvcf-follow or -nvcf-poll-window is set.
type nvcfFollower struct {
	next   http.RoundTripper // the upstream (retrybody.go)
	status http.RoundTripper // the status host: next itself, or its own upstream
	n      NVCF
	window string // NVCF-POLL-SECONDS value of -nvcf-poll-window, "" when unset
	cfg    *Config
	logf   func(format string, args ...any)
	zipper zipFetcher // nvcfzip.go
}

// newTransport returns the proxy's Transport: up itself when nothing of NVCF's protocol
// is on (no cost at all), else a follower around it. A status host other than the
// upstream gets its own upstream (pool, PINGs, TLS roots, -ca-file, egress route), closed
// with up by closeNVCF.
func newTransport(cfg *Config, up *upstream, logger *log.Logger) http.RoundTripper {
	n := cfg.NVCF
	if !n.Follow && n.PollWindow == 0 {
		return up
	}
	f := &nvcfFollower{next: up, status: up, n: n, cfg: cfg, logf: logger.Printf}
	if n.PollWindow > 0 {
		f.window = strconv.FormatInt(int64(n.PollWindow/time.Second), 10)
	}
	if n.Follow && n.StatusAddr != cfg.UpstreamAddr {
		sc := *cfg
		sc.Upstream, sc.UpstreamAddr, sc.ServerName, sc.Egress = n.StatusOrigin, n.StatusAddr, n.StatusServerName, n.StatusEgress
		su := newUpstream(&sc)
		su.firstPing = nil // the start-up check is the upstream's, not the status host's
		su.logf = logger.Printf
		su.pool = newPool(su.newClientConn, sc.MaxConnAge)
		up.statusUp = su
		f.status = su
	}
	return f
}

// closeNVCF closes the status host's connections, if it has its own; after the drain.
func (u *upstream) closeNVCF() {
	if u.statusUp != nil {
		u.statusUp.pool.close()
	}
}

// RoundTrip sends req once and, on an NVCF 202 or 302 zip, turns it into the final
// answer. Any other response costs one status comparison.
func (f *nvcfFollower) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	// req is ReverseProxy's own outgoing copy (its Header a clone): safe to set.
	if f.window != "" && req.Header.Get(hdrPollSeconds) == "" {
		req.Header.Set(hdrPollSeconds, f.window)
	}
	resp, err := f.next.RoundTrip(req)
	if err != nil || !f.n.Follow {
		return resp, err
	}
	switch resp.StatusCode {
	case http.StatusAccepted:
		return f.follow(req, resp, start)
	case http.StatusFound:
		if id := resp.Header.Get(hdrReqID); plainToken(id) && resp.Header.Get("Location") != "" {
			return f.unzip(req, resp, id, false)
		}
	}
	return resp, nil
}

// follow polls for the answer to the 202 resp until one that is not 202, the budget or
// the client's departure.
func (f *nvcfFollower) follow(req *http.Request, resp *http.Response, start time.Time) (*http.Response, error) {
	vals, ok := resp.Header[hdrReqID]
	if !ok {
		return resp, nil // a 202 of something else than NVCF: an ordinary response
	}
	id := ""
	if len(vals) == 1 {
		id = vals[0]
	}
	if !plainToken(id) {
		stats.nvcfOutcomes[nvcfError].Add(1)
		f.logf("%s %s: NVCF 202 whose NVCF-REQID is empty or not a plain token (%d bytes): passed through", req.Method, req.URL.Path, len(id))
		return resp, nil
	}
	discard(resp.Body)
	stats.nvcfPending.Add(1)
	ctx := req.Context()
	markNVCF(ctx, id, 0)
	statusURL := strings.ReplaceAll(f.n.StatusURL, "{reqid}", id)
	deadline := start.Add(f.n.Budget)
	backoff := pollBackoffMin
	lastFailure := ""
	// wait sleeps d, cut short by the client leaving or the budget ending (the loop's
	// checks then decide).
	wait := func(d time.Duration) {
		t := time.NewTimer(min(d, time.Until(deadline)))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	for polls := 1; ; polls++ {
		if ctx.Err() != nil {
			stats.nvcfOutcomes[nvcfClientGone].Add(1)
			return nil, ctx.Err()
		}
		left := time.Until(deadline)
		if left <= 0 {
			return f.overBudget(id, lastFailure), nil
		}
		// The poll's context is the client's, ended early only by the budget's timer, and
		// only while waiting for the head: an answer that streams past the budget is
		// still the answer.
		pctx, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(left, cancel)
		pr, err := http.NewRequestWithContext(pctx, http.MethodGet, statusURL, nil)
		if err != nil { // the template was checked at start; a plain token keeps it a URL
			timer.Stop()
			cancel()
			stats.nvcfOutcomes[nvcfError].Add(1)
			return f.fail(req, id, "status URL: "+err.Error()), nil
		}
		for _, h := range [...]string{"Authorization", hdrPollSeconds, "Accept"} {
			if v, ok := req.Header[h]; ok {
				pr.Header[h] = v
			}
		}
		pollStart := time.Now()
		stats.nvcfPolls.Add(1)
		markNVCF(ctx, id, polls)
		presp, err := f.status.RoundTrip(pr)
		if !timer.Stop() { // the budget ended the poll (or ends just as its head came)
			if err == nil {
				presp.Body.Close()
			}
			cancel()
			if ctx.Err() == nil {
				return f.overBudget(id, lastFailure), nil
			}
			continue // the client left meanwhile: counted at the loop's top
		}
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				continue
			}
			// Reset, GOAWAY, unanswered PING, dial error: the GET is idempotent, so again.
			lastFailure = oneLine(err.Error())
			wait(backoff)
			backoff = min(2*backoff, pollBackoffMax)
			continue
		}
		switch code := presp.StatusCode; {
		case code == http.StatusAccepted:
			discard(presp.Body)
			cancel()
			backoff, lastFailure = pollBackoffMin, ""
			if gap := minPollGap - time.Since(pollStart); gap > 0 {
				wait(gap)
			}
			continue
		case code >= 500 && presp.Header.Get(hdrReqID) == "":
			// No nvcf-reqid: the platform's or a load balancer's error about the poll, not
			// the function's answer (which always carries it): poll again.
			discard(presp.Body)
			cancel()
			lastFailure = "status endpoint answered " + presp.Status
			wait(backoff)
			backoff = min(2*backoff, pollBackoffMax)
			continue
		case code == http.StatusFound && presp.Header.Get("Location") != "":
			discard(presp.Body)
			cancel()
			if presp.Header.Get(hdrReqID) == "" {
				presp.Header.Set(hdrReqID, id)
			}
			return f.unzip(req, presp, id, true)
		}
		stats.nvcfOutcomes[nvcfAnswered].Add(1)
		if presp.Header.Get(hdrReqID) == "" { // e.g. a 404 for an id NVCF forgot: name it
			presp.Header.Set(hdrReqID, id)
		}
		presp.Body = &cancelOnClose{ReadCloser: presp.Body, cancel: cancel}
		return presp, nil
	}
}

// overBudget is the 504 for a followed request still unanswered at the budget.
func (f *nvcfFollower) overBudget(id, lastFailure string) *http.Response {
	stats.nvcfOutcomes[nvcfBudget].Add(1)
	msg := fmt.Sprintf("h2-ping-sidecar: NVCF request %s not answered within %s (-nvcf-budget)", id, f.n.Budget)
	if lastFailure != "" {
		msg += "; last status poll: " + lastFailure
	}
	f.logf("%s", msg)
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
		ReqID string `json:"nvcf_reqid"`
	}{msg, id})
	return proxyResponse(http.StatusGatewayTimeout, id, "application/json", append(body, '\n'))
}

// fail is the 502 for an answer the proxy cannot deliver (a zip it cannot unpack).
func (f *nvcfFollower) fail(req *http.Request, id, why string) *http.Response {
	msg := "h2-ping-sidecar: NVCF request " + id + ": " + oneLine(why)
	f.logf("%s %s: 502: %s", req.Method, req.URL.Path, msg)
	return proxyResponse(http.StatusBadGateway, id, "text/plain; charset=utf-8", []byte(msg+"\n"))
}

// proxyResponse is an answer of the proxy's own, given to ReverseProxy as the upstream's.
func proxyResponse(code int, id, ctype string, body []byte) *http.Response {
	h := http.Header{}
	h.Set("Content-Type", ctype)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set(hdrReqID, id)
	return &http.Response{
		StatusCode: code, Status: strconv.Itoa(code) + " " + http.StatusText(code),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(string(body))), ContentLength: int64(len(body)),
	}
}

// discard reads a little of a body so that a small one ends its stream cleanly, then
// closes it (a larger one is reset, which is all a 202's body deserves).
func discard(b io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(b, maxDiscard))
	b.Close()
}

// cancelOnClose releases the answer's poll context once ReverseProxy is done with it.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// markNVCF records the request id and polls so far on the request's access line.
func markNVCF(ctx context.Context, id string, polls int) {
	if s := slotOf(ctx); s != nil && s.w != nil {
		s.w.access.nvcfReqID, s.w.access.nvcfPolls = id, polls
	}
}
