package main

// nvcfzip.go owns NVCF's large results. Per NVIDIA/nvcf's worker
// (src/compute-plane-services/worker-utils/worker/large.go and its caller), a function
// answer with a status below 400 whose body exceeds 5 MiB (or that wrote artifact files)
// is zipped: entry `<request-id>.response` holds the raw response body, one entry per
// artifact follows; the zip goes to S3 and the client gets `302` with only
// `Location: <pre-signed download URL>` (the gateway adds nvcf-reqid, nvcf-status:
// fulfilled). The original status and headers are not kept anywhere.
//
// The proxy fetches the zip (no Authorization: the URL is pre-signed, and a bearer token
// must not go to a storage host), spools it to an unlinked temp file (bounded memory, and
// nothing left on disk even after a crash), checks the entry, and answers 200 with the
// entry as the body, streamed from the file. Content-Type is sniffed (JSON when it looks
// like JSON, else net/http's sniffing), since the worker did not keep it. Anything it
// cannot deliver is a 502 with one line naming why: never a zip to a JSON client.
//
// Must not: hold a result in memory, send the client's headers to the download host, or
// log the Location's query (the signature).

import (
	"archive/zip"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
)

// maxResultZip caps a spooled result zip: a disk is bigger than memory, not endless.
const maxResultZip = 2 << 30

// zipFetcher is the Transport for download hosts, built at the first large result.
type zipFetcher struct {
	once sync.Once
	tr   *http.Transport
}

// transport fetches from any https host with the upstream's roots (system + -ca-file)
// and the egress route net/http's ProxyFromEnvironment picks for that host, as for the
// upstream. A download is an active transfer, not an idle wait: no PINGs are needed.
func (z *zipFetcher) transport(cfg *Config) *http.Transport {
	z.once.Do(func() {
		conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify}
		if len(cfg.CAPEM) > 0 {
			roots, err := x509.SystemCertPool()
			if err != nil || roots == nil {
				roots = x509.NewCertPool()
			}
			roots.AppendCertsFromPEM(cfg.CAPEM)
			conf.RootCAs = roots
		}
		z.tr = &http.Transport{
			Proxy:               proxyForUpstream,
			TLSClientConfig:     conf,
			ForceAttemptHTTP2:   true,
			DisableCompression:  true, // the zip's bytes as stored
			TLSHandshakeTimeout: dialTimeout,
			IdleConnTimeout:     idleConnTimeout,
		}
	})
	return z.tr
}

