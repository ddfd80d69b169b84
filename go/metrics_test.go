package main

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelPair  = regexp.MustCompile(`^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"$`)
)

// allMetrics are the names SPEC fixes; every scrape must carry each, with HELP and TYPE.
var allMetrics = map[string]string{
	"h2ping_requests_in_flight": "gauge", "h2ping_oldest_request_age_seconds": "gauge",
	"h2ping_requests_total": "counter", "h2ping_responses_total": "counter",
	"h2ping_client_disconnects_total": "counter", "h2ping_upstream_connections": "gauge",
	"h2ping_upstream_dials_total": "counter", "h2ping_upstream_errors_total": "counter",
	"h2ping_upstream_up": "gauge", "h2ping_pings_sent_total": "counter",
	"h2ping_ping_acks_total": "counter", "h2ping_ping_rtt_seconds": "gauge",
	"h2ping_goaways_total": "counter", "h2ping_retries_total": "counter",
	"h2ping_rotations_total": "counter",
}

// parseExposition checks text line by line against the Prometheus text format 0.0.4, as
// strictly as its parsers are: every family has one HELP and one TYPE before its samples,
// samples belong to the family just declared, no sample or family repeats, label values
// are quoted with only \\, \" and \n escapes, values are floats, the text ends with a
// newline. It also requires every name of allMetrics. Samples are keyed
// name{label="value"}.
func parseExposition(text string) (map[string]float64, error) {
	if !strings.HasSuffix(text, "\n") {
		return nil, errors.New("does not end with a newline")
	}
	samples := map[string]float64{}
	types := map[string]string{}
	helped := map[string]bool{}
	family := ""
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		where := fmt.Sprintf("line %d %q", i+1, line)
		if strings.HasPrefix(line, "#") {
			f := strings.SplitN(line, " ", 4)
			if len(f) < 4 || f[0] != "#" || !metricName.MatchString(f[2]) {
				return nil, fmt.Errorf("%s: malformed comment", where)
			}
			switch f[1] {
			case "HELP":
				if helped[f[2]] || types[f[2]] != "" {
					return nil, fmt.Errorf("%s: HELP repeated or after TYPE", where)
				}
				helped[f[2]] = true
				family = f[2]
			case "TYPE":
				if types[f[2]] != "" || f[2] != family {
					return nil, fmt.Errorf("%s: TYPE repeated or not right after its HELP", where)
				}
				if f[3] != "counter" && f[3] != "gauge" {
					return nil, fmt.Errorf("%s: type %q", where, f[3])
				}
				types[f[2]] = f[3]
			default:
				return nil, fmt.Errorf("%s: only HELP and TYPE comments are written", where)
			}
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			return nil, fmt.Errorf("%s: no value", where)
		}
		key, value := line[:sp], line[sp+1:]
		name, labels := key, ""
		if j := strings.IndexByte(key, '{'); j >= 0 {
			if !strings.HasSuffix(key, "}") {
				return nil, fmt.Errorf("%s: unterminated labels", where)
			}
			name, labels = key[:j], key[j+1:len(key)-1]
			for _, pair := range strings.Split(labels, ",") {
				if !labelPair.MatchString(pair) {
					return nil, fmt.Errorf("%s: bad label %q", where, pair)
				}
			}
		}
		if name != family || types[name] == "" {
			return nil, fmt.Errorf("%s: sample outside its family (HELP/TYPE of %q)", where, name)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %q", where, value)
		}
		if types[name] == "counter" && v < 0 {
			return nil, fmt.Errorf("%s: negative counter", where)
		}
		if _, dup := samples[key]; dup {
			return nil, fmt.Errorf("%s: sample repeated", where)
		}
		samples[key] = v
	}
	for name, typ := range allMetrics {
		if types[name] != typ {
			return nil, fmt.Errorf("%s: type %q; want %q", name, types[name], typ)
		}
	}
	return samples, nil
}

func TestExpositionCheckerRejectsWhatParsersReject(t *testing.T) {
	good := string((&meters{}).appendText(nil, time.Now()))
	if _, err := parseExposition(good); err != nil {
		t.Fatalf("our own output: got %v; want valid", err)
	}
	bad := map[string]string{
		"no final newline": strings.TrimSuffix(good, "\n"),
		"sample repeated":  good + "h2ping_rotations_total 0\n",
		"sample w/o TYPE":  good + "h2ping_other 1\n",
		"bad label quote":  strings.Replace(good, `{result="ok"}`, `{result=ok}`, 1),
		"bad value":        strings.Replace(good, "h2ping_requests_total 0", "h2ping_requests_total zero", 1),
		"metric missing":   strings.Replace(good, "h2ping_goaways_total", "h2ping_goaway_total", -1),
	}
	for name, text := range bad {
		if _, err := parseExposition(text); err == nil {
			t.Errorf("%s: got valid; want an error", name)
		}
	}
}

