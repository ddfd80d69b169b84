package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// readyInfo is the ready file's content; sidecar_fsm/ready.py reads the same two keys.
type readyInfo struct {
	PID    int    `json:"pid"`
	Listen string `json:"listen"`
}

// writeReadyFile writes path atomically: a reader polling for the file either finds
// nothing or the complete JSON, never a half-written one, because the content goes to a
// temporary file in the same directory (same filesystem) that is then renamed over path.
// The file is written only after the listener is bound, so its address is connectable.
func writeReadyFile(path string, info readyInfo) error {
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("-ready-file %q: %v", path, unwrapPathError(err))
	}
	_, werr := tmp.Write(append(data, '\n'))
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

// removeReadyFile removes path only if it still names this process: a launcher that
// already started a successor on the same path must not lose the successor's file.
func removeReadyFile(path string, pid int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var info readyInfo
	if json.Unmarshal(data, &info) == nil && info.PID == pid {
		os.Remove(path)
	}
}
