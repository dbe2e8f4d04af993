package benchenv

import (
	"encoding/json"
	"fmt"
	"os"
)

// ReportEnv names the file `make bench` collects the aims' results in; each
// bench appends one JSON line per aim, and bench/summary prints them as
// one table at the end.
const ReportEnv = "JETSYNC_BENCH_REPORT"

// Aim is one issue aim's figure as a bench measured it.
type Aim struct {
	// Issue is the issue number, Name what is measured ("fan-out, 200
	// groups, p50 at 1 write/s").
	Issue int    `json:"issue"`
	Name  string `json:"name"`
	// Figure is the measured value and Target the aim, both as printed
	// ("64 ms", "≤ 20 ms"); Ref is zero-cache's figure where one exists.
	Figure string `json:"figure"`
	Target string `json:"target"`
	Ref    string `json:"ref,omitempty"`
	Met    bool   `json:"met"`
}

// Report prints a's line and appends it to the file named by ReportEnv,
// if set. A failure to append is printed, not fatal: the figure is already
// on the bench's output.
func Report(a Aim) {
	verdict := "not met"
	if a.Met {
		verdict = "met"
	}
	ref := ""
	if a.Ref != "" {
		ref = " (zero-cache " + a.Ref + ")"
	}
	fmt.Printf("aim: %s: %s, aim %s%s: %s\n", a.Name, a.Figure, a.Target, ref, verdict)
	path := os.Getenv(ReportEnv)
	if path == "" {
		return
	}
	line, err := json.Marshal(a)
	if err == nil {
		var f *os.File
		if f, err = os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			_, err = f.Write(append(line, '\n'))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench report:", err)
	}
}
