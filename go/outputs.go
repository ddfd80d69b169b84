package main

// outputs.go owns the flags of what the proxy writes to disk beside its log: the traffic
// record (-traffic-file, -traffic-interval), the access log (-access-log), its own log
// (-log-file) and the size rotation of both logs (-log-max-bytes, -log-backups).
//
// Validation only looks at the paths (a folder that exists, not a folder itself, no two
// outputs on one file); it opens and creates nothing, so a bad flag leaves no file behind.
// Whether the folder is writable is not checked: a write that fails later (read-only
// folder, full disk, folder removed) is logged and never stops serving.

import (
	"errors"
	"flag"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// maxLogBackups bounds -log-backups: each rotation renames every backup once.
const maxLogBackups = 1000

// Outputs is the validated part of Config that names files written while serving.
type Outputs struct {
	// TrafficFile receives the traffic figures as one JSON object (traffic.go), replaced
	// atomically every TrafficInterval and once more after the drain (-traffic-file,
	// default "" = off).
	TrafficFile string
	// TrafficInterval is how often TrafficFile is rewritten (-traffic-interval, default
	// 30s; must be above 0). A proxy killed with SIGKILL loses at most this much.
	TrafficInterval time.Duration
	// AccessLog receives one JSON line per finished request (accesslog.go; -access-log,
	// default "" = off).
	AccessLog string
	// LogFile is where the proxy's own log goes, stdout and stderr included (-log-file,
	// default "" = stderr as given).
	LogFile string
	// LogMaxBytes rotates LogFile and AccessLog before a write would take them past it
	// (-log-max-bytes, default 100 MiB; 0 never rotates).
	LogMaxBytes int64
	// LogBackups is how many rotated files each log keeps, PATH.1 the newest
	// (-log-backups, default 5, at most 1000; 0 cuts PATH and starts it again).
	LogBackups int
}

// outputFlags holds the raw flag values until validate.
type outputFlags struct {
	trafficFile, trafficInterval, accessLog, logFile, logMaxBytes, logBackups *string
}

func defineOutputFlags(fs *flag.FlagSet) *outputFlags {
	return &outputFlags{
		trafficFile:     fs.String("traffic-file", "", "write the traffic figures (JSON) to this `path`, atomically, every -traffic-interval and at exit (default off)"),
		trafficInterval: fs.String("traffic-interval", "30s", "rewrite -traffic-file this often (`duration` > 0)"),
		accessLog:       fs.String("access-log", "", "append one JSON line per request to this `path` (no header, no query; default off)"),
		logFile:         fs.String("log-file", "", "send the proxy's log, stdout and stderr to this `path`, rotated by size (default: stderr)"),
		logMaxBytes:     fs.String("log-max-bytes", "104857600", "rotate -log-file and -access-log before they pass this many `bytes` (>= 0; 0 = never)"),
		logBackups:      fs.String("log-backups", "5", "rotated files kept per log, PATH.1 newest (`count` 0-1000; 0 = cut PATH in place)"),
	}
}

func (o *outputFlags) validate() (Outputs, error) {
	var out Outputs
	var err error
	if out.TrafficFile, err = validateOutputPath("traffic-file", *o.trafficFile); err != nil {
		return out, err
	}
	if out.TrafficInterval, err = parseDuration("traffic-interval", *o.trafficInterval); err != nil {
		return out, err
	}
	if out.TrafficInterval <= 0 {
		return out, badFlag("traffic-interval", *o.trafficInterval, "must be above 0; try 30s")
	}
	if out.AccessLog, err = validateOutputPath("access-log", *o.accessLog); err != nil {
		return out, err
	}
	if out.LogFile, err = validateOutputPath("log-file", *o.logFile); err != nil {
		return out, err
	}
	out.LogMaxBytes, err = strconv.ParseInt(*o.logMaxBytes, 10, 64)
	if err != nil || out.LogMaxBytes < 0 {
		return out, badFlag("log-max-bytes", *o.logMaxBytes, "must be a whole number of bytes >= 0; use 0 to never rotate")
	}
	out.LogBackups, err = strconv.Atoi(*o.logBackups)
	if err != nil || out.LogBackups < 0 || out.LogBackups > maxLogBackups {
		return out, badFlag("log-backups", *o.logBackups, "must be a whole number from 0 to 1000; use 0 to cut the log in place")
	}
	// Two outputs on one file would interleave a JSON object with log lines.
	named := [][2]string{{"traffic-file", out.TrafficFile}, {"access-log", out.AccessLog}, {"log-file", out.LogFile}}
	for i, a := range named {
		for _, b := range named[i+1:] {
			if a[1] != "" && b[1] != "" && filepath.Clean(a[1]) == filepath.Clean(b[1]) {
				return out, badFlag(b[0], b[1], "is also the -%s; give each output its own file", a[0])
			}
		}
	}
	return out, nil
}

// validateOutputPath accepts "" (off) or a file path whose folder exists and which is not
// itself a folder.
func validateOutputPath(name, value string) (string, error) {
	if value == "" {
		return "", nil
	}
	if strings.HasSuffix(value, "/") {
		return "", badFlag(name, value, "names a folder; give a file path")
	}
	if st, err := os.Stat(value); err == nil && st.IsDir() {
		return "", badFlag(name, value, "is a folder; give a file path")
	} else if err == nil && name == "traffic-file" && !st.Mode().IsRegular() {
		// The record is renamed over PATH: over a device node that would replace it.
		return "", badFlag(name, value, "is not a regular file; give a file path")
	}
	dir := filepath.Dir(value)
	st, err := os.Stat(dir)
	if err != nil {
		return "", badFlag(name, value, "folder %q cannot be used (%v); create it or give another path", dir, unwrapPathError(err))
	}
	if !st.IsDir() {
		return "", badFlag(name, value, "%q is not a folder; give a path in an existing folder", dir)
	}
	return value, nil
}

// outputFiles are the open outputs of one process, from openOutputs to finish.
type outputFiles struct {
	cfg        Outputs
	log        *rotatingFile // the proxy's log, nil without -log-file
	accessFile *rotatingFile
	access     *accessLog
	traffic    *trafficWriter
}

// openOutputs opens the logs before anything is served: a path that cannot be opened is a
// bad flag (exit 2), and a file this call created is removed again, so a refused start
// leaves none behind. With -log-file, stdout and stderr point at it from here on: only
// once both opened, so the error of a failed open still reaches the stderr given.
func openOutputs(o Outputs) (*outputFiles, error) {
	of := &outputFiles{cfg: o}
	var opened []*rotatingFile
	var created []string
	fail := func(name, path string, err error) (*outputFiles, error) {
		for _, rf := range opened {
			rf.Close()
		}
		for _, p := range created {
			os.Remove(p)
		}
		return nil, badFlag(name, path, "cannot be opened (%v); give a writable path", unwrapPathError(err))
	}
	openOne := func(path string) (*rotatingFile, error) {
		_, statErr := os.Lstat(path)
		rf, err := openRotating(path, o.LogMaxBytes, o.LogBackups)
		if err == nil {
			opened = append(opened, rf)
			if errors.Is(statErr, fs.ErrNotExist) {
				created = append(created, path)
			}
		}
		return rf, err
	}
	var err error
	if o.LogFile != "" {
		if of.log, err = openOne(o.LogFile); err != nil {
			return fail("log-file", o.LogFile, err)
		}
	}
	if o.AccessLog != "" {
		if of.accessFile, err = openOne(o.AccessLog); err != nil {
			return fail("access-log", o.AccessLog, err)
		}
	}
	if of.log != nil {
		if err := redirectStdio(of.log.file()); err != nil {
			return fail("log-file", o.LogFile, err)
		}
		of.log.statSize = true
		// After a rotation stdout and stderr follow the new file; if that fails they stay
		// on PATH.1, which the next rotation renames on: the log loses nothing.
		of.log.reopened = redirectStdio
	}
	return of, nil
}

// start begins the access log (before the first request is served: m.access and
// srv.ConnContext are read without a lock) and the traffic record.
func (of *outputFiles) start(m *meters, srv *http.Server, logf func(string, ...any)) {
	if of.accessFile != nil {
		of.access = startAccessLog(of.accessFile, logf)
		m.access = of.access
		srv.ConnContext = withConnSlot
	}
	if of.cfg.TrafficFile != "" {
		of.traffic = startTraffic(of.cfg.TrafficFile, of.cfg.TrafficInterval, m, logf)
	}
}

// needsCounting tells whether the per-request counting (meters.wrap) must run: the traffic
// record and the access log are made of it, as /metrics is.
func (of *outputFiles) needsCounting() bool {
	return of.cfg.TrafficFile != "" || of.accessFile != nil
}

// finishWait bounds how long finish waits for handlers still running after a drain that
// was cut short (grace over, second signal): srv.Close ends their connections but does not
// wait for them, and each counts itself and writes its access line as it returns.
const finishWait = 2 * time.Second

// finish writes the final traffic record and the access log's last lines; called after
// the drain, when every request has ended or been cut off.
func (of *outputFiles) finish() {
	if of.traffic != nil || of.access != nil {
		deadline := time.Now().Add(finishWait)
		for n, _ := stats.flight.oldest(time.Now()); n > 0 && time.Now().Before(deadline); n, _ = stats.flight.oldest(time.Now()) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if of.traffic != nil {
		of.traffic.stop()
	}
	if of.access != nil {
		of.access.close()
	}
}
