package benchenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a child process in its own process group, its stderr kept by a
// LogWatch that copies it to <dir>/<name>.log.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  *LogWatch
	// Stdin, when set, is closed first on Stop: some children stop when
	// it closes.
	Stdin io.Closer
	// Base is the child's http://127.0.0.1:PORT, for whoever sets it.
	Base string
	done chan struct{}
	err  error
}

// StartProc starts cmd; its log goes to dir, which it creates.
func StartProc(name string, cmd *exec.Cmd, dir string) (*Proc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: name, Cmd: cmd, Log: NewLogWatch(f), done: make(chan struct{})}
	cmd.Stderr = p.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
		f.Close()
	}()
	return p, nil
}

// Done is closed once p has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how p exited, once Done is closed.
func (p *Proc) Err() error { return p.err }

// Stop asks p to stop with SIGTERM, then after at most 20 s kills its group
// (and so what is left of it: zero-cache forks workers).
func (p *Proc) Stop() {
	if p.Stdin != nil {
		_ = p.Stdin.Close()
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// WaitLog waits for a log record whose msg is msg (or a plain line holding
// it).
func (p *Proc) WaitLog(ctx context.Context, msg string, limit time.Duration) (map[string]any, error) {
	deadline := time.Now().Add(limit)
	for {
		if rec := p.Log.FindLine(msg); rec != nil {
			return rec, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited (%v) before logging %q:\n%s", p.Name, p.err, msg, p.Log.Tail())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s did not log %q within %v:\n%s", p.Name, msg, limit, p.Log.Tail())
		}
	}
}

// Alive reports an error when p exited.
func (p *Proc) Alive() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited during the benchmark (%v):\n%s", p.Name, p.err, p.Log.Tail())
	default:
		return nil
	}
}

// AliveNoError reports an error when p exited or logged an ERROR record.
func (p *Proc) AliveNoError() error {
	if err := p.Alive(); err != nil {
		return err
	}
	if rec := p.Log.Level("ERROR"); rec != nil {
		return fmt.Errorf("%s logged an error: %v", p.Name, rec)
	}
	return nil
}

// WaitHealthy polls GET Base/ every interval until it answers 200, for at
// most limit. When Base is unset it first learns it from jetsync's "http
// listening" record, checked as often: a benchmark timing start -> healthy
// gets the interval's precision, where WaitListening's poll is coarser.
func (p *Proc) WaitHealthy(ctx context.Context, limit, interval time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if p.Base == "" {
			if rec := p.Log.FindLine("http listening"); rec != nil {
				p.setBase(rec)
			}
		}
		var err error
		if p.Base != "" {
			var resp *http.Response
			if resp, err = http.Get(p.Base + "/"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was healthy:\n%s", p.Name, p.err, p.Log.Tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: GET %s/ not healthy within %v (%v):\n%s", p.Name, p.Base, limit, err, p.Log.Tail())
		}
	}
}

// FreePort returns a TCP port free on 127.0.0.1 a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ServerEnv is this process's environment without its ZERO_ and JETSYNC_
// settings, then extra: a server configured by the benchmark alone.
func ServerEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ZERO_") && !strings.HasPrefix(kv, "JETSYNC_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// WaitListening waits up to limit for jetsync's "http listening" record and
// sets Base from its port.
func (p *Proc) WaitListening(ctx context.Context, limit time.Duration) error {
	rec, err := p.WaitLog(ctx, "http listening", limit)
	if err != nil {
		return err
	}
	p.setBase(rec)
	return nil
}

// setBase sets Base from an "http listening" record's port.
func (p *Proc) setBase(rec map[string]any) {
	port, _ := rec["port"].(float64)
	p.Base = fmt.Sprintf("http://127.0.0.1:%d", int(port))
}

// Mem reads a live process's peak (VmHWM) and current (VmRSS) resident set,
// in bytes.
func Mem(pid int) (hwm, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = kb << 10
		case "VmRSS:":
			rss = kb << 10
		}
	}
	if hwm == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
	}
	return hwm, rss, nil
}

// CPUTime reads a live process's user and system CPU time so far.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// after it, and utime and stime are the line's 14th and 15th.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad times %q %q", pid, f[11], f[12])
	}
	const userHZ = 100 // clock ticks per second on Linux
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}
