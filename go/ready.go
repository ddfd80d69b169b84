package main

// ready.go owns the ready file: {"pid": N, "listen": "host:port", "route": "direct"} written
// once the listener is bound, atomically, and removed at exit if it is still ours.
// sidecar_fsm/base/ready.py reads it; the launcher removes leftover ".<ready name>.tmp-*" files of a proxy that died between
// CreateTemp and rename, so the temp name keeps exactly that pattern.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// readyInfo is the ready file's content. Optional keys use omitempty, so a reader of the
// two original keys sees no change when one is added.
type readyInfo struct {
	PID    int    `json:"pid"`
	Listen string `json:"listen"`
	// Metrics is the -metrics-listen address actually bound, when metrics are on.
	Metrics string `json:"metrics,omitempty"`
	// Route is the upstream's route (egress.go's routeOf): "direct" or "via egress proxy
	// scheme://host:port", never with userinfo; `sidecar-fsm start` prints it.
	Route string `json:"route,omitempty"`
}

func (r readyInfo) marshal() []byte {
	b, _ := json.Marshal(r) // an int and strings: cannot fail
	return append(b, '\n')
}

// writeReadyFile writes path atomically: a reader polling for the file either finds
// nothing or the complete JSON, never a half-written one, because the content goes to a
// new temporary file in the same directory (same filesystem, created with O_EXCL so
// nothing planted there is written through) that is then renamed over path. It is called
// only after the listener is bound, so the address is connectable.
func writeReadyFile(path string, info readyInfo) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("-ready-file %q: %v", path, unwrapPathError(err))
	}
	_, err = tmp.Write(info.marshal())
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes 0600; a launcher of another user may read the file.
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("-ready-file %q: %v", path, unwrapPathError(err))
	}
	return nil
}

// removeReadyFile removes path only if it still holds what this process wrote: a
// launcher that already started a successor on the same path must not lose the
// successor's file (a successor has another pid, so its content differs).
func removeReadyFile(path string, info readyInfo) {
	data, err := os.ReadFile(path)
	if err == nil && bytes.Equal(data, info.marshal()) {
		os.Remove(path)
	}
}
