package replicator_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/consumers/replicator"
	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

func next(t *testing.T, s *replicator.Subscription) replicator.Update {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return u
}

func TestSubscription_Next(t *testing.T) {
	t.Run("ExactChanges", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(2)
		r := e.start(e.config(tempFile(t)))
		r.waitWM(t, e.Version)
		s := r.c.Subscribe()
		defer s.Close()

		e.tx(ins(issue("a", "A", 1)))
		wa := e.WM
		e.packed(
			[]streams.Change{upd(nil, streams.Row{"id": raw("i0"), "title": raw("zero")})},
			[]streams.Change{upd(streams.Row{"id": raw("i1")}, issue("one", "ONE", 1))},
		)
		w0, w1 := streams.Lexi(e.LSN-8), e.WM
		e.tx(del("a"))
		r.waitWM(t, e.WM)
		u := next(t, s)
		v := e.Version
		want := replicator.Update{From: e.Version, To: e.WM, Changes: []replicator.RowChange{
			{Table: "issue", Key: m("id", "a"), New: m("id", "a", "title", "A", "n", int64(1), "_0_version", wa)},
			{Table: "issue", Key: m("id", "i0"),
				Old: m("id", "i0", "title", "title 0", "n", int64(0), "_0_version", v),
				New: m("id", "i0", "title", "zero", "n", int64(0), "_0_version", w0)},
			{Table: "issue", Key: m("id", "i1"), Old: m("id", "i1", "title", "title 1", "n", int64(1), "_0_version", v)},
			{Table: "issue", Key: m("id", "one"), New: m("id", "one", "title", "ONE", "n", int64(1), "_0_version", w1)},
			{Table: "issue", Key: m("id", "a"), Old: m("id", "a", "title", "A", "n", int64(1), "_0_version", wa)},
		}}
		if diff := cmp.Diff(want, u); diff != "" {
			t.Errorf("Next (-want +got):\n%s", diff)
		}

		// Nothing new: Next blocks.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if u, err := s.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Next with nothing new = %+v, %v; want a timeout", u, err)
		}
		// A truncate is table-wide.
		from := e.WM
		e.tx(streams.Change{Op: streams.OpTruncate})
		if u := next(t, s); !u.Reset || u.From != from || u.To != e.WM || len(u.Changes) != 0 {
			t.Errorf("Next after truncate = %+v; want a reset from %s to %s", u, from, e.WM)
		}
	})

	t.Run("CapCollapsesToReset", func(t *testing.T) {
		e := newEnv(t)
		e.initialSync(0)
		cfg := e.config(tempFile(t))
		cfg.SubscriptionCap = 3
		r := e.start(cfg)
		r.waitWM(t, e.Version)
		s := r.c.Subscribe()
		e.tx(ins(issue("a", "A", 1)), ins(issue("b", "B", 2)))
		r.waitWM(t, e.WM)
		e.tx(ins(issue("c", "C", 3)), ins(issue("d", "D", 4)))
		r.waitWM(t, e.WM)
		u := next(t, s)
		if !u.Reset || u.From != e.Version || u.To != e.WM || len(u.Changes) != 0 {
			t.Errorf("Next past the cap = %+v; want a reset from %s to %s", u, e.Version, e.WM)
		}
		// Below the cap again, changes are listed.
		e.tx(del("a"))
		if u := next(t, s); u.Reset || len(u.Changes) != 1 {
			t.Errorf("Next = %+v; want one change", u)
		}
		s.Close()
		if _, err := s.Next(context.Background()); !errors.Is(err, replicator.ErrClosed) {
			t.Errorf("Next after Close = %v; want ErrClosed", err)
		}
	})

	t.Run("InitialSyncIsReset", func(t *testing.T) {
		e := newEnv(t)
		r := e.start(e.config(tempFile(t)))
		s := r.c.Subscribe()
		e.initialSync(3)
		r.waitWM(t, e.Version)
		if u := next(t, s); !u.Reset || u.To != e.Version {
			t.Errorf("Next after initial sync = %+v; want a reset to %s", u, e.Version)
		}
	})
}

func m(kv ...any) map[string]any {
	out := map[string]any{}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// TestSubscription_NextRead checks that a read transaction begun inside
// NextRead sees the replica at exactly the update's To while commits
// stream in, so that the view-syncer needs no second look.
func TestSubscription_NextRead(t *testing.T) {
	e := newEnv(t)
	e.initialSync(0)
	file := tempFile(t)
	r := e.start(e.config(file))
	r.waitWM(t, e.Version)
	s := r.c.Subscribe()
	defer s.Close()
	db, err := sql.Open("sqlite", "file:"+file+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	const txs = 1000
	last := make(chan string, 1)
	go func() {
		for i := range txs {
			e.tx(ins(issue(fmt.Sprintf("r%03d", i), "t", i)))
		}
		last <- e.WM
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var final string
	updates, mismatches := 0, 0
	for {
		var seen string
		u, err := s.NextRead(ctx, func() error {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
			if err != nil {
				return err
			}
			defer tx.Rollback()
			// A slow begin widens the window a commit could land in.
			time.Sleep(time.Millisecond)
			st, err := replica.LoadState(ctx, tx)
			seen = st.Watermark
			return err
		})
		if err != nil {
			t.Fatalf("NextRead: %v", err)
		}
		updates++
		if seen != u.To {
			mismatches++
			t.Errorf("update %d: read watermark %s; the update says %s", updates, seen, u.To)
		}
		select {
		case final = <-last:
		default:
		}
		if final != "" && u.To == final {
			break
		}
	}
	t.Logf("%d updates for %d transactions, %d mismatches", updates, txs, mismatches)
}
