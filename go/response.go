package main

// response.go owns writing HTTP/1.1 responses to the client: the upstream's response
// (status, headers without hop-by-hop ones, framing, streaming) and the proxy's own short
// answers (502, 400, 431, ...).
//
// Memory: the write buffer comes from a pool when the response is ready and goes back
// when it is written, so a waiting request holds none. With net/http each waiting
// request held a 4 KiB connection writer and a 2 KiB response writer from its start;
// they were not resident while waiting, but the response burst of 2,000 requests
// wrote them all (~12 MiB of the peak RSS).
//
// Flushing: a fixed-length response is written once, at its end (head and body in one
// write(2) when they fit the buffer); text/event-stream and unknown-length responses are
// written after every upstream read, so SSE events reach the client one by one.

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// writerSize is the pooled response buffer, net/http's connection writer size: every
// fixed-length response up to it leaves in one write(2).
const writerSize = 4096

var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writerSize) }}

func getWriter(w io.Writer) *bufio.Writer {
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(w)
	return bw
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writerPool.Put(bw)
}

// writeResponse writes resp to the client and closes resp.Body, and reports whether the
// connection may carry another request. A write error means the client is gone: it is
// not logged, and closing the body resets the upstream stream. A body read error is
// logged unless ctx was cancelled (the client went away first); the connection is then
// closed mid-response, so the client sees a truncated body rather than a complete one.
func (c *clientConn) writeResponse(ctx context.Context, req *http.Request, resp *http.Response, keep bool) bool {
	body := resp.Body
	defer body.Close()
	is11 := req.ProtoAtLeast(1, 1)
	code := resp.StatusCode
	bodiless := req.Method == "HEAD" || code == http.StatusNoContent || code == http.StatusNotModified ||
		(code >= 100 && code < 200)
	h := resp.Header
	removeHopHeaders(h)

	var chunked, flushEach bool
	if !bodiless {
		switch {
		case is11 && (resp.ContentLength < 0 || len(resp.Trailer) > 0):
			// Announced trailers can only follow a chunked body.
			chunked = true
		case resp.ContentLength < 0:
			keep = false // HTTP/1.0: the body ends where the connection does
		}
		flushEach = resp.ContentLength < 0 || isEventStream(h)
	}

	bw := getWriter(c.rwc)
	defer putWriter(bw)
	writeStatusLine(bw, is11, code)
	for k, vv := range h {
		if !bodiless && k == "Content-Length" {
			continue // written below from resp.ContentLength, or not at all when chunked
		}
		for _, v := range vv {
			writeHeaderLine(bw, k, v)
		}
	}
	if _, ok := h["Date"]; !ok {
		writeDate(bw)
	}
	if !bodiless {
		if chunked {
			bw.WriteString("Transfer-Encoding: chunked\r\n")
			if len(resp.Trailer) > 0 {
				keys := make([]string, 0, len(resp.Trailer))
				for k := range resp.Trailer {
					keys = append(keys, k)
				}
				writeHeaderLine(bw, "Trailer", strings.Join(keys, ", "))
			}
		} else if resp.ContentLength >= 0 {
			bw.WriteString("Content-Length: ")
			bw.Write(strconv.AppendInt(bw.AvailableBuffer(), resp.ContentLength, 10))
			bw.WriteString("\r\n")
		}
	}
	writeConnection(bw, is11, keep)
	bw.WriteString("\r\n")
	if bodiless {
		return bw.Flush() == nil && keep
	}
	if flushEach {
		// A stream's client learns at once that the request got through; a silent
		// upstream may take long to send the first event.
		if bw.Flush() != nil {
			return false
		}
	}

	var readErr, writeErr error
	if chunked {
		readErr, writeErr = copyChunked(bw, resp, flushEach)
	} else {
		readErr, writeErr = copyBody(bw, body, flushEach)
	}
	if writeErr == nil && readErr == nil {
		writeErr = bw.Flush()
	}
	if readErr != nil && writeErr == nil && ctx.Err() == nil {
		c.s.logger.Printf("%s %s: upstream response body: %s", req.Method, req.URL.Path, oneLine(readErr.Error()))
	}
	return keep && readErr == nil && writeErr == nil
}

