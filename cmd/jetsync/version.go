package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/jetsync/jetsync/consumers/viewsyncer"
)

// buildVersion is what the binary knows of itself: the module version (a
// tag when built from a module download, "(devel)" from a checkout), the
// VCS revision stamped by the go command, and the sync protocol versions
// the view-syncer accepts.
type buildVersion struct {
	Module   string
	Revision string
	Time     string
	Modified bool
	Go       string
	MinProto int
	MaxProto int
}

// buildRevision is set with -ldflags "-X main.buildRevision=..." (make
// build does) for builds the go command could not stamp.
var buildRevision string

func readVersion() buildVersion {
	v := buildVersion{
		Module:   "(unknown)",
		Go:       runtime.Version(),
		MinProto: viewsyncer.MinServerProtocol,
		MaxProto: viewsyncer.ProtocolVersion,
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		v.Revision = buildRevision
		return v
	}
	v.Module = bi.Main.Version
	v.Go = bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	if v.Revision == "" {
		v.Revision = buildRevision
	}
	return v
}

func (v buildVersion) revision() string {
	r := v.Revision
	if r == "" {
		return "unknown"
	}
	if v.Modified {
		r += "+dirty"
	}
	return r
}

func (v buildVersion) String() string {
	s := fmt.Sprintf("jetsync %s\nrevision: %s", v.Module, v.revision())
	if v.Time != "" {
		s += " (" + v.Time + ")"
	}
	return s + fmt.Sprintf("\ngo: %s\nsync protocol: %d-%d\n", v.Go, v.MinProto, v.MaxProto)
}

// inspectorVersion is the inspector's version answer: what `jetsync
// version` prints, on one line.
func (v buildVersion) inspectorVersion() string {
	return strings.Join(strings.Split(strings.TrimSpace(v.String()), "\n"), "; ")
}

// attrs are the version's log attributes, for the startup line.
func (v buildVersion) attrs() []any {
	return []any{
		slog.String("version", v.Module),
		slog.String("revision", v.revision()),
		slog.String("go", v.Go),
		slog.String("sync_protocol", fmt.Sprintf("%d-%d", v.MinProto, v.MaxProto)),
	}
}

func cmdVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
			fmt.Fprintln(stdout, "Usage: jetsync version\n\nPrint the module version, VCS revision, Go version and the sync protocol versions served.")
			return nil
		}
		return usageError("version: unexpected argument %q", args[0])
	}
	fmt.Fprint(stdout, readVersion())
	return nil
}
