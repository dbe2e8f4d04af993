package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jetsync/jetsync/streams"
)

const configSummary = `Print the settings a role would run with: each setting it reads, its
effective value and where that came from (default, env or flag), then any
setting in the environment it does not read, and what the role would do about
it. Secrets never show: keys, passwords and tokens print as (set), URLs with
their passwords redacted. The role is run unless named first
(jetsync config view-syncer -port 5000); its flags are accepted.`

// roleFlagSets are the flag sets of the roles jetsync config describes.
var roleFlagSets = map[string]func(*flag.FlagSet, *env){
	"run":             func(fs *flag.FlagSet, e *env) { new(runFlags).register(fs, e) },
	"change-streamer": func(fs *flag.FlagSet, e *env) { new(changeStreamerFlags).register(fs, e) },
	"replicator":      func(fs *flag.FlagSet, e *env) { new(consumerFlags).register(fs, e, replicatorRole) },
	"view-syncer":     func(fs *flag.FlagSet, e *env) { new(consumerFlags).register(fs, e, viewSyncerRole) },
	"demo-api":        func(fs *flag.FlagSet, e *env) { new(demoAPIFlags).register(fs, e) },
}

func cmdConfig(_ context.Context, args []string, stdout, _ io.Writer) error {
	name := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	reg, ok := roleFlagSets[name]
	if !ok {
		return usageError("config: %q is not a role: want run, change-streamer, replicator or view-syncer", name)
	}
	e := newEnv()
	fs := flag.NewFlagSet("jetsync config "+name, flag.ContinueOnError)
	reg(fs, e)
	if err := parseFlags(fs, e, stdout, configSummary, args); err != nil {
		return err
	}
	return printConfig(stdout, name, fs, e)
}

// printConfig writes one line per setting: its name, value, source and, for
// a setting the role does not read, what it does about it.
func printConfig(w io.Writer, role string, fs *flag.FlagSet, e *env) error {
	visited := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { visited[f.Name] = true })
	set := func(name string) (string, bool) {
		v, ok := e.lookup(name)
		return v, ok && v != ""
	}
	var shardNum int
	fmt.Sscan(fs.Lookup("shard-num").Value.String(), &shardNum)
	names := shardNames(streams.Shard{App: fs.Lookup("app-id").Value.String(), Num: shardNum})

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tVALUE\tSOURCE\tNOTE")
	for i := range settingsTable {
		s := &settingsTable[i]
		if s.kind != honoured || s.flag == "" || fs.Lookup(s.flag) == nil {
			continue
		}
		f := fs.Lookup(s.flag)
		source := "default"
		switch {
		case visited[s.flag]:
			source = "flag -" + s.flag
		case s.env == "JETSYNC_NATS_CONTEXT":
			if _, ok := e.lookup(s.env); ok {
				source = "env"
			} else if _, ok := set("NATS_CONTEXT"); ok {
				source = "env NATS_CONTEXT"
			}
		default:
			if _, ok := e.lookup(s.env); ok {
				source = "env"
			} else if a := aliasSet(s.env, set); a != "" {
				source = "env " + a
			}
		}
		v := showValue(s, f.Value.String())
		if v == `""` && s.def != "" && s.def != "unset" {
			// The role works the value out at start: say how.
			v = `"" (` + plain(s.def) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", s.env, v, source)
	}
	// What the role does not read, but the environment sets.
	for i := range settingsTable {
		s := &settingsTable[i]
		v, ok := set(s.env)
		if !ok {
			continue
		}
		var note string
		switch s.kind {
		case honoured:
			if s.flag == "" && s.aliasOf == "" {
				note = "read by every subcommand at start"
				if s.env == "NATS_CONTEXT" {
					continue // shown as JETSYNC_NATS_CONTEXT's source
				}
				break
			}
			if f := s.readBy(); fs.Lookup(f) != nil {
				continue // shown above, or as a source
			}
			note = "not read by jetsync " + role
		case refused:
			refuse := s.refuse == nil || s.refuse(role, v, func(n string) bool {
				_, ok := set(n)
				t := settingsByEnv[n]
				return ok || t != nil && t.flag != "" && visited[t.flag]
			})
			if refuse {
				note = "refused, jetsync " + role + " would not start: " + names.Replace(plain(s.doc))
				break
			}
			fallthrough
		case inert:
			note = "no effect: " + names.Replace(plain(s.doc))
		}
		fmt.Fprintf(tw, "%s\t%s\tenv\t%s\n", s.env, showValue(s, v), note)
	}
	return tw.Flush()
}

// aliasSet names the deprecated alias of env that is set, if any.
func aliasSet(env string, set func(string) (string, bool)) string {
	for _, a := range settingsTable {
		if a.aliasOf == env {
			if _, ok := set(a.env); ok {
				return a.env
			}
		}
	}
	return ""
}

// showValue prints v as config shows it: secrets as (set), passwords in URLs
// redacted, the empty string as "".
func showValue(s *setting, v string) string {
	switch {
	case v == "":
		return `""`
	case s.secret:
		return "(set)"
	}
	return redact(v)
}
