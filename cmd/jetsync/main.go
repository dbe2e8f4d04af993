// Command jetsync is a Zero-protocol sync server: Postgres logical
// replication into a NATS JetStream stream, and from the stream into SQLite
// replicas. "jetsync run" runs every part in one process; the other
// subcommands run one role each against an external NATS server, or debug
// the stream.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/jetsync/jetsync/streams"
)

type command struct {
	name  string
	short string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"run", "everything in one process, with embedded NATS (and a demo Postgres)", cmdRun},
		{"change-streamer", "Postgres into the change stream, plus a backup replica", cmdChangeStreamer},
		{"replicator", "a replica consumer alone", cmdReplicator},
		{"view-syncer", "a replica consumer and the HTTP server", cmdViewSyncer},
		{"tail", "print live change events", cmdTail},
		{"replay", "print history, or build a replica as of a point (--into)", cmdReplay},
		{"backup", "backup now: ask the change-streamer for a snapshot", cmdBackup},
		{"config", "print a role's effective settings and where each came from, secrets redacted", cmdConfig},
		{"demo-api", "the demo page's API server alone: its custom mutators' push endpoint", cmdDemoAPI},
		{"proxy", "a TCP round-robin proxy in front of view-syncers, for dev and demos", cmdProxy},
		{"version", "print the version, revision, Go version and sync protocol versions", cmdVersion},
	}
}

func main() {
	if err := setupRuntime(os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "jetsync:", err)
		os.Exit(2)
	}
	os.Exit(mainExit(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// mainExit runs a subcommand and maps its outcome to an exit code: 0, 1 for a
// failure, 2 for a command-line mistake.
func mainExit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printMainUsage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			return mainExit(ctx, []string{args[1], "-h"}, stdout, stderr)
		}
		printMainUsage(stdout)
		return 0
	case "-version", "--version":
		return mainExit(ctx, append([]string{"version"}, args[1:]...), stdout, stderr)
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintln(stderr, "jetsync:", strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
			return 2
		default:
			// Handlers log; this is the one place an error is reported.
			slog.Error("jetsync "+name+" failed", "err", err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "jetsync: unknown command %q\n\n", name)
	printMainUsage(stderr)
	return 2
}

func printMainUsage(w io.Writer) {
	fmt.Fprint(w, `jetsync: a Zero-protocol sync server on NATS JetStream.

Usage: jetsync <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-16s %s\n", c.name, c.short)
	}
	fmt.Fprint(w, `
Run "jetsync <command> -h" for a command's flags and environment variables.
`)
}

// common holds the settings every subcommand shares.
type common struct {
	appID     string
	shardNum  int
	logLevel  string
	logFormat string
}

func (c *common) register(fs *flag.FlagSet, e *env) {
	e.strVar(fs, &c.appID, "ZERO_APP_ID", "zero")
	e.intVar(fs, &c.shardNum, "ZERO_SHARD_NUM", 0)
	e.strVar(fs, &c.logLevel, "ZERO_LOG_LEVEL", "info")
	e.strVar(fs, &c.logFormat, "ZERO_LOG_FORMAT", "text")
}

func (c *common) shard() (streams.Shard, error) {
	s := streams.Shard{App: c.appID, Num: c.shardNum}
	if err := s.Validate(); err != nil {
		return s, usageError("%v", err)
	}
	return s, nil
}

// logger builds the process's logger and makes it the default, so that the
// final error in mainExit goes through it too.
func (c *common) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	switch strings.ToLower(c.logLevel) {
	case "debug":
		level = slog.LevelDebug
	case "info", "":
		level = slog.LevelInfo
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		return nil, usageError("log level %q: want debug, info, warn or error", c.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: redactAttr}
	var h slog.Handler
	switch strings.ToLower(c.logFormat) {
	case "text", "":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, usageError("log format %q: want text or json", c.logFormat)
	}
	l := slog.New(h)
	slog.SetDefault(l)
	return l, nil
}

// redactAttr is the last line of defence for secrets: any string value, or
// error text, that holds a URL password is redacted on its way out.
func redactAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); strings.Contains(s, "://") || strings.Contains(strings.ToLower(s), "password") {
			return slog.String(a.Key, redact(s))
		}
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			if s := err.Error(); strings.Contains(s, "://") || strings.Contains(strings.ToLower(s), "password") {
				return slog.String(a.Key, redact(s))
			}
		}
	}
	return a
}
