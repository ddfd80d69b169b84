package main

// probe.go owns `h2-ping-sidecar -probe`: does the path to an upstream drop idle HTTP/2
// connections, and do PINGs keep one open? It opens two connections side by side with the
// proxy's own dialer (TCP or the egress proxy's CONNECT tunnel, the same TLS configuration,
// -ca-file, ALPN h2 only), both idle with no request: one silent (no PING ever), one PINGed
// by net/http's own keep-alive (HTTP2Config.SendPingTimeout = -ping-interval, as the proxy
// does). After -for, or once both are closed, it reports for each whether it is open and,
// if not, after how long and how it closed (EOF, reset, GOAWAY and its code, a lost PING),
// the PINGs sent and answered, and a verdict. With -request PATH it also sends one GET on
// the PINGed connection and reports its status and time: a load balancer that times out a
// silent *response* (HAProxy's timeout server, an ALB's idle timeout with a request in
// flight) is what PINGs cannot fix, and an idle-only probe would miss it.
//
// The probe is in the proxy's binary, not in Python, so the route (direct or which egress
// proxy), the TLS roots and the ALPN rule are the proxy's own, not a copy that may drift.
// It prints JSON lines on stdout ("start", "progress" every second, then "result", or one
// "error"); `sidecar-fsm probe` renders them.
//
// With -probe-stdin it first reads one JSON line from stdin ({"headers": [[name, value]]}:
// request headers, kept off the command line, where any user could read them) and ends at
// once when stdin closes (its caller is gone). Header values are sent on the request and
// never printed, logged or kept beyond it.
//
// Must not: send more than the one GET asked for, or print a header value or userinfo.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// probeConfig is the validated -probe command line.
type probeConfig struct {
	cfg      *Config // the upstream, egress, TLS and ping settings, as the proxy parses them
	forDur   time.Duration
	request  string
	useStdin bool
	// forText and intervalText are -for and -ping-interval as the user wrote them, for the
	// verdict's words ("60s", not Go's "1m0s").
	forText, intervalText string
}

func parseProbeConfig(args []string, getenv func(string) string, usage io.Writer) (*probeConfig, error) {
	fs := flag.NewFlagSet("h2-ping-sidecar -probe", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	up := defineUpstreamFlags(fs) // the second connection is PINGed as the proxy would
	forFlag := fs.String("for", "400s", "how long to watch the two connections (`duration`, above -ping-interval)")
	request := fs.String("request", "", "also GET this `path` on the PINGed connection (an endpoint known to be slow)")
	useStdin := fs.Bool("probe-stdin", false, "read {\"headers\": [[name, value]]} from stdin first; end when stdin closes")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(usage)
			fmt.Fprintln(usage, "usage: h2-ping-sidecar -probe -upstream https://host[:port] [flags]")
			fs.PrintDefaults()
			return nil, flag.ErrHelp
		}
		return nil, &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{fmt.Sprintf("argument %q: unexpected; all options are flags", fs.Arg(0))}
	}
	forDur, err := parseDuration("for", *forFlag)
	if err != nil {
		return nil, err
	}
	if !flagSet(fs, "ping-interval") {
		// A quarter of -for, so that a short probe still sees a few PINGs; never longer than
		// the sidecar's own default.
		*up.pingInterval = strconv.FormatFloat(min(60, roundSeconds(forDur/4)), 'f', -1, 64) + "s"
	}
	// The proxy's own parsing for what the two share: one set of rules and words.
	cfg, err := parseConfig(up.args(), getenv, io.Discard)
	if err != nil {
		return nil, err
	}
	p := &probeConfig{cfg: cfg, forDur: forDur, request: *request, useStdin: *useStdin, forText: *forFlag, intervalText: *up.pingInterval}
	if p.forDur <= cfg.PingInterval {
		return nil, badFlag("for", *forFlag, "must be longer than -ping-interval %s, so that a PING is sent", *up.pingInterval)
	}
	if p.request != "" && !strings.HasPrefix(p.request, "/") {
		return nil, badFlag("request", p.request, "must be a path starting with /, e.g. /v1/slow")
	}
	return p, nil
}

// probeConn is what is known of one of the two connections; its methods are its watcher's
// connEvents.
type probeConn struct {
	mu       sync.Mutex
	opened   time.Time // when its handshake completed
	closedAt time.Time // zero while open
	how      string
	pings    int
	acks     int
	rtt      float64
}

func (c *probeConn) close(how string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closedAt.IsZero() {
		c.closedAt, c.how = time.Now(), how
	}
}

