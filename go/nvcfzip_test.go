package main

// nvcfzip_test.go: NVCF's large results (a 302 to a zip) through the proxy, against
// nvcfOrigin (nvcforigin_test.go).

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

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
