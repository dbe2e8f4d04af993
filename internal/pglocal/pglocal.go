// Package pglocal runs a local Postgres cluster from the installed binaries:
// the demo upstream of `jetsync run` when no ZERO_UPSTREAM_DB is given, and
// the test upstream of internal/pgtest.
package pglocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// DefaultBinDir is where Debian's postgresql-15 package installs the server.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// SystemUser is the OS user the server runs as when jetsync runs as root
// (Postgres refuses to run as root).
const SystemUser = "postgres"

// ErrNoBinaries reports that initdb or pg_ctl is not installed in BinDir.
var ErrNoBinaries = errors.New("postgres binaries not found")

// Config says where and how to run the cluster.
type Config struct {
	// Dir is the data directory. Start runs initdb when it holds no cluster.
	Dir string
	// Port is the TCP port on 127.0.0.1; zero picks a free one.
	Port int
	// BinDir holds initdb, pg_ctl and postgres; empty means $PGBIN, else
	// DefaultBinDir.
	BinDir string
	// FsyncOff trades durability for speed, for tests.
	FsyncOff bool
	Logger   *slog.Logger
}

// Validate checks c.
func (c Config) Validate() error {
	if c.Dir == "" {
		return errors.New("pglocal: Dir is required")
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("pglocal: bad port %d", c.Port)
	}
	return nil
}

// Cluster is a running local cluster.
type Cluster struct {
	Dir       string
	Port      int
	SocketDir string

	binDir string
	asUser *user.User // nil when the binaries run as the current user
	log    *slog.Logger
}

// Start starts the cluster in cfg.Dir, creating it first if needed, and
// returns once it accepts connections. A cluster already running in Dir is
// adopted as is.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("pglocal: %w", err)
	}
	c := &Cluster{Dir: dir, SocketDir: dir, binDir: binDir(cfg.BinDir), log: cfg.Logger}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.log = c.log.With("pgdata", dir)
	for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(c.binDir, b)); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrNoBinaries, filepath.Join(c.binDir, b))
		}
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(SystemUser)
		if err != nil {
			return nil, fmt.Errorf("pglocal: running as root needs the %s user: %w", SystemUser, err)
		}
		c.asUser = u
	}
	if err := c.prepareDir(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		c.log.Info("initdb")
		if out, err := c.run(ctx, "initdb", "-D", dir, "-U", "postgres", "-A", "trust", "-E", "UTF8",
			"--locale=C", "--no-sync"); err != nil {
			return nil, fmt.Errorf("pglocal: initdb: %w: %s", err, out)
		}
	} else if err != nil {
		return nil, fmt.Errorf("pglocal: %w", err)
	}

	if port, ok := c.runningPort(ctx); ok {
		c.Port = port
		c.log.Info("adopted running postgres", "port", port)
		return c, nil
	}
	c.Port = cfg.Port
	if c.Port == 0 {
		if c.Port, err = freePort(); err != nil {
			return nil, err
		}
	}
	if err := c.writeConf(cfg.FsyncOff); err != nil {
		return nil, err
	}
	if err := c.ctl(ctx, "start", "-w", "-t", "60", "-l", filepath.Join(dir, "postgres.log")); err != nil {
		return nil, err
	}
	c.log.Info("started postgres", "port", c.Port)
	return c, nil
}

// URL is a connection URL for database db.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// CreateDatabase creates database name.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pglocal: create database %s: %w", name, err)
	}
	return nil
}

// Stop shuts the server down cleanly (pg_ctl stop -m fast).
func (c *Cluster) Stop(ctx context.Context) error {
	return c.ctl(ctx, "stop", "-w", "-m", "fast")
}

// Kill stops the server without a shutdown checkpoint (pg_ctl stop -m
// immediate): crash recovery runs on the next start.
func (c *Cluster) Kill(ctx context.Context) error {
	return c.ctl(ctx, "stop", "-w", "-m", "immediate")
}

// Restart stops the server cleanly and starts it again on the same port.
func (c *Cluster) Restart(ctx context.Context) error {
	return c.ctl(ctx, "restart", "-w", "-t", "60", "-m", "fast", "-l", filepath.Join(c.Dir, "postgres.log"))
}

