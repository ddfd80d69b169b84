package main

// describe.go owns `h2-ping-sidecar -describe`: what this binary is, as one JSON document on
// stdout, exit 0. The launcher (sidecar_fsm/run/binaryflags.py) reads it to learn which flags a
// user-named binary accepts; -h stays for people, so rewording a usage line can never change
// what the launcher does (as `go env -json` and Envoy's /server_info answer a machine).
//
// Everything in it is read from what the binary runs on, never restated: the flags from the
// parsed flag set (flag.VisitAll: a flag added to parseConfig appears with no edit here), the
// ready file's fields from readyInfo's JSON tags, the exit codes from main.go's constants.
// NeMo Gym's proxy has no -describe and exits 2 on it ("flag provided but not defined").

import (
	"encoding/json"
	"flag"
	"io"
	"reflect"
	"strings"
)

// description is -describe's document. Keys are only ever added.
type description struct {
	// Version is main.version (the build cache's sources hash), "" for an unstamped build.
	Version string     `json:"version"`
	Flags   []flagInfo `json:"flags"`
	// ReadyFile lists the JSON keys the ready file may hold ("pid", "listen", ...).
	ReadyFile []string `json:"ready_file"`
	// ExitCodes names each exit code a start can end with (main.go).
	ExitCodes map[string]int `json:"exit_codes"`
	// Features are behaviours no flag shows: "probe" (the -probe mode), "upstream-check"
	// (GET /upstream on the metrics listener), "traffic-record-1" (-traffic-file's version).
	Features []string `json:"features"`
}

// flagInfo is one flag: Type is "bool" for a flag given without a value, else the name of
// its value in the usage ("duration", "path", ...); Default is as a command line spells it.
type flagInfo struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Default string `json:"default"`
	Usage   string `json:"usage"`
}

func describe(fs *flag.FlagSet, out io.Writer) {
	d := description{
		Version:   version,
		Flags:     []flagInfo{},
		ExitCodes: exitCodes,
		Features:  []string{"probe", "upstream-check", "traffic-record-1"},
	}
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			kind = "bool"
		}
		d.Flags = append(d.Flags, flagInfo{Name: f.Name, Type: kind, Default: f.DefValue, Usage: usage})
	})
	t := reflect.TypeOf(readyInfo{})
	for i := range t.NumField() {
		d.ReadyFile = append(d.ReadyFile, strings.Split(t.Field(i).Tag.Get("json"), ",")[0])
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	enc.Encode(d) // to stdout: a failed write has nobody to tell
}
