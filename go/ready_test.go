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

func TestReadyFileReusesThePreparedTempFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		mode    os.FileMode
	}{
		{"empty and readable, as the launcher makes it", "", 0o644},
		{"stale content", "stale content, longer than the JSON will be ......", 0o644},
		{"narrowed by a umask", "", 0o600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "x.ready")
			prepared := filepath.Join(dir, preparedTempName("x.ready"))
			if err := os.WriteFile(prepared, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(prepared, tc.mode); err != nil { // whatever this test's umask is
				t.Fatal(err)
			}
			before, err := os.Stat(prepared)
			if err != nil {
				t.Fatal(err)
			}
			info := readyInfo{PID: 7, Listen: "127.0.0.1:9"}
			if err := writeReadyFile(path, info); err != nil {
				t.Fatal(err)
			}
			after, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if !os.SameFile(before, after) {
				t.Fatalf("ready file: got a new file; want the prepared one renamed into place")
			}
			if data, _ := os.ReadFile(path); string(data) != string(info.marshal()) {
				t.Fatalf("ready file content: got %q; want %q", data, info.marshal())
			}
			if after.Mode().Perm() != 0o644 {
				t.Fatalf("ready file mode: got %v; want 0644 (a launcher of another user reads it)", after.Mode().Perm())
			}
			if _, err := os.Stat(prepared); !os.IsNotExist(err) {
				t.Fatalf("prepared temp file: got %v; want it renamed away", err)
			}
		})
	}
}

func TestReadyFileNeverWritesThroughAPlantedLink(t *testing.T) {
	for _, kind := range []string{"symlink", "hardlink"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim")
			if err := os.WriteFile(victim, []byte("keep me"), 0o644); err != nil {
				t.Fatal(err)
			}
			prepared := filepath.Join(dir, preparedTempName("x.ready"))
			link := os.Symlink
			if kind == "hardlink" {
				link = os.Link
			}
			if err := link(victim, prepared); err != nil {
				t.Fatal(err)
			}
			if err := writeReadyFile(filepath.Join(dir, "x.ready"), readyInfo{PID: 7, Listen: "127.0.0.1:9"}); err != nil {
				t.Fatal(err)
			}
			if data, _ := os.ReadFile(victim); string(data) != "keep me" {
				t.Fatalf("victim behind a %s: got %q; want it untouched", kind, data)
			}
			if info, err := os.Lstat(prepared); err != nil || (kind == "symlink") != (info.Mode()&os.ModeSymlink != 0) {
				t.Fatalf("planted %s: got %v, %v; want it left where it was", kind, info, err)
			}
		})
	}
}