func (c *Cluster) ctl(ctx context.Context, args ...string) error {
	args = append([]string{args[0], "-D", c.Dir}, args[1:]...)
	if out, err := c.run(ctx, "pg_ctl", args...); err != nil {
		return fmt.Errorf("pglocal: pg_ctl %s: %w: %s", args[0], err, bytes.TrimSpace(out))
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	path := filepath.Join(c.binDir, bin)
	var cmd *exec.Cmd
	if c.asUser != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.asUser.Username, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	// pg_ctl leaves the postmaster running after it exits; it must not hold
	// our stdout, or the caller's pipe never closes.
	cmd.Stdin = nil
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.Dir = "/"
	// Its own process group: a Ctrl-C meant for jetsync must not reach the
	// server, which jetsync stops itself once the producer is done with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Run()
	return out.Bytes(), err
}

// prepareDir makes Dir, hands it to the server's user, and lets that user
// traverse its parents.
func (c *Cluster) prepareDir() error {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	if c.asUser == nil {
		return nil
	}
	uid, _ := strconv.Atoi(c.asUser.Uid)
	gid, _ := strconv.Atoi(c.asUser.Gid)
	err := filepath.Walk(c.Dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		return fmt.Errorf("pglocal: chown %s: %w", c.Dir, err)
	}
	// Only the search bit for others: enough to reach Dir, while listing and
	// reading stay as they were.
	for p := filepath.Dir(c.Dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pglocal: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("pglocal: make %s traversable: %w", p, err)
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

const confName = "jetsync.conf"

// writeConf writes jetsync's settings into their own file, included from
// postgresql.conf, so they are rewritten at each start without touching the
// rest.
func (c *Cluster) writeConf(fsyncOff bool) error {
	settings := []string{
		"listen_addresses = '127.0.0.1'",
		fmt.Sprintf("port = %d", c.Port),
		fmt.Sprintf("unix_socket_directories = '%s'", strings.ReplaceAll(c.SocketDir, "'", "''")),
		"wal_level = logical",
		// One slot per replica generation, two during a resync, and one per
		// test database when tests share a cluster.
		"max_replication_slots = 64",
		"max_wal_senders = 64",
		"max_connections = 200",
		"shared_buffers = 32MB",
		"log_min_messages = warning",
		// JIT costs more than it saves on small demo and test databases.
		"jit = off",
	}
	if fsyncOff {
		// synchronous_commit stays on: off would hold WAL back from the walsender
		// for up to wal_writer_delay (200 ms), and with fsync off a commit's
		// flush costs nothing anyway.
		settings = append(settings, "fsync = off", "full_page_writes = off")
	}
	if err := c.writeFile(confName, []byte(strings.Join(settings, "\n")+"\n")); err != nil {
		return err
	}
	main := filepath.Join(c.Dir, "postgresql.conf")
	b, err := os.ReadFile(main)
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	include := "include_if_exists '" + confName + "'"
	if bytes.Contains(b, []byte(include)) {
		return nil
	}
	return c.writeFile("postgresql.conf", append(b, []byte("\n"+include+"\n")...))
}

func (c *Cluster) writeFile(name string, data []byte) error {
	p := filepath.Join(c.Dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	if c.asUser != nil {
		uid, _ := strconv.Atoi(c.asUser.Uid)
		gid, _ := strconv.Atoi(c.asUser.Gid)
		if err := os.Chown(p, uid, gid); err != nil {
			return fmt.Errorf("pglocal: %w", err)
		}
	}
	return nil
}

// runningPort reports the port of a server already running in Dir.
func (c *Cluster) runningPort(ctx context.Context) (int, bool) {
	if _, err := c.run(ctx, "pg_ctl", "status", "-D", c.Dir); err != nil {
		return 0, false
	}
	port, err := PIDFilePort(c.Dir)
	return port, err == nil
}

// PIDFilePort reads the port from the postmaster.pid of the cluster in dir.
func PIDFilePort(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0, fmt.Errorf("pglocal: short postmaster.pid in %s", dir)
	}
	return strconv.Atoi(strings.TrimSpace(lines[3]))
}

func binDir(dir string) string {
	if dir != "" {
		return dir
	}
	if d := os.Getenv("PGBIN"); d != "" {
		return d
	}
	return DefaultBinDir
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pglocal: pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
