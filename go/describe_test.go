package main

import (
	"encoding/json"
	"os/exec"
	"slices"
	"testing"
)

// TestDescribeIsTheFlagSetAsData: the launcher learns a binary's flags from -describe alone, so
// it must list every flag with its arity and default, without -upstream or any other flag given.
func TestDescribeIsTheFlagSetAsData(t *testing.T) {
	out, err := exec.Command(sidecarBin, "-describe").Output()
	if err != nil {
		t.Fatalf("-describe: %v", err)
	}
	var d description
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatalf("-describe: %v in %q", err, out)
	}
	byName := map[string]flagInfo{}
	for _, f := range d.Flags {
		byName[f.Name] = f
	}
	for name, want := range map[string]flagInfo{
		"listen":               {Name: "listen", Type: "host:port", Default: "127.0.0.1:1250"},
		"insecure-skip-verify": {Name: "insecure-skip-verify", Type: "bool", Default: "false"},
		"ping-interval":        {Name: "ping-interval", Type: "duration", Default: "60s"},
		"traffic-file":         {Name: "traffic-file", Type: "path", Default: ""},
	} {
		got := byName[name]
		got.Usage = ""
		if got != want {
			t.Errorf("flag %s: got %+v; want %+v", name, got, want)
		}
	}
	if !slices.Equal(d.ReadyFile, []string{"pid", "listen", "metrics", "route"}) {
		t.Errorf("ready_file: got %v", d.ReadyFile)
	}
	if d.ExitCodes["listen_in_use"] != exitListenInUse || d.ExitCodes["metrics_in_use"] != exitMetricsInUse {
		t.Errorf("exit_codes: got %v", d.ExitCodes)
	}
}
