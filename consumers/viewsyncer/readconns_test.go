package viewsyncer

import (
	"context"
	"database/sql"
	"testing"
)

// TestServer_ReadConnCache checks that every replica read connection, of
// both pools, has the small page cache.
func TestServer_ReadConnCache(t *testing.T) {
	e := newEnv(t, envOptions{issues: 5})
	ctx := context.Background()
	for _, pool := range []struct {
		name string
		db   *sql.DB
		n    int
	}{{"groups", e.srv.db, groupReadConns}, {"advance", e.srv.advDB, DefaultReadConns}} {
		// Held at once, so that each is a connection of its own. The
		// advance may hold one of its pool already.
		n := pool.n - 1
		var conns []*sql.Conn
		for range n {
			cn, err := pool.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, cn)
		}
		for i, cn := range conns {
			var size int
			if err := cn.QueryRowContext(ctx, "PRAGMA cache_size").Scan(&size); err != nil {
				t.Fatal(err)
			}
			if size != -readCacheKiB {
				t.Errorf("%s pool, connection %d: cache_size = %d; want %d", pool.name, i, size, -readCacheKiB)
			}
			_ = cn.Close()
		}
	}
}
