// Package pgtest starts a throwaway Postgres cluster for tests, like
// net/http/httptest. One cluster is shared per test binary; each test gets
// its own database from NewDB.
//
// Use it with a TestMain, so that the cluster is killed when the package's
// tests end:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// Clusters live under Root, one directory per test binary holding an owner
// file with that process's pid. Start first kills clusters whose owner is
// dead, so a run that timed out leaves nothing running for long.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pglocal"
)

// Root holds every test cluster on the machine.
const Root = "/tmp/jetsync-pgtest"

const ownerFile = "owner.pid"

var (
	once    sync.Once
	shared  *pglocal.Cluster
	errOnce error
	dbSeq   atomic.Int64
)

// Start returns the package's shared cluster, starting it on first use
// (fsync off). It skips the test when the binaries are missing, unless
// CI=true, where it fails.
func Start(t testing.TB) *pglocal.Cluster {
	t.Helper()
	once.Do(func() { shared, errOnce = start() })
	if errOnce != nil {
		if errors.Is(errOnce, pglocal.ErrNoBinaries) && os.Getenv("CI") != "true" {
			t.Skipf("pgtest: %v", errOnce)
		}
		t.Fatalf("pgtest: %v", errOnce)
	}
	return shared
}

// Main runs the tests, then kills the shared cluster if one was started.
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := shared.Kill(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
		os.RemoveAll(filepath.Dir(shared.Dir))
	}
	return code
}

func start() (*pglocal.Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := os.MkdirAll(Root, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(Root, 0o711); err != nil {
		return nil, err
	}
	Reap(ctx)
	run, err := os.MkdirTemp(Root, "run-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(run, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	c, err := pglocal.Start(ctx, pglocal.Config{Dir: filepath.Join(run, "data"), FsyncOff: true, Logger: quiet})
	if err != nil {
		os.RemoveAll(run)
		return nil, err
	}
	return c, nil
}

var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// Reap kills the clusters under Root whose owning process is gone and
// removes their directories.
func Reap(ctx context.Context) {
	runs, _ := filepath.Glob(filepath.Join(Root, "run-*"))
	for _, run := range runs {
		b, err := os.ReadFile(filepath.Join(run, ownerFile))
		if err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err == nil && alive(pid) {
				continue
			}
		}
		data := filepath.Join(run, "data")
		if b, err := os.ReadFile(filepath.Join(data, "postmaster.pid")); err == nil {
			pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
			if pid > 0 && alive(pid) {
				// Start adopts a running cluster, which is what Kill needs.
				if c, err := pglocal.Start(ctx, pglocal.Config{Dir: data, Logger: quiet}); err == nil {
					c.Kill(ctx)
				}
			}
		}
		os.RemoveAll(run)
	}
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

var nonWord = regexp.MustCompile(`[^a-z0-9_]+`)

// NewDB creates a fresh database on c for t and returns its URL. At cleanup
// it drops the database's replication slots, so that they hold no WAL.
func NewDB(t testing.TB, c *pglocal.Cluster) string {
	t.Helper()
	name := nonWord.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("t%d_%s", dbSeq.Add(1), name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.CreateDatabase(ctx, name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
		conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, name)
	})
	return c.URL(name)
}

// NewRole creates a role like those of hosted Postgres services: LOGIN and
// REPLICATION but no superuser, so it cannot create event triggers. It may
// create schemas and publications in dbURL's database, and it owns every
// table in schema public. NewRole returns dbURL with the role as its user.
//
// Roles are cluster-wide: each is named after its database, and lives as
// long as the cluster.
func NewRole(t testing.TB, dbURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	role := "r_" + cfg.Database
	if len(role) > 63 {
		role = role[:63]
	}
	id := pgx.Identifier{role}.Sanitize()
	_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN REPLICATION;
		GRANT CREATE ON DATABASE %[2]s TO %[1]s;
		DO $$ DECLARE r record; BEGIN
			FOR r IN SELECT c.oid::regclass AS t FROM pg_class c
				WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') LOOP
				EXECUTE format('ALTER TABLE %%s OWNER TO %%I', r.t, %[3]s);
			END LOOP;
		END $$`, id, pgx.Identifier{cfg.Database}.Sanitize(), quoteLiteral(role)))
	if err != nil {
		t.Fatalf("pgtest: create role %s: %v", role, err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.User = url.User(role)
	return u.String()
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
