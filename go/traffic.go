package main

// traffic.go owns the traffic record (-traffic-file): the proxy's own figures as one JSON
// object (version 1, see /work/shared/SPEC.md "Traffic figures" and the launcher's reader),
// written atomically every -traffic-interval and once more, "final": true, after the drain.
// The launcher imports it into its state database, so the figures outlive the process even
// when nothing scraped /metrics.
//
// The figures are read from stats, the very variables GET /metrics shows: there is no
// second count to drift from the first.
//
// Must not: stop or slow serving when a write fails (full disk, folder removed, read-only
// folder: one log line, the next tick retries), leave a half-written file at PATH (a
// SIGKILL mid-write leaves the previous complete file and, at worst, one temp file
// ".<name>.tmp-*"), or hold anything but numbers and the two times (no header, query or
// URL userinfo can reach it).

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// processStart is when this process started, as the record's started_at: a restarted
// proxy writes the same path with its own pid and start, and the reader adds them up.
var processStart = time.Now()

// trafficVersion is the record's "version"; a reader refuses versions it does not know.
// Version 2 added nvcf_followed, nvcf_polls and nvcf_budget_exceeded.
const trafficVersion = 2

// trafficRecord is the file's shape (version 1). Field names are the contract with the
// launcher's reader: never rename one, add fields and bump the version instead.
type trafficRecord struct {
	Version         int               `json:"version"`
	PID             int               `json:"pid"`
	StartedAt       string            `json:"started_at"`
	AsOf            string            `json:"as_of"`
	Final           bool              `json:"final"`
	Requests        uint64            `json:"requests"`
	Responses2xx    uint64            `json:"responses_2xx"`
	Responses4xx    uint64            `json:"responses_4xx"`
	Responses5xx    uint64            `json:"responses_5xx"`
	Responses502    uint64            `json:"responses_502"`
	ResponsesOther  uint64            `json:"responses_other"`
	ClientGone      uint64            `json:"client_disconnects"`
	UpstreamErrors  map[string]uint64 `json:"upstream_errors"`
	PingsSent       uint64            `json:"pings_sent"`
	PingAcks        uint64            `json:"ping_acks"`
	GoAways         uint64            `json:"goaways"`
	Retries         uint64            `json:"retries"`
	Rotations       uint64            `json:"rotations"`
	TTFB            histogramRecord   `json:"ttfb_seconds"`
	Duration        histogramRecord   `json:"duration_seconds"`
	DurationMaxSecs float64           `json:"duration_max_s"`
	// Version 2: NVCF's followed 202s, their status polls, those past -nvcf-budget.
	NVCFFollowed       uint64 `json:"nvcf_followed"`
	NVCFPolls          uint64 `json:"nvcf_polls"`
	NVCFBudgetExceeded uint64 `json:"nvcf_budget_exceeded"`
}

// histogramRecord is a histogram with per-bucket (not cumulative) counts; the last count
// is the +Inf bucket, so len(Counts) == len(Bounds)+1.
type histogramRecord struct {
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	Sum    float64   `json:"sum"`
	Count  uint64    `json:"count"`
}

// rfc3339Milli is RFC 3339 in UTC with milliseconds, the record's and the access log's time.
const rfc3339Milli = "2006-01-02T15:04:05.000Z"

func (h *histogram) record() histogramRecord {
	r := histogramRecord{Bounds: durationBuckets[:], Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		r.Counts[i] = h.counts[i].Load()
		r.Count += r.Counts[i]
	}
	r.Sum = float64(h.sumNanos.Load()) / 1e9
	return r
}

