package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

type echoReply struct {
	Method, Path, Query, Host, Body, Auth, Proto string
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	json.NewEncoder(w).Encode(echoReply{
		Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host,
		Body: string(body), Auth: r.Header.Get("Authorization"), Proto: r.Proto,
	})
}

func TestForwardKeepsPathQueryAndUpstreamHost(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := startProxy(t, origin)
	req, _ := http.NewRequest("POST", p.url+"/v1/chat?x=1&y=two", strings.NewReader("hello"))
	req.Header.Set("Authorization", "Bearer sekrit-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got echoReply
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := echoReply{Method: "POST", Path: "/v1/chat", Query: "x=1&y=two", Host: strings.TrimPrefix(origin.URL, "https://"),
		Body: "hello", Auth: "Bearer sekrit-token", Proto: "HTTP/2.0"}
	if got != want {
		t.Fatalf("origin saw %+v; want %+v", got, want)
	}
	if strings.Contains(p.logs.String(), "sekrit") {
		t.Fatalf("log: got %q; want no Authorization value", p.logs.String())
	}
}
