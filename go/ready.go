package main

// ready.go owns the ready file: {"pid": N, "listen": "host:port", "route": "direct"} written
// once the listener is bound, atomically (writeFileAtomic), and removed at exit if it is still
// ours. sidecar_fsm/base/ready.py reads it.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
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

// writeReadyFile writes path atomically (writeFileAtomic): a reader polling for the file
// either finds nothing or the complete JSON. It is called only after the listener is bound,
// so the address is connectable; 0644, as a launcher of another user may read it.
func writeReadyFile(path string, info readyInfo) error {
	if err := writeFileAtomic(path, info.marshal(), 0o644, false); err != nil {
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