// copyBody copies a fixed-length or connection-delimited body into bw, reading straight
// into bw's free space (no second buffer), writing when bw is full or after every read
// when flushEach is set. The caller flushes the rest.
func copyBody(bw *bufio.Writer, body io.Reader, flushEach bool) (readErr, writeErr error) {
	for {
		if bw.Available() == 0 {
			if err := bw.Flush(); err != nil {
				return nil, err
			}
		}
		b := bw.AvailableBuffer()
		n, err := body.Read(b[:cap(b)])
		if n > 0 {
			bw.Write(b[:n]) // bw's own free space: the copy is in place
			if flushEach {
				if err := bw.Flush(); err != nil {
					return nil, err
				}
			}
		}
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

// chunkRoom is what a chunk needs besides its data: up to 16 bytes of hex size and CRLF
// in front (the data is read after them and moved down), and CRLF after.
const chunkRoom = 16 + 2

// copyChunked copies resp.Body into bw as HTTP/1.1 chunks, one chunk per upstream read,
// then the last chunk with the trailers the upstream sent.
func copyChunked(bw *bufio.Writer, resp *http.Response, flushEach bool) (readErr, writeErr error) {
	for {
		if bw.Available() < chunkRoom+256 {
			if err := bw.Flush(); err != nil {
				return nil, err
			}
		}
		b := bw.AvailableBuffer()
		b = b[:cap(b)]
		n, err := resp.Body.Read(b[16 : len(b)-2])
		if n > 0 {
			out := strconv.AppendInt(b[:0], int64(n), 16)
			out = append(out, '\r', '\n')
			out = append(out, b[16:16+n]...) // moves the data down onto itself (memmove)
			out = append(out, '\r', '\n')
			bw.Write(out)
			if flushEach {
				if err := bw.Flush(); err != nil {
					return nil, err
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err, nil
		}
	}
	bw.WriteString("0\r\n")
	for k, vv := range resp.Trailer { // filled in by the transport at the body's end
		for _, v := range vv {
			writeHeaderLine(bw, k, v)
		}
	}
	bw.WriteString("\r\n")
	return nil, nil
}

// writeSimple writes a short response of the proxy's own (the 502), with Content-Length,
// and reports whether the connection may carry another request.
func (c *clientConn) writeSimple(req *http.Request, code int, headers []string, body string, keep bool) bool {
	is11 := req.ProtoAtLeast(1, 1)
	bw := getWriter(c.rwc)
	defer putWriter(bw)
	writeStatusLine(bw, is11, code)
	for i := 0; i+1 < len(headers); i += 2 {
		writeHeaderLine(bw, headers[i], headers[i+1])
	}
	writeDate(bw)
	writeHeaderLine(bw, "Content-Length", strconv.Itoa(len(body)))
	writeConnection(bw, is11, keep)
	bw.WriteString("\r\n")
	if req.Method != "HEAD" {
		bw.WriteString(body)
	}
	return bw.Flush() == nil && keep
}

// writePlain answers a request that could not be read (or is refused before forwarding)
// the way net/http does, "400 Bad Request[: reason]" as a plain-text body, and the
// connection is closed after it.
func (c *clientConn) writePlain(code int, reason string) {
	text := strconv.Itoa(code) + " " + http.StatusText(code)
	if reason != "" {
		text += ": " + reason
	}
	msg := "HTTP/1.1 " + strconv.Itoa(code) + " " + http.StatusText(code) + "\r\n" +
		"Content-Type: text/plain; charset=utf-8\r\n" +
		"Content-Length: " + strconv.Itoa(len(text)) + "\r\n" +
		"Connection: close\r\n\r\n" + text
	c.rwc.Write([]byte(msg))
}

func writeStatusLine(bw *bufio.Writer, is11 bool, code int) {
	if is11 {
		bw.WriteString("HTTP/1.1 ")
	} else {
		bw.WriteString("HTTP/1.0 ")
	}
	if code < 100 || code > 999 {
		code = http.StatusBadGateway // the transport refuses such codes; never write one
	}
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(code), 10))
	bw.WriteByte(' ')
	if text := http.StatusText(code); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status code ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(code), 10))
	}
	bw.WriteString("\r\n")
}

// writeHeaderLine writes "key: value"; a CR or LF in the value becomes a space (the
// HTTP/2 transport already refuses them; this is net/http's second line of defence).
func writeHeaderLine(bw *bufio.Writer, key, value string) {
	bw.WriteString(key)
	bw.WriteString(": ")
	if strings.ContainsAny(value, "\r\n") {
		value = strings.NewReplacer("\r", " ", "\n", " ").Replace(value)
	}
	bw.WriteString(value)
	bw.WriteString("\r\n")
}

func writeDate(bw *bufio.Writer) {
	bw.WriteString("Date: ")
	bw.Write(time.Now().UTC().AppendFormat(bw.AvailableBuffer(), http.TimeFormat))
	bw.WriteString("\r\n")
}

// writeConnection says whether the connection stays open: HTTP/1.1 keeps it unless told,
// HTTP/1.0 closes it unless told.
func writeConnection(bw *bufio.Writer, is11, keep bool) {
	switch {
	case !keep:
		bw.WriteString("Connection: close\r\n")
	case !is11:
		bw.WriteString("Connection: keep-alive\r\n")
	}
}

// isEventStream reports a text/event-stream Content-Type (parameters allowed).
func isEventStream(h http.Header) bool {
	const sse = "text/event-stream"
	ct := h.Get("Content-Type")
	if len(ct) < len(sse) || !strings.EqualFold(ct[:len(sse)], sse) {
		return false
	}
	rest := strings.TrimLeft(ct[len(sse):], " \t")
	return rest == "" || rest[0] == ';'
}
