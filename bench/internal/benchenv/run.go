package benchenv

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Run says how a bench starts `jetsync run`: in-process NATS that listens
// nowhere else, a free port, JSON logs and its data under Root/data.
type Run struct {
	Bin, Root string
	// Env is the bench's own settings (the upstream, the app); later
	// entries win over earlier ones.
	Env []string
	// Extra is a bench's -env flag: comma-separated KEY=VALUE settings,
	// added last.
	Extra string
	// AfterBackup waits for the first backup snapshot too, unless Extra
	// or Env turns backups off: it follows the initial sync at once and
	// takes both cores for a few seconds, so a bench that measures the
	// steady state starts after it.
	AfterBackup bool
	// HealthEvery is how often to poll /healthz while waiting; 20 ms if 0.
	HealthEvery time.Duration
}

// StartRun starts `jetsync run` and returns once its HTTP server listens,
// its replica has applied the initial sync and it answers /healthz.
func StartRun(ctx context.Context, r Run) (*Proc, error) {
	cmd := exec.Command(r.Bin, "run")
	env := append([]string{
		"JETSYNC_DATA_DIR=" + filepath.Join(r.Root, "data"),
		"ZERO_PORT=0",
		"JETSYNC_NATS_LISTEN=",
		"ZERO_LOG_FORMAT=json",
	}, r.Env...)
	env = append(env, SplitEnv(r.Extra)...)
	cmd.Env = ServerEnv(env...)
	p, err := StartProc("jetsync", cmd, r.Root)
	if err != nil {
		return nil, err
	}
	if err := r.wait(ctx, p, env); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

func (r Run) wait(ctx context.Context, p *Proc, env []string) error {
	if err := p.WaitListening(ctx, time.Minute); err != nil {
		return err
	}
	if _, err := p.WaitLog(ctx, "initial sync applied", 5*time.Minute); err != nil {
		return err
	}
	if r.AfterBackup && backupsOn(env) {
		if _, err := p.WaitLog(ctx, "a restorable snapshot exists", 5*time.Minute); err != nil {
			return err
		}
	}
	every := r.HealthEvery
	if every <= 0 {
		every = 20 * time.Millisecond
	}
	return p.WaitHealthy(ctx, time.Minute, every)
}

// backupsOn is whether env, last entry winning, leaves backups on.
func backupsOn(env []string) bool {
	on := true
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "JETSYNC_BACKUP="); ok {
			on = v != "off"
		}
	}
	return on
}

// SplitEnv splits a -env flag's comma-separated KEY=VALUE settings.
func SplitEnv(s string) []string {
	var out []string
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			out = append(out, kv)
		}
	}
	return out
}
