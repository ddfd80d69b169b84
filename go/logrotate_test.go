package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logFiles returns the names of path's files (path, path.1 ...) and their total size.
func logFiles(t *testing.T, path string) ([]string, int64) {
	t.Helper()
	names, _ := filepath.Glob(path + "*")
	var total int64
	for _, n := range names {
		st, err := os.Stat(n)
		if err != nil {
			t.Fatal(err)
		}
		total += st.Size()
	}
	slices.Sort(names)
	return names, total
}

// TestRotationKeepsTheBoundAndWholeLines: 8 writers of lines of every length from 1 to
// 300 bytes into a 1000-byte file with 3 backups: the files are path, .1, .2, .3, each
// at most 1000 bytes of whole lines, and the newest lines are all there.
func TestRotationKeepsTheBoundAndWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	rf, err := openRotating(path, 1000, 3)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				head := fmt.Sprintf("w%d-%d:", w, i)
				line := head + strings.Repeat("x", (w*37+i*13)%300) + "\n"
				if _, err := rf.Write([]byte(line)); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rf.Close()
	names, total := logFiles(t, path)
	if want := []string{path, path + ".1", path + ".2", path + ".3"}; !slices.Equal(names, want) {
		t.Fatalf("files: got %v; want %v", names, want)
	}
	if total > 1000*4 {
		t.Fatalf("total: got %d bytes; want at most 4000", total)
	}
	for _, n := range names {
		data, _ := os.ReadFile(n)
		if len(data) > 1000 || len(data) == 0 || data[len(data)-1] != '\n' {
			t.Fatalf("%s: got %d bytes ending %q; want 1-1000 bytes of whole lines", n, len(data), data[max(0, len(data)-10):])
		}
		for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
			head, xs, ok := strings.Cut(line, ":")
			var w, i int
			if _, err := fmt.Sscanf(head, "w%d-%d", &w, &i); err != nil || !ok || len(xs) != (w*37+i*13)%300 || strings.Trim(xs, "x") != "" {
				t.Fatalf("%s: got line %q; want a whole line as written", n, line)
			}
		}
	}
}

// TestRotationOfOneLongLineAndInPlace: a line longer than max alone is cut to max (its
// newline kept); with 0 backups the file is cut in place and no backup appears.
func TestRotationOfOneLongLineAndInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "y.log")
	rf, err := openRotating(path, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	rf.Write([]byte(strings.Repeat("a", 60) + "\n"))
	rf.Write([]byte(strings.Repeat("b", 60) + "\n" + strings.Repeat("c", 500) + "\n" + "d\n"))
	rf.Close()
	names, _ := logFiles(t, path)
	data, _ := os.ReadFile(path)
	if !slices.Equal(names, []string{path}) || string(data) != "d\n" {
		t.Fatalf("files %v, content %q; want only %s holding the last line", names, data, path)
	}
	path = filepath.Join(t.TempDir(), "z.log")
	rf, _ = openRotating(path, 100, 1)
	rf.Write([]byte(strings.Repeat("c", 500) + "\n"))
	rf.Close()
	data, _ = os.ReadFile(path)
	if len(data) != 100 || data[99] != '\n' || strings.Trim(string(data[:99]), "c") != "" {
		t.Fatalf("long line: got %q; want it cut to 100 bytes, newline kept", data)
	}
}

// TestRotationKeepsTheFileMode: a new PATH gets the mode of the one it replaces (the
// launcher's choice for the proxy's log), and an existing file's size counts.
func TestRotationKeepsTheFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	os.WriteFile(path, []byte(strings.Repeat("o", 95)+"\n"), 0o600)
	os.Chmod(path, 0o600)
	rf, _ := openRotating(path, 100, 2)
	rf.Write([]byte("new line\n"))
	rf.Close()
	st, _ := os.Stat(path)
	old, _ := os.ReadFile(path + ".1")
	if st.Mode().Perm() != 0o600 || len(old) != 96 || st.Size() != 9 {
		t.Fatalf("got mode %v, size %d, .1 %d bytes; want 0600, the new line alone, the old file as .1", st.Mode().Perm(), st.Size(), len(old))
	}
}

// TestE2ELogFileTakesOverStderrAndRotates: with -log-file the proxy's stderr (fd 2, where
// a runtime panic goes) is the file, still after rotations; 502 log lines rotate it at
// 2 KiB with 2 backups and the files stay within 3 x 2 KiB.
func TestE2ELogFileTakesOverStderrAndRotates(t *testing.T) {
	origin := newH2Origin(t, nil)
	url, ca := origin.URL, caFileOf(t, origin)
	origin.Close() // every request is a 502 and a log line
	dir := t.TempDir()
	path := filepath.Join(dir, "h2ping-a-host-run.log")
	p := runSidecar(t, "-upstream", url, "-ca-file", ca, "-log-file", path, "-log-max-bytes", "2048", "-log-backups", "2")
	fd2 := func() string {
		target, _ := os.Readlink("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/fd/2")
		return target
	}
	if got := fd2(); got != path {
		t.Fatalf("fd 2: got %q; want %q", got, path)
	}
	for i := range 60 {
		get(t, p.url()+"/fails/"+strconv.Itoa(i))
	}
	waitFor(t, "two rotations", 5*time.Second, func() bool {
		_, err := os.Stat(path + ".2")
		return err == nil
	})
	if got := fd2(); got != path {
		t.Fatalf("fd 2 after rotation: got %q; want %q", got, path)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
	names, total := logFiles(t, path)
	if want := []string{path, path + ".1", path + ".2"}; !slices.Equal(names, want) || total > 3*2048 {
		t.Fatalf("files %v, %d bytes; want %v within 6144", names, total, want)
	}
	last, _ := os.ReadFile(path)
	if !bytes.Contains(last, []byte("drained")) || strings.Contains(p.stderr.String(), "drained") {
		t.Fatalf("log file %q, stderr %q; want the drain logged in the file, not on the old stderr", last, p.stderr)
	}
	for _, n := range names {
		data, _ := os.ReadFile(n)
		if data[len(data)-1] != '\n' || !bytes.HasPrefix(data, []byte("h2-ping-sidecar: ")) {
			t.Fatalf("%s: got %q; want whole log lines", n, data)
		}
	}
}

// TestE2EARefusedStartLeavesNoLogFile: a -log-file this start created is removed when
// -access-log cannot be opened, and the error goes to the stderr the proxy was given.
func TestE2EARefusedStartLeavesNoLogFile(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "new.log")
	cmd := exec.Command(sidecarBin, "-listen", "127.0.0.1:0", "-upstream", "https://example.com",
		"-log-file", logFile, "-access-log", "/proc/h2ping-test.access.log")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "-access-log") {
		t.Fatalf("got %v, stderr %q; want exit 2 naming -access-log on the given stderr", err, stderr.String())
	}
	if _, err := os.Stat(logFile); !os.IsNotExist(err) {
		t.Fatalf("log file: got %v; want it removed", err)
	}
}
