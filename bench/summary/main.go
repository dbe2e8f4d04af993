// Command summary prints the aims the benches of `make bench` reported
// (benchenv.Report) as one table: issue, measure, figure, aim, zero-cache's
// figure and whether the aim is met.
//
// Usage: go run ./bench/summary FILE
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/jetsync/jetsync/bench/internal/benchenv"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: summary FILE")
		os.Exit(2)
	}
	aims, err := read(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "summary:", err)
		os.Exit(1)
	}
	print(os.Stdout, aims)
}

func read(path string) ([]benchenv.Aim, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var aims []benchenv.Aim
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var a benchenv.Aim
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		aims = append(aims, a)
	}
	return aims, sc.Err()
}

func print(out *os.File, aims []benchenv.Aim) {
	fmt.Fprintln(out, "== aims")
	if len(aims) == 0 {
		fmt.Fprintln(out, "no bench reported an aim")
		return
	}
	// Stable by issue; within an issue, in the order the benches ran.
	sort.SliceStable(aims, func(i, j int) bool { return aims[i].Issue < aims[j].Issue })
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "issue\tmeasure\tfigure\taim\tzero-cache\tverdict")
	met := 0
	for _, a := range aims {
		verdict := "NOT MET"
		if a.Met {
			verdict = "met"
			met++
		}
		ref := a.Ref
		if ref == "" {
			ref = "-"
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", a.Issue, a.Name, a.Figure, a.Target, ref, verdict)
	}
	_ = w.Flush()
	fmt.Fprintf(out, "%d of %d aims met\n", met, len(aims))
}
