package pgtest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pglocal"
	"github.com/jetsync/jetsync/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func TestNewDB(t *testing.T) {
	c := pgtest.Start(t)
	url := pgtest.NewDB(t, c)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil || level != "logical" {
		t.Fatalf("wal_level = %q, %v; want logical", level, err)
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	conn2, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	conn2.Close(ctx)
}

func TestReap(t *testing.T) {
	pgtest.Start(t) // skips without binaries
	ctx := context.Background()
	run, err := os.MkdirTemp(pgtest.Root, "run-")
	if err != nil {
		t.Fatal(err)
	}
	// A pid that can't be alive: above the kernel's pid_max.
	if err := os.WriteFile(filepath.Join(run, "owner.pid"), []byte("2147483647"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := pglocal.Start(ctx, pglocal.Config{Dir: filepath.Join(run, "data"), FsyncOff: true})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Reap(ctx)
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		c.Kill(ctx)
		t.Fatalf("%s still exists: %v", run, err)
	}
	if conn, err := pgx.Connect(ctx, c.URL("postgres")); err == nil {
		conn.Close(ctx)
		t.Error("the reaped cluster still accepts connections")
	}
}
