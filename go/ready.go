package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
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
//
// The temporary file is the one a launcher prepared (preparedTempName) when there is one,
// else a new one. Creating a file is the dearest step of a start on some file systems:
// allocating the inode cost 0.55 ms of kernel time on an ext4 log dir (far more on network
// file systems), and 4 proxies starting together were ready 1.7 ms sooner when the launcher
// had made their files beforehand, on a core that was otherwise idle.
func writeReadyFile(path string, info readyInfo) error {
	data := info.marshal()
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, readable := openPreparedTemp(filepath.Join(dir, preparedTempName(base)))
	if tmp == nil {
		var err error
		tmp, err = os.CreateTemp(dir, "."+base+".tmp-*")
		if err != nil {
			return fmt.Errorf("-ready-file %q: %v", path, unwrapPathError(err))
		}
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil && !readable {
		// CreateTemp makes 0600 (and a launcher's umask may have narrowed its file); a
		// launcher of another user may read the file.
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

// preparedTempName is the temporary file a launcher may create, empty, beside the ready
// file before it starts the proxy; sidecar_fsm/ready.py names it the same way.
func preparedTempName(readyBase string) string {
	return "." + readyBase + ".tmp"
}

// openPreparedTemp opens the prepared temporary file for writing, emptied, or returns nil
// when there is none or it is not safe to write: only a regular file of our own user with
// no other name is used. The file sits in a directory others may write to, so a symbolic
// link (O_NOFOLLOW) or a second hard link planted there must never make the proxy
// truncate some other file; the checks run on the open descriptor before anything is
// written, and anything else falls back to a fresh temporary file. readable reports that
// its mode is already 0644. The launcher makes it empty and 0644, so usually neither a
// truncate nor a chmod is needed: each is an inode change (a journal entry on ext4) on
// the way to the ready file.
func openPreparedTemp(name string) (f *os.File, readable bool) {
	f, err := os.OpenFile(name, os.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || !info.Mode().IsRegular() || uint64(st.Nlink) != 1 || int(st.Uid) != os.Getuid() {
		f.Close()
		return nil, false
	}
	if info.Size() != 0 {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return nil, false
		}
	}
	return f, info.Mode().Perm() == 0o644
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
