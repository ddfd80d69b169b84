package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"unicode/utf8"
)

// readyInfo is the ready file's content; sidecar_fsm/ready.py reads the same two keys.
//
// The JSON is written by hand (marshal below), not with encoding/json: nothing else in the
// proxy uses that package, and linking it added its package initialisation (encoding/json/v2
// builds tables at init) to every start, which is timed from exec to this file (target
// < 5 ms median).
type readyInfo struct {
	PID    int    `json:"pid"`
	Listen string `json:"listen"`
}

// writeReadyFile writes path atomically: a reader polling for the file either finds
// nothing or the complete JSON, never a half-written one, because the content goes to a
// temporary file in the same directory (same filesystem) that is then renamed over path.
// The file is written only after the listener is bound, so its address is connectable.
func writeReadyFile(path string, info readyInfo) error {
	data := info.marshal()
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("-ready-file %q: %v", path, unwrapPathError(err))
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp.Name(), 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("-ready-file %q: %v", path, unwrapPathError(werr))
	}
	return nil
}

// removeReadyFile removes path only if it still holds what this process wrote: a
// launcher that already started a successor on the same path must not lose the
// successor's file (a successor has another pid, so its content differs).
func removeReadyFile(path string, info readyInfo) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if bytes.Equal(data, info.marshal()) {
		os.Remove(path)
	}
}

// marshal returns {"pid": N, "listen": "host:port"} and a newline, as JSON.
func (r readyInfo) marshal() []byte {
	b := []byte(`{"pid": `)
	b = strconv.AppendInt(b, int64(r.PID), 10)
	b = append(b, `, "listen": `...)
	b = appendJSONString(b, r.Listen)
	return append(b, "}\n"...)
}

// appendJSONString quotes s as a JSON string. An address is ASCII, but a zone (%eth0)
// comes from the system, so quotes, backslashes, control bytes and invalid UTF-8 are
// escaped as JSON requires rather than assumed absent.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
			i++
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			i++
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
		}
	}
	return append(b, '"')
}