// pingSent counts the PINGs of an open connection only: the watcher counts a frame before
// it is written, and one the client tries after a GOAWAY or a close never left.
func (c *probeConn) pingSent([8]byte) {
	c.mu.Lock()
	if c.closedAt.IsZero() {
		c.pings++
	}
	c.mu.Unlock()
}

func (c *probeConn) pingAcked(_ [8]byte, rtt time.Duration) {
	c.mu.Lock()
	c.acks++
	c.rtt = rtt.Seconds()
	c.mu.Unlock()
}

func (c *probeConn) goawayReceived(code uint32) { c.close("GOAWAY " + h2CodeName(code)) }

func (c *probeConn) ended(err error) {
	var pe *pingTimeoutError
	switch {
	case errors.As(err, &pe):
		c.close("PING not answered within " + pe.timeout.String())
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		c.close("EOF (closed without GOAWAY)")
	case errors.Is(err, syscall.ECONNRESET):
		c.close("reset (TCP RST)")
	default:
		c.close(oneLine(err.Error()))
	}
}

// probeConnReport is one connection in the JSON.
type probeConnReport struct {
	Open         bool     `json:"open"`
	ClosedAfterS *float64 `json:"closed_after_s"`
	How          *string  `json:"how"`
	Pings        *int     `json:"pings,omitempty"`
	Acks         *int     `json:"acks,omitempty"`
	PingRTT      *float64 `json:"ping_rtt_seconds,omitempty"`
}

func (c *probeConn) report(pinged bool) probeConnReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := probeConnReport{Open: c.closedAt.IsZero()}
	if !r.Open {
		after := roundSeconds(c.closedAt.Sub(c.opened))
		how := c.how
		r.ClosedAfterS, r.How = &after, &how
	}
	if pinged {
		pings, acks := c.pings, c.acks
		r.Pings, r.Acks = &pings, &acks
		if acks > 0 {
			rtt := c.rtt
			r.PingRTT = &rtt
		}
	}
	return r
}

// probeRequest is the -request GET: its status (0 without a response) or error, and when.
type probeRequest struct {
	mu       sync.Mutex
	path     string
	started  time.Time
	done     bool
	status   int
	took     float64
	err      string
	acksThen int // PINGs answered on the connection while it waited
	// nvcfPending: a 202 with NVCF-REQID, NVCF's "still running, poll for it" (its value is
	// not kept).
	nvcfPending bool
}

type probeRequestReport struct {
	Path     string   `json:"path"`
	Done     bool     `json:"done"`
	Status   *int     `json:"status"`
	AfterS   *float64 `json:"after_s"`
	Error    *string  `json:"error"`
	TimedOut bool     `json:"timed_out"`
	// NVCFPending: a 202 with NVCF-REQID: NVCF's poll window ended, the request still runs.
	NVCFPending bool `json:"nvcf_pending"`
}

func (r *probeRequest) report() *probeRequestReport {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &probeRequestReport{Path: r.path, Done: r.done}
	if r.done {
		took := r.took
		out.AfterS = &took
		if r.status != 0 {
			status := r.status
			out.Status = &status
		}
		if r.err != "" {
			e := r.err
			out.Error = &e
		}
		out.TimedOut = r.status == http.StatusGatewayTimeout || r.err != ""
		out.NVCFPending = r.nvcfPending
	}
	return out
}

// probeResult is the "result" line (and, without verdict, a "progress" line).
type probeResult struct {
	Event          string              `json:"event"`
	Upstream       string              `json:"upstream"`
	Route          string              `json:"route"`
	ForS           float64             `json:"for_s"`
	PingIntervalS  float64             `json:"ping_interval_s"`
	ElapsedS       float64             `json:"elapsed_s"`
	Silent         probeConnReport     `json:"silent"`
	Pinged         probeConnReport     `json:"pinged"`
	Request        *probeRequestReport `json:"request"`
	Verdict        string              `json:"verdict,omitempty"`
	Answer         string              `json:"answer,omitempty"` // helps, not needed, cannot help, inconclusive
	ExitCode       int                 `json:"exit_code"`
	ProvedIdleOnly bool                `json:"idle_only"`
}

// roundSeconds keeps a duration to the millisecond, as seconds.
func roundSeconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// approx words a closing time as a user reads it: "~340s", "~3.0s".
func approx(s float64) string {
	if s >= 10 {
		return fmt.Sprintf("~%.0fs", s)
	}
	return fmt.Sprintf("~%.1fs", s)
}

// tryInterval is an interval to try under an idle limit of s seconds: half of it, in whole
// seconds from 2s up, so a PING goes out well before the path gives up.
func tryInterval(s float64) string {
	half := s / 2
	if half >= 2 {
		return fmt.Sprintf("%.0fs", math.Floor(half))
	}
	return strconv.FormatFloat(math.Max(0.1, math.Floor(half*10)/10), 'f', -1, 64) + "s"
}

