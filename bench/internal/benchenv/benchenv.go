// Package benchenv stands up what the end-to-end benchmarks run against: the
// jetsync binary, an upstream Postgres seeded by testdata/bench/seed.sh with
// read rules for anyone, and a reader of jetsync's JSON log.
package benchenv

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jetsync/jetsync/internal/pglocal"
)

// TempRoot makes a bench's temporary folder, open to the postgres user that
// runs the upstream when the bench runs as root. cleanup removes it unless
// keep, in which case its path is printed instead.
func TempRoot(name string, keep bool) (root string, cleanup func(), err error) {
	root, err = os.MkdirTemp("", "jetsync-bench-"+name+"-")
	if err != nil {
		return "", nil, err
	}
	if err := os.Chmod(root, 0o711); err != nil {
		_ = os.RemoveAll(root)
		return "", nil, err
	}
	if keep {
		fmt.Println("temporary folder:", root)
		return root, func() {}, nil
	}
	return root, func() { _ = os.RemoveAll(root) }, nil
}

// JetsyncBin returns path when it exists, else builds ./cmd/jetsync into dir
// without -race, as make build does.
func JetsyncBin(ctx context.Context, path, dir string) (string, error) {
	if _, err := os.Stat(path); err == nil {
		return filepath.Abs(path)
	}
	out := filepath.Join(dir, "jetsync")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/jetsync")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build jetsync: %w\n%s", err, b)
	}
	return out, nil
}

// DefaultData is the -bench-data default: the benchmark dataset
// (testdata/bench/README.md), relative to the module root.
const DefaultData = "testdata/bench"

// DataFlag defines the -bench-data flag, the folder holding seed.sh and
// schema.sql, into p.
func DataFlag(p *string) {
	flag.StringVar(p, "bench-data", DefaultData, "folder holding seed.sh and schema.sql; a relative path missing from the working directory is taken from the module root")
}

// DataDir resolves a -bench-data folder to an absolute path that holds
// seed.sh. A relative folder is looked for in the working directory, then
// in the module root (the nearest folder above holding go.mod), so that the
// default serves go run ./bench/x from anywhere in the repository.
func DataDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if wd, err := os.Getwd(); err == nil && !filepath.IsAbs(dir) && !hasSeed(abs) {
		for d := wd; filepath.Dir(d) != d; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				abs = filepath.Join(d, dir)
				break
			}
		}
	}
	if !hasSeed(abs) {
		return "", fmt.Errorf("-bench-data %s: no seed.sh there", abs)
	}
	return abs, nil
}

func hasSeed(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "seed.sh"))
	return err == nil
}

// StartUpstream starts a throwaway Postgres under root, seeds its zpeer
// database with seed.sh from the data folder (DataDir) and deploys read
// rules for appID letting anyone read every table. It returns the cluster
// and the database's URL.
func StartUpstream(ctx context.Context, root, data string, issues int, appID string) (*pglocal.Cluster, string, error) {
	data, err := DataDir(data)
	if err != nil {
		return nil, "", err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pg, err := pglocal.Start(ctx, pglocal.Config{Dir: filepath.Join(root, "pg"), FsyncOff: true, Logger: log})
	if err != nil {
		return nil, "", fmt.Errorf("start postgres: %w", err)
	}
	url := pg.URL("zpeer")
	fail := func(err error) (*pglocal.Cluster, string, error) {
		_ = pg.Kill(context.WithoutCancel(ctx))
		return nil, "", err
	}
	if err := pg.CreateDatabase(ctx, "zpeer"); err != nil {
		return fail(err)
	}
	t0 := time.Now()
	seed := exec.CommandContext(ctx, "bash", filepath.Join(data, "seed.sh"), strconv.Itoa(issues))
	seed.Env = append(os.Environ(), fmt.Sprintf("PSQL=%s %s -v ON_ERROR_STOP=1 -q", filepath.Join(pglocal.DefaultBinDir, "psql"), url))
	out, err := seed.CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("seed: %w\n%s", err, out))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fmt.Printf("seeded in %v: %s\n", time.Since(t0).Round(time.Millisecond), lines[len(lines)-1])
	if err := DeployPermissions(ctx, url, appID); err != nil {
		return fail(err)
	}
	return pg, url, nil
}

