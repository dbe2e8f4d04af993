package benchenv

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/jetsync/jetsync/streams"
)

// IssueIDs returns the seeded issues' ids in order.
func IssueIDs(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT id FROM issue ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// LoadCount runs single-row UPDATE transactions on random issues of ids from
// n clients for d, and returns how many committed. Each client's choice of
// issues is seeded by its number, so that runs repeat.
func LoadCount(ctx context.Context, pool *pgxpool.Pool, ids []string, n int, d time.Duration) (int64, error) {
	var count atomic.Int64
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			for ctx.Err() == nil {
				id := ids[r.IntN(len(ids))]
				if _, err := pool.Exec(ctx, `UPDATE issue SET modified = modified + 1 WHERE id = $1`, id); err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				count.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	return count.Load(), <-errs
}

// PacedRetitles commits n single-row UPDATEs at rate per second, from at
// most conns connections at once so that a slow commit does not hold the
// rate back. Update i sets the title of ids[i%len(ids)] to title(i). It
// returns when each update's commit returned, in Unix nanoseconds (0 for one
// that failed).
func PacedRetitles(ctx context.Context, pool *pgxpool.Pool, rate, n, conns int, ids []string, title func(i int) string) []atomic.Int64 {
	committed := make([]atomic.Int64, n)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	sem := make(chan struct{}, conns)
	var wg sync.WaitGroup
	for i := range n {
		<-tick.C
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := pool.Exec(ctx, `UPDATE issue SET title = $1 WHERE id = $2`, title(i), ids[i%len(ids)]); err == nil {
				committed[i].Store(time.Now().UnixNano())
			}
		})
	}
	wg.Wait()
	return committed
}

// NewTitles returns the titles that the changes of a change message (as
// streams encodes it) set; none for one that does not decode.
func NewTitles(data []byte) []string {
	m, err := streams.Decode(data)
	if err != nil {
		return nil
	}
	var titles []string
	for _, p := range m.Parts {
		for _, c := range p.Changes {
			var t string
			if json.Unmarshal(c.New["title"], &t) == nil {
				titles = append(titles, t)
			}
		}
	}
	return titles
}
