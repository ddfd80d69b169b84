package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestReadyFileIsJSONWithTheTwoKeys(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.ready")
	info := readyInfo{PID: 4242, Listen: "[fe80::1%eth0]:80"}
	if err := writeReadyFile(path, info); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("ready file %q: got %v; want JSON", data, err)
	}
	if len(got) != 2 || got["pid"] != 4242.0 || got["listen"] != info.Listen {
		t.Fatalf("ready file: got %v; want exactly pid 4242 and listen %q (metrics only when set)", got, info.Listen)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("ready file mode: got %v, %v; want 0644 (a launcher of another user reads it)", st, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".x.ready.tmp-*")); len(left) != 0 {
		t.Fatalf("temp files left: got %v; want none", left)
	}
}

func TestReadyFileNeverWritesThroughAPlantedLink(t *testing.T) {
	// The old protocol's fixed temp name: a link planted there must not be followed.
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, ".x.ready.tmp")); err != nil {
		t.Fatal(err)
	}
	if err := writeReadyFile(filepath.Join(dir, "x.ready"), readyInfo{PID: 7, Listen: "127.0.0.1:9"}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(victim); string(data) != "keep me" {
		t.Fatalf("victim behind a symlink: got %q; want it untouched", data)
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
