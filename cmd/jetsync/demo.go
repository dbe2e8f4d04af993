package main

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/internal/pglocal"
)

//go:embed demo.sql
var demoSQL string

// demoDatabase is the database of the demo upstream.
const demoDatabase = "demo"

// startDemo runs the local Postgres that `jetsync run` replicates from when no
// ZERO_UPSTREAM_DB is given, under <dataDir>/postgres, and loads the demo
// schema and rows into a fresh cluster. It returns the upstream URL.
func startDemo(ctx context.Context, dataDir string, port int, binDir, app string, log *slog.Logger) (*pglocal.Cluster, string, error) {
	cl, err := pglocal.Start(ctx, pglocal.Config{
		Dir:    filepath.Join(dataDir, "postgres"),
		Port:   port,
		BinDir: binDir,
		Logger: log.With(logkey.Component, "demo-postgres"),
	})
	if err != nil {
		return nil, "", fmt.Errorf("demo postgres: %w", err)
	}
	if err := loadDemo(ctx, cl, app); err != nil {
		_ = cl.Stop(context.WithoutCancel(ctx))
		return nil, "", err
	}
	return cl, cl.URL(demoDatabase), nil
}

// loadDemo creates the demo database and loads demo.sql, unless an earlier
// start did. The load is one implicit transaction (a multi-statement simple
// query), so a crash leaves the database empty and the next start loads it.
func loadDemo(ctx context.Context, cl *pglocal.Cluster, app string) error {
	conn, err := pgx.Connect(ctx, cl.URL("postgres"))
	if err != nil {
		return fmt.Errorf("demo postgres: %w", err)
	}
	var exists bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", demoDatabase).Scan(&exists)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("demo postgres: %w", err)
	}
	if !exists {
		if err := cl.CreateDatabase(ctx, demoDatabase); err != nil {
			return fmt.Errorf("demo postgres: %w", err)
		}
	}
	db, err := pgx.Connect(ctx, cl.URL(demoDatabase))
	if err != nil {
		return fmt.Errorf("demo postgres: %w", err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	var tables int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables); err != nil {
		return fmt.Errorf("demo postgres: %w", err)
	}
	if tables > 0 {
		return nil
	}
	if _, err := db.PgConn().Exec(ctx, demoSQL+demoPermissions(app)).ReadAll(); err != nil {
		return fmt.Errorf("demo postgres: load demo schema: %w", err)
	}
	return nil
}

// demoPermissions deploys read rules letting anyone read every demo table,
// as zero-deploy-permissions would with ANYONE_CAN: read permissions deny
// by default, and a demo that synced nothing would only puzzle. The table is
// the one the change-streamer creates (it keeps an existing one).
func demoPermissions(app string) string {
	anyone := `{"row":{"select":[["allow",{"type":"and","conditions":[]}]]}}`
	rules := `{"tables":{"user":` + anyone + `,"issue":` + anyone + `,"comment":` + anyone +
		`,"label":` + anyone + `,"issue_label":` + anyone + `}}`
	schema := pgx.Identifier{app}.Sanitize()
	return `
CREATE SCHEMA IF NOT EXISTS ` + schema + `;
CREATE TABLE IF NOT EXISTS ` + schema + `.permissions (
	"permissions" JSONB,
	"hash" TEXT,
	"lock" BOOL PRIMARY KEY DEFAULT true CHECK (lock)
);
INSERT INTO ` + schema + `.permissions (permissions, hash) VALUES ('` + rules + `', md5('` + rules + `'::jsonb::text))
	ON CONFLICT (lock) DO NOTHING;
`
}