// trafficRecord reads the figures now. The counters are read one by one, not as one
// snapshot: a request ending meanwhile may show in one figure and not yet in another, as
// in a scrape; the next record has it everywhere.
func (m *meters) trafficRecord(now time.Time, final bool) trafficRecord {
	r := trafficRecord{
		Version:            trafficVersion,
		PID:                os.Getpid(),
		StartedAt:          processStart.UTC().Format(rfc3339Milli),
		AsOf:               now.UTC().Format(rfc3339Milli),
		Final:              final,
		Requests:           m.requests.Load(),
		ClientGone:         m.clientGone.Load(),
		UpstreamErrors:     make(map[string]uint64, numKinds),
		PingsSent:          m.pingsSent.Load(),
		PingAcks:           m.pingAcks.Load(),
		GoAways:            m.goaways.Load(),
		Retries:            m.retries.Load(),
		Rotations:          m.rotations.Load(),
		NVCFFollowed:       m.nvcfPending.Load(),
		NVCFPolls:          m.nvcfPolls.Load(),
		NVCFBudgetExceeded: m.nvcfOutcomes[nvcfBudget].Load(),
		TTFB:               m.ttfb.record(),
		Duration:           m.duration.record(),
	}
	for code := range m.responses {
		v := m.responses[code].Load()
		switch {
		case v == 0:
		case code >= 200 && code < 300:
			r.Responses2xx += v
		case code >= 400 && code < 500:
			r.Responses4xx += v
		case code >= 500 && code < 600:
			r.Responses5xx += v
		default:
			r.ResponsesOther += v
		}
		if code == 502 {
			r.Responses502 = v
		}
	}
	for k := range numKinds {
		r.UpstreamErrors[kindNames[k]] = m.errs[k].Load()
	}
	r.DurationMaxSecs = float64(m.durationMax.Load()) / 1e9
	return r
}

// writeFileAtomic replaces path with data: a temp file in the same folder (so the rename
// never crosses file systems), fsync'd before the rename, so a reader (or a crash at any
// point) sees the old file or the new one, never a part. The folder is fsync'd after the
// rename so the new name survives a power loss too; its error is ignored (not every file
// system supports it, and the file itself is complete either way).
func writeFileAtomic(path string, data []byte) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// removeStaleTemps removes the temp files of path that a process killed mid-write left
// (a restarted instance writes the same path). Only a second live process on the same path,
// a misconfiguration, could lose one of its temps to this: its rename then fails, is
// logged, and the next tick writes again.
func removeStaleTemps(path string) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	old, _ := filepath.Glob(filepath.Join(dir, "."+globEscape(base)+".tmp-*"))
	for _, f := range old {
		os.Remove(f)
	}
}

// globEscape quotes the characters filepath.Match treats as patterns.
func globEscape(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', '\\':
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(b)
}

// trafficWriter rewrites the traffic file every interval until stop, which writes the
// final record.
type trafficWriter struct {
	path     string
	interval time.Duration
	logf     func(format string, args ...any)
	m        *meters

	// mu orders writes: the final record must never be overwritten by a tick's non-final
	// one, and failing tells whether this is the first failure of a streak (logged once).
	mu      sync.Mutex
	stopped bool
	failing bool

	done chan struct{}
	quit chan struct{}
}

// startTraffic writes the first record at once (so a reader knows the file from the
// start, figures all 0) and then every interval. The first write is the loop's, off the
// start-up path: its fsync may take a while on a network file system.
func startTraffic(path string, interval time.Duration, m *meters, logf func(string, ...any)) *trafficWriter {
	w := &trafficWriter{path: path, interval: interval, logf: logf, m: m, done: make(chan struct{}), quit: make(chan struct{})}
	go w.loop()
	return w
}

func (w *trafficWriter) loop() {
	defer close(w.done)
	removeStaleTemps(w.path)
	w.write(false)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.write(false)
		case <-w.quit:
			return
		}
	}
}

// write writes one record unless the final one was written. A failure is logged once per
// streak (a full disk would otherwise add a line every interval to a log on the same
// disk) and its recovery once.
func (w *trafficWriter) write(final bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	data, err := json.Marshal(w.m.trafficRecord(time.Now(), final))
	if err == nil {
		err = writeFileAtomic(w.path, append(data, '\n'))
	}
	switch {
	case err != nil && !w.failing:
		w.failing = true
		w.logf("traffic figures not written: %v; figures are stale", err)
	case err == nil && w.failing:
		w.failing = false
		w.logf("traffic figures written to %s again", w.path)
	}
	if final {
		w.stopped = true
	}
}

// stop ends the ticks and writes the final record (after the drain: the figures are
// then complete). Safe to call more than once.
func (w *trafficWriter) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	w.write(true)
}
