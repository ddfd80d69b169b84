package main

// proxy.go owns what happens to one request between reading its head (frontend.go) and
// writing its response (response.go): the body read before the upstream wait, the
// outgoing request (origin rewrite, upstream Host, hop-by-hop headers), and the one-line
// 502. It keeps the behaviour the proxy had on httputil.ReverseProxy (same outgoing
// request, same 502 body and log line), without ReverseProxy's per-request copies.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// serveOne answers one request whose first bytes are pending. keep: the connection may
// carry another request; linger: it is closed after an error answer with input unread.
func (c *clientConn) serveOne() (keep, linger bool) {
	req, ok := c.readRequest()
	if !ok {
		return false, true
	}
	keep = !req.Close

	// Expect as net/http handles it: 100 Continue before reading an HTTP/1.1 body (the
	// header is still forwarded; the upstream's own 100 is not waited for), 417 for any
	// other expectation.
	if expect := req.Header.Get("Expect"); expect != "" {
		if !strings.EqualFold(expect, "100-continue") {
			c.writePlain(http.StatusExpectationFailed, "")
			return false, true
		}
		if req.ProtoAtLeast(1, 1) && req.Body != http.NoBody {
			if _, err := io.WriteString(c.rwc, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
				return false, false
			}
		}
	}

	// A body up to -retry-body-limit is read now, so the reader goes back to the pool
	// before the wait and the body can be re-sent after a GOAWAY; a larger one streams
	// from the reader, which the connection then keeps until the response is done.
	var buf []byte
	var stream *onceBody
	if req.Body != http.NoBody {
		b, rest, err := readBody(req.Body, req.ContentLength, c.s.cfg.RetryBodyLimit)
		if err != nil {
			if !isNetError(err) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
				c.writePlain(http.StatusBadRequest, "malformed request body")
			}
			return false, true
		}
		if rest != nil {
			stream = &onceBody{r: rest, onEOF: c.startWatch}
		} else {
			buf = b
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.cancel = cancel
	if stream == nil {
		c.releaseReader()
		c.startWatch()
	}
	out := c.s.outgoing(req, ctx)
	resp, err := c.s.up.send(out, buf, stream)
	// A drain that began while the request waited answers it with Connection: close.
	keep = keep && !c.s.draining.Load()
	if err == nil {
		keep = c.writeResponse(ctx, req, resp, keep)
	} else if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// The client went away: not an upstream failure, nobody reads an answer.
		keep = false
	} else {
		keep = c.writeBadGateway(req, err, keep)
	}
	bodyDone := c.stopWatch()
	if stream != nil {
		if !bodyDone {
			// The upstream answered before the client's body was read to its end: the
			// rest cannot be skipped safely, and the transport may still read it. The
			// watcher state stays stopped, so the body's late EOF starts no watcher.
			c.forgetReader()
			return false, false
		}
		c.releaseReader()
	}
	if !keep || c.gone {
		return false, false
	}
	c.resetWatch()
	return true, false
}

// hopHeaders are removed from requests and responses (RFC 9110 section 7.6.1, and the
// older ones ReverseProxy removes too), besides those the Connection header names.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		delete(h, name)
	}
}

// outgoing turns the client's request into the upstream's, as the ReverseProxy Rewrite
// did: method, path and query kept; scheme and host the upstream's; Host empty, so the
// origin sees its own name as :authority; hop-by-hop and client-sent forwarding headers
// removed, none added; no Go User-Agent added when the client sent none. The head is
// reused, not copied (the client's request is not needed again).
func (s *server) outgoing(req *http.Request, ctx context.Context) *http.Request {
	out := req.WithContext(ctx)
	out.URL.Scheme = s.cfg.Upstream.Scheme
	out.URL.Host = s.cfg.Upstream.Host
	out.URL.RawQuery = cleanQuery(out.URL.RawQuery)
	out.Host = ""
	out.RequestURI = ""
	out.Close = false
	h := out.Header
	teTrailers := false
	for _, v := range h["Te"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "trailers") {
				teTrailers = true
			}
		}
	}
	removeHopHeaders(h)
	if teTrailers {
		h["Te"] = []string{"trailers"}
	}
	delete(h, "Host")
	delete(h, "Forwarded")
	delete(h, "X-Forwarded-For")
	delete(h, "X-Forwarded-Host")
	delete(h, "X-Forwarded-Proto")
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""}
	}
	return out
}

// cleanQuery drops query parameters that url.ParseQuery rejects (a ';' or a bad %
// escape), as ReverseProxy does; a clean query, the usual case, is returned unchanged.
func cleanQuery(q string) string {
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return reencodeQuery(q)
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return reencodeQuery(q)
			}
			i += 2
		}
	}
	return q
}

func reencodeQuery(q string) string {
	v, _ := url.ParseQuery(q)
	return v.Encode()
}

func isHex(b byte) bool {
	return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

// writeBadGateway answers an upstream failure with 502 and one line naming the error.
// Only method and path are logged: headers (Authorization) and the query never are.
func (c *clientConn) writeBadGateway(req *http.Request, err error, keep bool) bool {
	msg := "h2-ping-sidecar: upstream " + c.s.upstreamName + ": " + oneLine(err.Error())
	c.s.logger.Printf("%s %s: 502: %s", req.Method, req.URL.Path, oneLine(err.Error()))
	return c.writeSimple(req, http.StatusBadGateway, []string{
		"Content-Type", "text/plain; charset=utf-8",
		"X-Content-Type-Options", "nosniff",
	}, msg+"\n", keep)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
