package viewsyncer

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// issueWithComments is one issue and its comments.
func issueWithComments(id string) string {
	return `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"id"},"right":{"type":"literal","value":"` + id +
		`"},"op":"="},"related":[{"correlation":{"parentField":["id"],"childField":["issue_id"]},"subquery":{"table":"comment","alias":"comments"},"system":"client"}]}`
}

// cvrMessages counts the messages the CVR stream holds for a group.
func cvrMessages(t *testing.T, e *env, group string) uint64 {
	t.Helper()
	ctx := context.Background()
	stream, err := e.js.Stream(ctx, e.shard.CVRStream())
	if err != nil {
		t.Fatal(err)
	}
	subject := e.shard.CVRSubject(group)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// nextPoke reads c's next poke and checks that it follows base and carries
// one patch with each of want, and nothing else.
func nextPoke(t *testing.T, c *tc, name, base string, want ...string) pokeSummary {
	t.Helper()
	p := c.poke()
	if p.base == nil || *p.base != base || p.cookie <= base {
		t.Fatalf("%s: poke from %v to %s; want one from %s to a later cookie", name, p.base, p.cookie, base)
	}
	if len(p.patches) != len(want) {
		t.Fatalf("%s: poke = %v; want %d patches %v", name, p.patches, len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(p.patches[i], w) {
			t.Errorf("%s: patch %d = %s; want one with %s", name, i, p.patches[i], w)
		}
	}
	return p
}

// TestServer_IdleAdvance checks that an advance that changes none of a
// group's rows pokes none of its clients and writes nothing to its CVR,
// as zero-cache does, while a group that watches the changed rows is
// poked; and that the quiet group's pipelines still moved on: its next
// change is an incremental poke from its last cookie, not a re-run of
// its query.
func TestServer_IdleAdvance(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(map[bool]string{false: "Memory", true: "Durable"}[durable], func(t *testing.T) {
			e := newEnv(t, envOptions{issues: 30, durable: durable})
			quiet := connect(t, e, dialOpts{group: "quiet", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
			qp := quiet.hydrated()
			busy := connect(t, e, dialOpts{group: "busy", client: "c1", init: initFrame(testSchema, put("b", issueWithComments("i0000010"), 0))})
			bp := busy.hydrated()
			if countPrefix(qp, "row ") != 2 || countPrefix(bp, "row ") != 3 {
				t.Fatalf("hydrations = %v and %v; want an issue with its owner, and one with its 2 comments", qp.patches, bp.patches)
			}
			m := e.srv.metrics
			hydrations, idle := counterValue(t, m.hydrations), counterValue(t, m.idleSyncs)
			var written uint64
			if durable {
				written = cvrMessages(t, e, "quiet")
			}

			// Another table's row, then a row of the quiet group's table
			// outside its where: only the busy group sees either.
			e.execSQL("UPDATE comment SET body = 'noted' WHERE id = 'c0000010-1'")
			bp = nextPoke(t, busy, "comment", bp.cookie, "noted")
			e.execSQL("UPDATE issue SET title = 'beside' WHERE id = 'i0000010'")
			bp = nextPoke(t, busy, "issue beside", bp.cookie, "beside")

			// The quiet group's own row: its first poke since hydration,
			// from the cookie it was left at.
			e.execSQL("UPDATE issue SET title = 'mine' WHERE id = 'i0000007'")
			qp = nextPoke(t, quiet, "own row", qp.cookie, "mine")
			if durable {
				if n := cvrMessages(t, e, "quiet") - written; n != 1 {
					t.Errorf("the quiet group's CVR got %d messages over three advances; want 1, for the one that changed its row", n)
				}
			}
			if got := counterValue(t, m.hydrations); got != hydrations {
				t.Errorf("hydrations went from %v to %v; want the quiet group's query updated, not re-run", hydrations, got)
			}
			if got := counterValue(t, m.idleSyncs); got < idle+2 {
				t.Errorf("idle syncs went from %v to %v; want at least the quiet group's 2", idle, got)
			}

			// The busy group was not poked for the quiet one's row: its
			// next poke follows its last cookie.
			e.execSQL("UPDATE comment SET body = 'again' WHERE id = 'c0000010-2'")
			nextPoke(t, busy, "comment again", bp.cookie, "again")

			// A config change of the quiet group, whose CVR is older than
			// its pipelines: the desired patch at a config version of its
			// CVR, then the new query's rows at the replica's, the old
			// query not re-run.
			quiet.send(`["changeDesiredQueries",{"desiredQueriesPatch":[` + put("c", issueWithComments("i0000011"), 0) + `]}]`)
			qp = nextPoke(t, quiet, "desired c", qp.cookie, `desired c1 {"hash":"c","op":"put"}`)
			p := quiet.poke()
			if p.base == nil || *p.base != qp.cookie || p.cookie <= qp.cookie || !has(p, `got {"hash":"c","op":"put"}`) || countPrefix(p, "row ") != 3 {
				t.Errorf("query c's poke = %+v; want got c and its 3 rows after %s", p, qp.cookie)
			}
			if got := counterValue(t, m.hydrations); got != hydrations+1 {
				t.Errorf("hydrations went from %v to %v; want one more, query c's", hydrations, got)
			}
			e.execSQL("UPDATE issue SET title = 'later' WHERE id = 'i0000007'")
			nextPoke(t, quiet, "own row later", p.cookie, "later")
			if durable {
				checkHistory(t, e, "quiet")
			}
		})
	}
}

// TestDurable_IdleAdvanceRestart checks that a CVR left at an older
// version than the replica by advances that changed none of its rows
// serves a returning client right: reloaded elsewhere, it catches the
// client up from its cookie with exactly what changed since.
func TestDurable_IdleAdvanceRestart(t *testing.T) {
	o := envOptions{issues: 30, durable: true}
	e := newEnv(t, o)
	quiet := connect(t, e, dialOpts{group: "quiet", client: "c1", init: initFrame(testSchema, put("a", issue7, 0))})
	qp := quiet.hydrated()
	busy := connect(t, e, dialOpts{group: "busy", client: "c1", init: initFrame(testSchema, put("b", issueWithComments("i0000010"), 0))})
	bp := busy.hydrated()
	written := cvrMessages(t, e, "quiet")
	e.execSQL("UPDATE issue SET title = 'beside' WHERE id = 'i0000010'")
	bp = nextPoke(t, busy, "issue beside", bp.cookie, "beside")
	// Advances run one after another: once the busy group has the
	// second, the quiet group is done with the first.
	e.execSQL("UPDATE comment SET body = 'noted' WHERE id = 'c0000010-1'")
	nextPoke(t, busy, "comment", bp.cookie, "noted")
	if n := cvrMessages(t, e, "quiet") - written; n != 0 {
		t.Errorf("the quiet group's CVR got %d messages for an advance that changed none of its rows; want none", n)
	}

	quiet.ws.Close()
	e.sy.stop()
	e.execSQL("UPDATE issue SET title = 'while down' WHERE id = 'i0000007'")
	e.use(e.startSyncer("vs-b", o))
	quiet = connect(t, e, dialOpts{group: "quiet", client: "c1", base: qp.cookie, init: initFrame("")})
	p := expectCatchup(t, quiet, qp.cookie, "while down")
	hydrations := counterValue(t, e.srv.metrics.hydrations)
	e.execSQL("UPDATE issue SET title = 'after' WHERE id = 'i0000010'")
	e.execSQL("UPDATE issue SET title = 'back' WHERE id = 'i0000007'")
	nextPoke(t, quiet, "after the reload", p.cookie, "back")
	if got := counterValue(t, e.srv.metrics.hydrations); got != hydrations {
		t.Errorf("hydrations went from %v to %v after the reload; want its queries updated, not re-run", hydrations, got)
	}
	checkHistory(t, e, "quiet")
}

// TestServer_QuietPass checks that an advance moves a group none of whose
// rows its changes can touch without the full advance (no snapshot, CVR
// update or poke: advanceHook does not run for it), and that the group
// still follows the rows that do concern it, incrementally: one moving
// into its where, then one moving out.
func TestServer_QuietPass(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(map[bool]string{false: "Memory", true: "Durable"}[durable], func(t *testing.T) {
			e := newEnv(t, envOptions{issues: 30, durable: durable})
			// u000008 owns i0000007, i0000017 and i0000027.
			byOwner := `{"table":"issue","where":{"type":"simple","left":{"type":"column","name":"owner_id"},"right":{"type":"literal","value":"u000008"},"op":"="},"orderBy":[["id","asc"]]}`
			quiet := connect(t, e, dialOpts{group: "quiet", client: "c1", init: initFrame(testSchema, put("o", byOwner, 0))})
			qp := quiet.hydrated()
			hot := connect(t, e, dialOpts{group: "hot", client: "c1", init: initFrame(testSchema, put("h", `{"table":"issue","orderBy":[["id","asc"]],"limit":3}`, 0))})
			hp := hot.hydrated()
			if countPrefix(qp, "row ") != 3 || countPrefix(hp, "row ") != 3 {
				t.Fatalf("hydrations = %v and %v; want 3 rows each", qp.patches, hp.patches)
			}
			var mu sync.Mutex
			advanced := map[string]int{}
			hook := func(id string) {
				mu.Lock()
				defer mu.Unlock()
				advanced[id]++
			}
			advanceHook.Store(&hook)
			t.Cleanup(func() { advanceHook.Store(nil) })
			m := e.srv.metrics
			hydrations := counterValue(t, m.hydrations)
			var written uint64
			if durable {
				written = cvrMessages(t, e, "quiet")
			}

			// Rows of the quiet group's table outside its where. Advances
			// run one after another: once the hot group has the second
			// one's poke, the first is done for every group.
			e.execSQL("UPDATE issue SET title = 'one' WHERE id = 'i0000001'")
			hp = nextPoke(t, hot, "one", hp.cookie, "one")
			e.execSQL("UPDATE issue SET title = 'two' WHERE id = 'i0000002'")
			hp = nextPoke(t, hot, "two", hp.cookie, "two")
			mu.Lock()
			if advanced["quiet"] != 0 || advanced["hot"] < 2 {
				t.Errorf("full advances = %v; want the hot group's 2, none of the quiet group's", advanced)
			}
			mu.Unlock()
			if durable {
				if n := cvrMessages(t, e, "quiet") - written; n != 0 {
					t.Errorf("the quiet group's CVR got %d messages; want none", n)
				}
			}

			// A row moves in, then one moves out: pokes from the cookie
			// the group was left at, its query updated, not re-run.
			e.execSQL("UPDATE issue SET owner_id = 'u000008', title = 'joins' WHERE id = 'i0000001'")
			qp = nextPoke(t, quiet, "joins", qp.cookie, "joins")
			hp = nextPoke(t, hot, "joins", hp.cookie, "joins")
			e.execSQL("UPDATE issue SET owner_id = 'u000001' WHERE id = 'i0000017'")
			p := nextPoke(t, quiet, "leaves", qp.cookie, "i0000017")
			if !strings.Contains(p.patches[0], `"op":"del"`) {
				t.Errorf("i0000017's patch = %s; want a del", p.patches[0])
			}
			if got := counterValue(t, m.hydrations); got != hydrations {
				t.Errorf("hydrations went from %v to %v; want the queries updated, not re-run", hydrations, got)
			}
			e.execSQL("UPDATE issue SET title = 'three' WHERE id = 'i0000003'")
			nextPoke(t, hot, "three", hp.cookie, "three")
			if durable {
				checkHistory(t, e, "quiet")
			}
		})
	}
}