// judge turns the two connections and the request into the verdict and the exit code.
func (r *probeResult) judge(p *probeConfig) {
	interval := p.intervalText
	silent, pinged, req := r.Silent, r.Pinged, r.Request
	timedOut := req != nil && req.TimedOut
	switch {
	case timedOut && *pinged.Acks > 0:
		// A 504 or a close while PINGs were answered: the path times out a silent response.
		r.Answer, r.ExitCode = "cannot help", 1
		r.Verdict = fmt.Sprintf("the load balancer times out a silent response after %s; PINGs cannot help: raise that timeout", approx(*req.AfterS))
	case !pinged.Open && *pinged.Pings == 0 && !(timedOut && req.Status != nil):
		// Closed before its first PING: the path's idle limit is below -ping-interval, so this
		// probe says nothing about PINGs. A 504 is still a response timeout (the case below).
		limit := *pinged.ClosedAfterS
		r.Answer, r.ExitCode = "inconclusive", 3
		r.Verdict = fmt.Sprintf("the path dropped the PINGed connection after %s, before its first PING (every %s): "+
			"inconclusive; a ping_interval under %s should keep it open: try --ping-interval %s",
			approx(limit), interval, approx(limit), tryInterval(limit))
	case !pinged.Open:
		r.Answer, r.ExitCode = "cannot help", 1
		r.Verdict = fmt.Sprintf("PINGs do not keep the connection open (closed after %.1fs with %s): the sidecar cannot help here",
			*pinged.ClosedAfterS, *pinged.How)
		if strings.Contains(*pinged.How, "ENHANCE_YOUR_CALM") {
			r.Verdict += "; ENHANCE_YOUR_CALM means the upstream refuses PINGs this often: try a longer --ping-interval"
		}
	case *pinged.Pings > 0 && *pinged.Acks == 0:
		r.Answer, r.ExitCode = "cannot help", 1
		r.Verdict = fmt.Sprintf("PINGs are not answered (%d sent, none answered): the sidecar cannot help here", *pinged.Pings)
	case timedOut:
		r.Answer, r.ExitCode = "cannot help", 1
		r.Verdict = fmt.Sprintf("the load balancer times out a silent response after %s, before any PING was answered; PINGs cannot help: raise that timeout", approx(*req.AfterS))
	case !silent.Open:
		r.Answer = "helps"
		r.Verdict = fmt.Sprintf("idle connections are dropped after %s; PINGs every %s keep them open: the sidecar helps here",
			approx(*silent.ClosedAfterS), interval)
	default:
		r.Answer = "not needed"
		r.Verdict = fmt.Sprintf("no idle drop within %s: the sidecar is not needed on this path", p.forText)
	}
	if r.ExitCode != 0 {
		return
	}
	switch {
	case req == nil:
		r.ProvedIdleOnly = true
		r.Verdict += " (idle connections only: --request PATH also tests a slow response)"
	case req.NVCFPending:
		r.Verdict += fmt.Sprintf("; got 202 with NVCF-REQID after %.1fs: NVCF's poll window ended (the request is still running on NVCF); "+
			"the sidecar follows these (nvcf.follow)", *req.AfterS)
	case req.Done && req.Status != nil:
		r.Verdict += fmt.Sprintf("; the request waited %.1fs and got %d", *req.AfterS, *req.Status)
	case !req.Done:
		r.ProvedIdleOnly = true
		r.Verdict += fmt.Sprintf(" (the request had no answer within %s: a response timeout is not ruled out)", p.forText)
	}
}

