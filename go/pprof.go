package main

// pprof.go owns -pprof: the Go runtime's profiles (heap, allocs, goroutine, threadcreate,
// block, mutex) at net/http/pprof's paths, /debug/pprof/NAME, on the -metrics-listen
// listener, so a soak can compare heap profiles (go tool pprof -top -diff_base) when RSS
// grows. Off by default, and the launcher never passes it: a profile names the code paths
// a request took, which a loopback scrape of /metrics has no need to see. runtime/pprof, not
// net/http/pprof: that package pulls in html/template and registers itself on
// http.DefaultServeMux, neither of which this proxy wants.

import (
	"net/http"
	"runtime"
	"runtime/pprof"
	"strconv"
)

// servePprof adds GET /debug/pprof/NAME to mux: ?debug=N as net/http/pprof reads it (0 =
// the protobuf go tool pprof reads, 1 = text), ?gc=1 collects garbage first (a heap
// profile of live objects only).
func servePprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/{name}", func(w http.ResponseWriter, r *http.Request) {
		profile := pprof.Lookup(r.PathValue("name"))
		if profile == nil {
			http.Error(w, "no such profile; try heap, allocs or goroutine", http.StatusNotFound)
			return
		}
		debug, _ := strconv.Atoi(r.FormValue("debug"))
		if r.FormValue("gc") != "" {
			runtime.GC()
		}
		w.Header().Set("Cache-Control", "no-store")
		if debug > 0 {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		} else {
			w.Header().Set("Content-Type", "application/octet-stream")
		}
		profile.WriteTo(w, debug)
	})
}