// unzip answers the 302 resp (body already closed or closed here) with the response in
// its zip. followed tells whether it ends a followed 202 (counted as an outcome).
func (f *nvcfFollower) unzip(req *http.Request, resp *http.Response, id string, followed bool) (*http.Response, error) {
	discard(resp.Body)
	fail := func(why string) (*http.Response, error) {
		if followed {
			stats.nvcfOutcomes[nvcfError].Add(1)
		}
		return f.fail(req, id, why), nil
	}
	loc, err := req.URL.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Scheme != "https" || loc.Host == "" {
		return fail("the large result's Location is not an https URL")
	}
	// redact keeps the signature (the query) out of every message.
	redact := func(s string) string {
		if loc.RawQuery != "" {
			s = strings.ReplaceAll(s, loc.RawQuery, "...")
		}
		return s
	}
	where := loc.Scheme + "://" + loc.Host + loc.EscapedPath()
	gr, err := http.NewRequestWithContext(req.Context(), http.MethodGet, loc.String(), nil)
	if err != nil {
		return fail("the large result's Location is not a URL")
	}
	zr, err := f.zipper.transport(f.cfg).RoundTrip(gr)
	if err != nil {
		if req.Context().Err() != nil {
			if followed {
				stats.nvcfOutcomes[nvcfClientGone].Add(1)
			}
			return nil, req.Context().Err()
		}
		return fail("fetching the result zip from " + where + ": " + redact(err.Error()))
	}
	defer zr.Body.Close()
	if zr.StatusCode != http.StatusOK {
		return fail(fmt.Sprintf("fetching the result zip from %s: %s", where, zr.Status))
	}
	file, err := os.CreateTemp("", "h2ping-nvcf-*.zip")
	if err != nil {
		return fail("no temp file for the result zip: " + err.Error())
	}
	// Unlinked at once: the open file is all that is needed, and nothing outlives it.
	os.Remove(file.Name())
	delivered := false
	defer func() {
		if !delivered {
			file.Close()
		}
	}()
	n, err := io.Copy(file, io.LimitReader(zr.Body, maxResultZip+1))
	if err != nil {
		if req.Context().Err() != nil {
			if followed {
				stats.nvcfOutcomes[nvcfClientGone].Add(1)
			}
			return nil, req.Context().Err()
		}
		return fail("reading the result zip from " + where + ": " + redact(err.Error()))
	}
	if n > maxResultZip {
		return fail(fmt.Sprintf("the result zip is larger than the proxy's cap of %d bytes", int64(maxResultZip)))
	}
	zf, err := zip.NewReader(file, n)
	if err != nil {
		return fail("the result zip cannot be unpacked: " + err.Error())
	}
	entry, others := findResponseEntry(zf, id)
	if entry == nil {
		return fail(fmt.Sprintf("the result zip holds no %s.response entry (%d entries)", id, len(zf.File)))
	}
	// Read it once before answering: a corrupt entry (CRC, truncated deflate) is then a
	// 502, not a 200 whose body breaks half way.
	if err := checkEntry(entry); err != nil {
		return fail("the result zip's " + entry.Name + " cannot be unpacked: " + err.Error())
	}
	body, err := entry.Open()
	if err != nil {
		return fail("the result zip's " + entry.Name + " cannot be unpacked: " + err.Error())
	}
	var peek [512]byte
	k, err := io.ReadFull(body, peek[:])
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		body.Close()
		return fail("the result zip's " + entry.Name + " cannot be unpacked: " + err.Error())
	}
	if others > 0 {
		f.logf("NVCF request %s: the result zip also holds %d artifact files, which an HTTP answer cannot carry; delivered %s only", id, others, entry.Name)
	}
	h := resp.Header.Clone()
	for _, k := range []string{"Location", "Content-Length", "Content-Encoding", "Content-Type"} {
		h.Del(k)
	}
	h.Set("Content-Type", sniffType(peek[:k]))
	size := int64(entry.UncompressedSize64)
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	if followed {
		stats.nvcfOutcomes[nvcfAnswered].Add(1)
	}
	delivered = true
	return &http.Response{
		StatusCode: http.StatusOK, Status: "200 OK",
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        h,
		Body:          &spooledBody{Reader: io.MultiReader(bytes.NewReader(peek[:k]), body), entry: body, file: file},
		ContentLength: size,
	}, nil
}

// findResponseEntry returns the `<id>.response` entry (the worker's name for the body)
// and how many other entries (artifacts) there are. Another request's entry is not it.
func findResponseEntry(zf *zip.Reader, id string) (*zip.File, int) {
	for _, e := range zf.File {
		if e.Name == id+".response" {
			return e, len(zf.File) - 1
		}
	}
	return nil, 0
}

func checkEntry(e *zip.File) error {
	rc, err := e.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	return err
}

// sniffType names the body's type: JSON when it starts like JSON (what an OpenAI or Gym
// client checks for), else net/http's sniffing.
func sniffType(head []byte) string {
	t := bytes.TrimLeft(head, " \t\r\n")
	if len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		return "application/json"
	}
	return http.DetectContentType(head)
}

// spooledBody streams the entry and closes the temp file after it.
type spooledBody struct {
	io.Reader
	entry io.Closer
	file  *os.File
}

func (b *spooledBody) Close() error {
	b.entry.Close()
	return b.file.Close()
}