// runProbe is `h2-ping-sidecar -probe ...`; the exit code: 0 the sidecar helps or is not
// needed, 1 it cannot help or the upstream could not be probed, 2 bad flags, 3 inconclusive
// (the PINGed connection closed before its first PING).
func runProbe(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	p, err := parseProbeConfig(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	var headers [][2]string
	stop := make(chan struct{})
	if p.useStdin {
		in := bufio.NewReader(stdin)
		line, err := in.ReadBytes('\n')
		var doc struct {
			Headers [][2]string `json:"headers"`
		}
		if err != nil && len(line) == 0 || json.Unmarshal(line, &doc) != nil {
			fmt.Fprintln(stderr, "-probe-stdin: the first line of stdin is not {\"headers\": [[name, value], ...]}")
			return 2
		}
		headers = doc.Headers
		go func() {
			io.Copy(io.Discard, in) // returns when the caller closes stdin or goes away
			close(stop)
		}()
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	out := json.NewEncoder(stdout)
	route := "direct"
	if p.cfg.Egress != nil {
		route = "egress proxy " + p.cfg.Egress.String()
	}
	up := newUpstream(p.cfg)
	up.firstPing = nil
	silent, pinged := &probeConn{}, &probeConn{}
	up.onConn = func(ctx context.Context, w *watchedConn) {
		if c, ok := ctx.Value(probeConnKey{}).(*probeConn); ok {
			c.mu.Lock()
			c.opened = time.Now() // TLS and ALPN h2 done: from here on it is the path's to keep
			c.mu.Unlock()
			w.events = c
		}
	}
	dial := func(c *probeConn, sendPings bool) (*http.ClientConn, error) {
		tr := up.tr.Clone()
		tr.IdleConnTimeout = 0 // idle is the point; only the path may close it
		h2 := *up.tr.HTTP2
		if !sendPings {
			h2.SendPingTimeout = 0
		}
		tr.HTTP2 = &h2
		ctx := context.WithValue(context.Background(), probeConnKey{}, c)
		return tr.NewClientConn(ctx, "https", p.cfg.UpstreamAddr)
	}
	type dialed struct {
		cc  *http.ClientConn
		err error
	}
	results := make(chan dialed, 1)
	go func() {
		cc, err := dial(pinged, true)
		results <- dialed{cc, err}
	}()
	silentCC, err := dial(silent, false)
	pr := <-results
	if err == nil {
		err = pr.err
	}
	for _, cc := range []*http.ClientConn{silentCC, pr.cc} {
		if cc != nil {
			defer cc.Close()
		}
	}
	if err != nil {
		out.Encode(map[string]string{"event": "error", "upstream": p.cfg.Upstream.String(), "route": route, "error": oneLine(err.Error())})
		return 1
	}
	pingedCC := pr.cc
	started := time.Now()
	out.Encode(map[string]any{"event": "start", "upstream": p.cfg.Upstream.String(), "route": route,
		"for_s": p.forDur.Seconds(), "ping_interval_s": p.cfg.PingInterval.Seconds(), "request": p.request})

	var req *probeRequest
	reqDone := make(chan struct{})
	if p.request != "" {
		req = &probeRequest{path: p.request, started: time.Now()}
		go func() {
			defer close(reqDone)
			status, pending, errText := probeGet(pingedCC, p, headers)
			req.mu.Lock()
			req.done, req.status, req.nvcfPending, req.err = true, status, pending, errText
			req.took = roundSeconds(time.Since(req.started))
			req.mu.Unlock()
		}()
	} else {
		close(reqDone)
	}

	snapshot := func(event string) *probeResult {
		return &probeResult{Event: event, Upstream: p.cfg.Upstream.String(), Route: route,
			ForS: p.forDur.Seconds(), PingIntervalS: p.cfg.PingInterval.Seconds(),
			ElapsedS: roundSeconds(time.Since(started)), Silent: silent.report(false),
			Pinged: pinged.report(true), Request: req.report()}
	}
	deadline := time.NewTimer(p.forDur)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-deadline.C:
			return finishProbe(out, snapshot("result"), p)
		case <-stop:
			return 130
		case <-sigs:
			return 130
		case <-tick.C:
			s := snapshot("progress")
			select {
			case <-reqDone:
				if !s.Silent.Open && !s.Pinged.Open {
					return finishProbe(out, snapshot("result"), p)
				}
			default:
			}
			out.Encode(s)
		}
	}
}

func finishProbe(out *json.Encoder, r *probeResult, p *probeConfig) int {
	r.judge(p)
	out.Encode(r)
	return r.ExitCode
}

// probeConnKey marks the dial of one probe connection (its probeConn) in the context that
// reaches dialTLS.
type probeConnKey struct{}

// probeGet sends the one GET of -request on cc and reads its body to the end (discarded);
// its status, whether it is NVCF's 202 with NVCF-REQID, or the error in one line. Header
// values go on the request only.
func probeGet(cc *http.ClientConn, p *probeConfig, headers [][2]string) (int, bool, string) {
	req, err := http.NewRequest("GET", p.cfg.Upstream.String()+p.request, nil)
	if err != nil {
		return 0, false, oneLine(err.Error())
	}
	for _, h := range headers {
		req.Header.Add(h[0], h[1])
	}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		return 0, false, oneLine(err.Error())
	}
	defer resp.Body.Close()
	pending := resp.StatusCode == http.StatusAccepted && resp.Header.Get("NVCF-REQID") != ""
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return resp.StatusCode, pending, "the response broke off: " + oneLine(err.Error())
	}
	return resp.StatusCode, pending, ""
}

// flagSet reports whether name was given on the command line (not left at its default).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
