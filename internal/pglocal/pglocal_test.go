package pglocal_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pglocal"
)

func TestCluster(t *testing.T) {
	ctx := context.Background()
	root := "/tmp/jetsync-pgtest"
	if err := os.MkdirAll(root, 0o711); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, "pglocal-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := pglocal.Config{Dir: filepath.Join(dir, "data"), FsyncOff: true}
	c, err := pglocal.Start(ctx, cfg)
	if errors.Is(err, pglocal.ErrNoBinaries) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(ctx) })
	if err := c.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	query := func(c *pglocal.Cluster, q string) string {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("app"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var s string
		if err := conn.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := query(c, "SHOW wal_level"); got != "logical" {
		t.Errorf("wal_level = %s", got)
	}
	if got := query(c, "SHOW unix_socket_directories"); got != c.SocketDir {
		t.Errorf("unix_socket_directories = %s; want %s", got, c.SocketDir)
	}
	// Start adopts a running cluster.
	again, err := pglocal.Start(ctx, cfg)
	if err != nil || again.Port != c.Port {
		t.Fatalf("Start on a running cluster = port %v, %v; want port %d", again, err, c.Port)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	c, err = pglocal.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := query(c, "SELECT current_database()"); got != "app" {
		t.Errorf("database after restart = %s", got)
	}
	if err := c.Kill(ctx); err != nil {
		t.Fatal(err)
	}
}
