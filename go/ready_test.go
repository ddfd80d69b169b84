package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestReadyInfoMarshalIsJSON(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:1250", "[fe80::1%eth0]:80", "a\"b\\c\x01\n", "caf\u00e9:1", "bad\xffutf8"} {
		in := readyInfo{PID: 4242, Listen: listen}
		var got readyInfo
		if err := json.Unmarshal(in.marshal(), &got); err != nil {
			t.Fatalf("marshal(%q) = %q: got %v; want valid JSON", listen, in.marshal(), err)
		}
		want := in
		if listen == "bad\xffutf8" {
			want.Listen = "bad\ufffdutf8"
		}
		if got != want {
			t.Fatalf("round trip of %+v: got %+v; want %+v", in, got, want)
		}
	}
}

func TestRemoveReadyFileKeepsASuccessorsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ready")
	ours := readyInfo{PID: 10, Listen: "127.0.0.1:1"}
	if err := writeReadyFile(path, readyInfo{PID: 11, Listen: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	removeReadyFile(path, ours)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("successor's ready file: got %v; want it kept", err)
	}
	if err := writeReadyFile(path, ours); err != nil {
		t.Fatal(err)
	}
	removeReadyFile(path, ours)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("own ready file: got %v; want it removed", err)
	}
}