// DeployPermissions stores in <appID>.permissions what zero-deploy-permissions
// stores for the e2e app's schema (e2e/client/app/schema.mjs), whose rules
// are ANYONE_CAN on every table: read permissions deny by default, and the
// demo's own rules come only with the demo database.
func DeployPermissions(ctx context.Context, url, appID string) error {
	anyone := `{"row":{"select":[["allow",{"type":"and","conditions":[]}]]}}`
	rules := `{"tables":{"user":` + anyone + `,"issue":` + anyone + `,"comment":` + anyone +
		`,"label":` + anyone + `,"issue_label":` + anyone + `}}`
	schema := pgx.Identifier{appID}.Sanitize()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.PgConn().Exec(ctx, `
CREATE SCHEMA IF NOT EXISTS `+schema+`;
CREATE TABLE IF NOT EXISTS `+schema+`.permissions (
	"permissions" JSONB,
	"hash" TEXT,
	"lock" BOOL PRIMARY KEY DEFAULT true CHECK (lock)
);
INSERT INTO `+schema+`.permissions (permissions, hash) VALUES ('`+rules+`', md5('`+rules+`'::jsonb::text))
	ON CONFLICT (lock) DO UPDATE SET permissions = EXCLUDED.permissions, hash = EXCLUDED.hash;
`).ReadAll()
	if err != nil {
		return fmt.Errorf("deploy permissions: %w", err)
	}
	return nil
}

// LogWatch keeps jetsync's JSON log records, with their arrival times, and
// copies what it is written to a file. A line that is not JSON is kept as a
// record with only its msg.
type LogWatch struct {
	file    io.Writer
	mu      sync.Mutex
	partial []byte
	recs    []map[string]any
	times   []time.Time
	plain   []bool // the record is a line that was not JSON
}

// NewLogWatch returns a LogWatch copying to file.
func NewLogWatch(file io.Writer) *LogWatch { return &LogWatch{file: file} }

func (l *LogWatch) Write(b []byte) (int, error) {
	_, _ = l.file.Write(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		var rec map[string]any
		plain := json.Unmarshal(l.partial[:i], &rec) != nil
		if plain {
			rec = map[string]any{"msg": string(l.partial[:i])}
		}
		l.recs = append(l.recs, rec)
		l.plain = append(l.plain, plain)
		l.times = append(l.times, time.Now())
		l.partial = l.partial[i+1:]
	}
}

// Find returns the first record whose msg is msg, or nil.
func (l *LogWatch) Find(msg string) map[string]any {
	rec, _ := l.first("msg", msg)
	return rec
}

// FindLine returns the first record whose msg is msg, or that is a line
// (not JSON) holding msg, or nil: for children such as nats-server that
// write plain lines.
func (l *LogWatch) FindLine(msg string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range l.recs {
		if r["msg"] == msg {
			return r
		}
		if line, ok := r["msg"].(string); ok && l.plain[i] && strings.Contains(line, msg) {
			return r
		}
	}
	return nil
}

// At returns when the first record whose msg is msg arrived.
func (l *LogWatch) At(msg string) (time.Time, bool) {
	_, t := l.first("msg", msg)
	return t, !t.IsZero()
}

// Level returns the first record at level (such as "ERROR"), or nil.
func (l *LogWatch) Level(level string) map[string]any {
	rec, _ := l.first("level", level)
	return rec
}

func (l *LogWatch) first(key, value string) (map[string]any, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range l.recs {
		if r[key] == value {
			return r, l.times[i]
		}
	}
	return nil, time.Time{}
}

// Matching returns the records for which keep is true, in order.
func (l *LogWatch) Matching(keep func(rec map[string]any) bool) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, r := range l.recs {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// Tail returns the last 20 records, one JSON object a line.
func (l *LogWatch) Tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs[max(0, len(l.recs)-20):] {
		line, _ := json.Marshal(r)
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}
