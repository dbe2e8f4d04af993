package viewsyncer

import (
	"context"
	"encoding/json"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/cvrstore"
)

// failingStore fails the flushes of query-driven updates with at least
// partSize rows, which are streamed, while fail is set.
type failingStore struct {
	cvrStore
	fail atomic.Bool
}

func (f *failingStore) Flush(ctx context.Context, c *cvrstore.CVR, u *cvrstore.Update) error {
	if f.fail.Load() && u.Query && u.PatchedRows() >= partSize {
		return context.DeadlineExceeded
	}
	return f.cvrStore.Flush(ctx, c, u)
}

// readPokeFrames reads one poke's frames, or what came of one before an
// error frame (then included, and last).
func (c *tc) readPokeFrames() []json.RawMessage {
	c.t.Helper()
	var frames []json.RawMessage
	for {
		_ = c.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			c.t.Fatalf("read poke: %v (after %d frames)", err, len(frames))
		}
		tag, _ := splitFrame(c.t, data)
		switch {
		case tag == "pong":
			continue
		case len(frames) == 0 && tag != "pokeStart":
			c.t.Fatalf("got %s; want a poke", data)
		}
		frames = append(frames, data)
		if tag == "pokeEnd" || tag == "error" {
			return frames
		}
	}
}

func TestServer_StreamedPoke(t *testing.T) {
	const issues = 250 // several parts
	e := newEnv(t, envOptions{issues: issues})
	all := `{"table":"issue","orderBy":[["id","asc"]]}`

	t.Run("FanOut", func(t *testing.T) {
		a := connect(t, e, dialOpts{group: "fan", client: "a", init: initFrame(testSchema)})
		a.hydrated()
		b := connect(t, e, dialOpts{group: "fan", client: "b", init: initFrame("")})
		b.expect("connected")
		b.poke()
		a.poke() // b joined
		a.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("q", all, 0) + `]}]`)
		a.poke()
		b.poke()
		var got [][]string
		for _, c := range []*tc{a, b} {
			frames := c.readPokeFrames()
			if len(frames) < 4 {
				t.Fatalf("poke of %d frames; want a start, several parts and an end: %s", len(frames), frames)
			}
			s := summarize(t, frames)
			if countPrefix(s, "row ") != issues || !has(s, `got {"hash":"q","op":"put"}`) {
				t.Fatalf("poke = %d rows, got put %v; want %d rows and the got put", countPrefix(s, "row "), has(s, `got {"hash":"q","op":"put"}`), issues)
			}
			seen := map[string]bool{}
			for _, p := range s.patches {
				if seen[p] {
					t.Fatalf("patch %s sent twice", p)
				}
				seen[p] = true
			}
			slices.Sort(s.patches)
			got = append(got, s.patches)
		}
		if !slices.Equal(got[0], got[1]) {
			t.Errorf("clients at the same cookie got different pokes")
		}
		// A change to one row is not streamed: one part.
		e.execSQL("UPDATE issue SET title = 'x' WHERE id = 'i0000007'")
		if frames := a.readPokeFrames(); len(frames) != 3 {
			t.Errorf("one-row poke of %d frames; want 3", len(frames))
		}
	})

	t.Run("FlushFails", func(t *testing.T) {
		var fs *failingStore
		e := newEnv(t, envOptions{issues: issues, wrapStore: func(s cvrStore) cvrStore {
			fs = &failingStore{cvrStore: s}
			return fs
		}})
		a := connect(t, e, dialOpts{group: "fail", client: "a", init: initFrame(testSchema)})
		a.hydrated()
		fs.fail.Store(true)
		a.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("q", all, 0) + `]}]`)
		a.poke()
		frames := a.readPokeFrames()
		tag, _ := splitFrame(t, frames[len(frames)-1])
		if tag != "error" || len(frames) < 3 {
			t.Fatalf("got %d frames ending in %s; want streamed parts, then an error", len(frames), tag)
		}
		for _, f := range frames {
			if tag, _ := splitFrame(t, f); tag == "pokeEnd" {
				t.Fatalf("got a pokeEnd for an update that was not stored")
			}
		}
		var pe protocolError
		_, body := splitFrame(t, frames[len(frames)-1])
		if err := json.Unmarshal(body, &pe); err != nil || pe.Kind != kindRehome {
			t.Fatalf("error %s; want %s", body, kindRehome)
		}
	})
}

// TestServer_PokeIsOneWrite checks that a poke's frames, queued together,
// reach the socket in one write, not one each (coalesce.go).
func TestServer_PokeIsOneWrite(t *testing.T) {
	e := newEnv(t, envOptions{issues: 20})
	a := connect(t, e, dialOpts{group: "one", client: "a", init: initFrame(testSchema)})
	a.hydrated()
	a.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("q", `{"table":"issue","orderBy":[["id","asc"]]}`, 0) + `]}]`)
	// The query's got put may come in a poke after the desire's.
	for i := 0; !has(a.poke(), `got {"hash":"q","op":"put"}`); i++ {
		if i == 2 {
			t.Fatal("no poke put query q in the got set")
		}
	}
	e.srv.mu.Lock()
	g := e.srv.groups["one"]
	e.srv.mu.Unlock()
	g.mu.Lock()
	out := g.conns["a"].out
	g.mu.Unlock()
	if out == nil {
		t.Fatal("the connection's socket is not a heldConn")
	}
	before := out.writes.Load()
	e.execSQL("UPDATE issue SET title = 'x' WHERE id = 'i0000007'")
	if frames := a.readPokeFrames(); len(frames) != 3 {
		t.Fatalf("one-row poke of %d frames; want 3", len(frames))
	}
	if n := out.writes.Load() - before; n != 1 {
		t.Errorf("a poke of 3 frames took %d writes to the socket; want 1", n)
	}
}