// TestInflightOldestIsTheHeadAtAnyScale: the oldest age is the oldest request's still in
// flight whichever ends first, and a scrape with 10,000 in flight is cheap.
func TestInflightOldestIsTheHeadAtAnyScale(t *testing.T) {
	m := &meters{}
	entries := make([]flightEntry, 10000)
	for i := range entries {
		m.flight.add(&entries[i])
	}
	start := time.Now()
	const scrapes = 10
	for range scrapes {
		m.appendText(nil, time.Now())
	}
	if per := time.Since(start) / scrapes; per > 50*time.Millisecond {
		t.Fatalf("scrape with 10,000 in flight: got %v; want < 50ms", per)
	}
	now := entries[len(entries)-1].start.Add(time.Hour)
	if n, age := m.flight.oldest(now); n != 10000 || age != now.Sub(entries[0].start) {
		t.Fatalf("got %d, %v; want 10000 and the first entry's age", n, age)
	}
	m.flight.remove(&entries[0])
	m.flight.remove(&entries[5000])
	if n, age := m.flight.oldest(now); n != 9998 || age != now.Sub(entries[1].start) {
		t.Fatalf("after removing the oldest: got %d, %v; want 9998 and the second entry's age", n, age)
	}
	for i := range entries {
		if i != 0 && i != 5000 {
			m.flight.remove(&entries[i])
		}
	}
	if n, age := m.flight.oldest(now); n != 0 || age != 0 {
		t.Fatalf("idle: got %d, %v; want 0, 0", n, age)
	}
}

// TestFrameScannerFindsFramesWhereverTheStreamIsCut: the watcher follows frame boundaries
// across Read/Write calls cut anywhere, one byte at a time included, and counts the same.
func TestFrameScannerFindsFramesWhereverTheStreamIsCut(t *testing.T) {
	frame := func(typ, flags byte, payload ...byte) []byte {
		n := len(payload)
		return append([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, flags, 0, 0, 0, 0}, payload...)
	}
	ping := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	var out, in []byte
	out = append(out, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"...)
	out = append(out, frame(0x4, 0, make([]byte, 12)...)...)                // SETTINGS
	out = append(out, frame(framePing, 0, ping...)...)                      // our PING
	out = append(out, frame(0x0, 0, make([]byte, 70000%16384)...)...)       // DATA
	out = append(out, frame(framePing, flagAck, 9, 9, 9, 9, 9, 9, 9, 9)...) // our ACK of theirs: not a PING sent
	in = append(in, frame(0x4, 0)...)
	in = append(in, frame(framePing, 0, 9, 9, 9, 9, 9, 9, 9, 9)...) // theirs: not an ack of ours
	in = append(in, frame(frameHeaders, 0x4, make([]byte, 30)...)...)
	in = append(in, frame(framePing, flagAck, ping...)...)
	in = append(in, frame(frameRSTStream, 0, 0, 0, 0, errCodeRefused)...) // refused: re-sent, no error
	in = append(in, frame(frameRSTStream, 0, 0, 0, 0, 0x2)...)            // INTERNAL_ERROR
	in = append(in, frame(frameGoAway, 0, 0, 0, 0, 5, 0, 0, 0, 0)...)     // graceful
	for _, cut := range []int{1, 2, 3, 7, 9, 10, 17, 64, 1 << 20} {
		m := &meters{}
		c := m.watch(nil, time.Minute)
		for p := out; len(p) > 0; p = p[min(cut, len(p)):] {
			c.out.feed(p[:min(cut, len(p))], c)
		}
		for p := in; len(p) > 0; p = p[min(cut, len(p)):] {
			c.in.feed(p[:min(cut, len(p))], c)
		}
		got := [...]uint64{m.pingsSent.Load(), m.pingAcks.Load(), m.goaways.Load(), m.errs[kindReset].Load()}
		if got != [...]uint64{1, 1, 1, 1} || m.pingRTT.Load() == 0 {
			t.Fatalf("cut %d: got pings, acks, goaways, resets %v, rtt bits %d; want 1 1 1 1 and an rtt", cut, got, m.pingRTT.Load())
		}
	}
}
