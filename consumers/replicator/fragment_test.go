package replicator_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/streams"
)

// fragBudget cuts test rows into a handful of fragments.
const fragBudget = 64 << 10

// parts publishes one transaction on issue whose parts hold changes as
// given, each part its own message, and returns the seqs.
func (e *env) parts(parts ...[]streams.Change) []uint64 {
	e.T.Helper()
	wm := e.NextWM()
	var seqs []uint64
	for i, cs := range parts {
		pt := streams.Part{Watermark: wm, Num: i, Last: i == len(parts)-1, Changes: cs}
		if i == 0 {
			pt.Prev = e.WM
		}
		seqs = append(seqs, e.Publish(&streams.Message{Schema: "public", Table: "issue", Parts: []streams.Part{pt}}))
	}
	e.WM = wm
	return seqs
}

func fragments(t *testing.T, c streams.Change) [][]streams.Change {
	t.Helper()
	frags, err := streams.Fragment(&c, fragBudget)
	if err != nil {
		t.Fatal(err)
	}
	if len(frags) < 3 {
		t.Fatalf("%d fragments; want several", len(frags))
	}
	out := make([][]streams.Change, len(frags))
	for i := range frags {
		out[i] = frags[i : i+1]
	}
	return out
}

func TestConsumer_Fragments(t *testing.T) {
	big := strings.Repeat("big \"row\" é ", 300<<10/12)

	t.Run("JoinsFragments", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(1)
		r := e.start(e.config(tempFile(t)))
		r.waitWM(t, e.WM)
		var ps [][]streams.Change
		ps = append(ps, []streams.Change{ins(issue("a", "small", 1))})
		ps = append(ps, fragments(t, ins(issue("b", big, 2)))...)
		ps = append(ps, fragments(t, upd(nil, issue("a", big+"!", 3)))...)
		ps = append(ps, []streams.Change{ins(issue("c", "after", 4))})
		e.parts(ps...)
		r.waitWM(t, e.WM)
		got := query(t, r.file, "SELECT id, length(title), n FROM issue WHERE id IN ('a', 'b', 'c') ORDER BY id")
		want := []string{"a|" + strconv.Itoa(len([]rune(big))+1) + "|3", "b|" + strconv.Itoa(len([]rune(big))) + "|2", "c|5|4"}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("rows = %v; want %v", got, want)
		}
		if got := query(t, r.file, "SELECT title = '"+strings.ReplaceAll(big, "'", "''")+"' FROM issue WHERE id = 'b'"); got[0] != "1" {
			t.Error("joined value differs from the one cut")
		}
	})

	frags := func(t *testing.T) [][]streams.Change { return fragments(t, ins(issue("x", big, 1))) }
	for _, tc := range []struct {
		name  string
		parts func(t *testing.T) [][]streams.Change
		bad   int // index of the part whose message is poison
	}{
		{"TxEndsMidChange", func(t *testing.T) [][]streams.Change { f := frags(t); return f[:2] }, 1},
		{"ChangeBetweenFragments", func(t *testing.T) [][]streams.Change {
			f := frags(t)
			return append([][]streams.Change{f[0], {ins(issue("y", "Y", 1))}}, f[1:]...)
		}, 1},
		{"MissingFragment", func(t *testing.T) [][]streams.Change { f := frags(t); return append(f[:1], f[2:]...) }, 1},
		{"WithoutFirst", func(t *testing.T) [][]streams.Change { f := frags(t); return f[1:] }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.initialSync(1)
			r := e.start(e.config(tempFile(t)))
			r.waitWM(t, e.WM)
			seqs := e.parts(tc.parts(t)...)
			e.tx(ins(issue("after", "X", 1)))
			<-r.done
			err := r.stop()
			var de *replicator.DecodeError
			if !errors.As(err, &de) || de.Seq != seqs[tc.bad] || !errors.Is(err, streams.ErrMalformed) {
				t.Fatalf("Run = %v; want a DecodeError at seq %d", err, seqs[tc.bad])
			}
			if got := query(t, r.file, "SELECT count(*) FROM issue WHERE id IN ('x', 'y', 'after')"); got[0] != "0" {
				t.Error("a change of the poison transaction or after it was applied")
			}
		})
	}
}
