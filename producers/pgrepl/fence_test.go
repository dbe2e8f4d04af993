package pgrepl_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/producers/pgrepl"
)

// TestSource_Fence shows that a producer whose fence fails (it lost the
// producer role) publishes nothing more, and that what it held back arrives
// once, when the fence lets it through again.
func TestSource_Fence(t *testing.T) {
	e := newEnv(t, `CREATE TABLE a (id int PRIMARY KEY, v text);`)
	var closed atomic.Bool
	var refused atomic.Int64
	errLost := errors.New("lost the producer role")
	src, err := pgrepl.New(pgrepl.Config{
		UpstreamURL: e.url,
		Shard:       shard,
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: testLogLevel})),
		Fence: func() error {
			if closed.Load() {
				refused.Add(1)
				return errLost
			}
			return nil
		},
	}, e.js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = src.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	e.waitSynced(t, "")
	_, txs := transactions(t, e.messages(t))
	n := len(txs)
	e.exec(t, `INSERT INTO a VALUES (1, 'before')`)
	e.waitTxs(t, n+1)
	before := len(e.messages(t))

	closed.Store(true)
	e.exec(t, `INSERT INTO a VALUES (2, 'fenced')`)
	e.exec(t, `INSERT INTO a VALUES (3, 'fenced')`)
	// Two refusals mean a session tried to publish, failed, and a later
	// one tried again: neither may have got anything through.
	polltest.Until(t, 30*time.Second, "the fence to refuse twice", func() bool { return refused.Load() >= 2 })
	if got := len(e.messages(t)); got != before {
		t.Fatalf("the stream went from %d to %d messages while the fence was closed", before, got)
	}

	closed.Store(false)
	txs = e.waitTxs(t, n+3)
	ids := map[string]int{}
	for _, tx := range txs {
		for _, c := range tx.changes {
			if c.New != nil {
				ids[string(c.New["id"])]++
			}
		}
	}
	for _, id := range []string{"1", "2", "3"} {
		if ids[id] != 1 {
			t.Errorf("row %s inserted %d times in the stream; want once", id, ids[id])
		}
	}
}
