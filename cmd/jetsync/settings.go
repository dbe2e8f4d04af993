package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jetsync/jetsync/streams"
)

// settingKind is what jetsync does with a setting.
type settingKind int

const (
	// honoured settings are read and applied.
	honoured settingKind = iota
	// inert settings are zero-cache's with no effect here: a role that
	// finds one set logs why, and what replaces it.
	inert
	// refused settings are zero-cache's whose effect jetsync can't give: a
	// role that finds one set does not start, unless refuse accepts the
	// value (it then logs it as an inert one).
	refused
)

// setting is one row of settingsTable.
type setting struct {
	env  string
	flag string // "": environment only, or not read
	kind settingKind
	def  string // default, as the README shows it (markdown)
	// usage is the -h text, without the variable's name.
	usage string
	// doc is the README's meaning of a honoured setting, and for the
	// others why they have no effect; {changes}, {cvr}, {owners}, {state}
	// and {snapshots} name the shard's streams, buckets and object store.
	doc string
	// aliasOf names the setting a deprecated alias stands in for.
	aliasOf string
	// secret values never show, not even redacted.
	secret bool
	// refuse reports whether a refused setting's value v is refused for
	// command cmd; nil refuses any value. given reports whether a setting
	// was set in the environment or by its flag.
	refuse func(cmd, v string, given func(name string) bool) bool
}

var settingsByEnv = func() map[string]*setting {
	m := make(map[string]*setting, len(settingsTable))
	for i := range settingsTable {
		s := &settingsTable[i]
		if m[s.env] != nil {
			panic("settings table: " + s.env + " twice")
		}
		m[s.env] = s
	}
	return m
}()

// settingFor is the table's row for env; registering a flag for a setting
// the table lacks is a programming error, caught by every command's tests.
func settingFor(env string) *setting {
	s := settingsByEnv[env]
	if s == nil {
		panic("settings table lacks " + env)
	}
	return s
}

// usageText is the -h text of s, with extra (a command's own note) and the
// variables it is read from.
func (s *setting) usageText(extra string) string {
	names := s.env
	if s.env == "JETSYNC_NATS_CONTEXT" {
		names += ", else NATS_CONTEXT"
	}
	return s.usage + extra + " [" + names + "]"
}

// The bind functions register a setting's flag under the table's name and
// -h text, defaulting to the environment's value, else def.

func (e *env) strVar(fs *flag.FlagSet, p *string, name, def string) {
	s := settingFor(name)
	fs.StringVar(p, s.flag, e.str(name, def), s.usageText(""))
}

func (e *env) intVar(fs *flag.FlagSet, p *int, name string, def int) {
	s := settingFor(name)
	fs.IntVar(p, s.flag, e.int(name, def), s.usageText(""))
}

func (e *env) durationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration) {
	s := settingFor(name)
	fs.DurationVar(p, s.flag, e.duration(name, def), s.usageText(""))
}

func (e *env) floatVar(fs *flag.FlagSet, p *float64, name string, def float64) {
	s := settingFor(name)
	fs.Float64Var(p, s.flag, e.float(name, def), s.usageText(""))
}

func (e *env) boolVar(fs *flag.FlagSet, p *bool, name string, def bool) {
	s := settingFor(name)
	fs.BoolVar(p, s.flag, e.bool(name, def), s.usageText(""))
}

// bindVar registers v, which already holds its default, as name's flag.
func bindVar(fs *flag.FlagSet, v flag.Value, name, extra string) {
	s := settingFor(name)
	fs.Var(v, s.flag, s.usageText(extra))
}

// shardNames fills in the {placeholders} of a setting's doc.
func shardNames(s streams.Shard) *strings.Replacer {
	return strings.NewReplacer(
		"{changes}", s.ChangesStream(),
		"{cvr}", s.CVRStream(),
		"{owners}", s.OwnersBucket(),
		"{state}", s.StateBucket(),
		"{snapshots}", s.SnapshotBucket(),
	)
}

// unless refuses any value but those given (compared case-insensitively).
func unless(ok ...string) func(cmd, v string, given func(string) bool) bool {
	return func(_, v string, _ func(string) bool) bool {
		for _, o := range ok {
			if strings.EqualFold(strings.TrimSpace(v), o) {
				return false
			}
		}
		return true
	}
}

// changeStreamerURIRefused: a zero-cache view-syncer finds its
// change-streamer by this URI; a jetsync one reads the change stream from
// NATS, which it would otherwise look for on localhost forever.
func changeStreamerURIRefused(cmd, _ string, given func(string) bool) bool {
	if cmd != "view-syncer" && cmd != "replicator" {
		return false
	}
	return !given("JETSYNC_NATS_URL") && !given("JETSYNC_NATS_CONTEXT") && !given("NATS_CONTEXT")
}

// numSyncWorkersRefused: 0 sync workers is zero-cache's replication-manager,
// which is jetsync's change-streamer; refused where a role would sync.
func numSyncWorkersRefused(cmd, v string, _ func(string) bool) bool {
	return strings.TrimSpace(v) == "0" && (cmd == "run" || cmd == "view-syncer")
}

// settingNote is a startup log line about a setting that is set.
type settingNote struct {
	env, msg, why string
}

// checkSettings looks at every setting of the table that is set (in the
// environment, or by its flag in fs) for command cmd: a refused one is an
// error naming it and why; an inert one, or a honoured one this command
// does not read, is a note to log.
func checkSettings(cmd string, fs *flag.FlagSet, e *env, shard streams.Shard) ([]settingNote, error) {
	visited := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { visited[f.Name] = true })
	given := func(name string) bool {
		if v, ok := e.lookup(name); ok && v != "" {
			return true
		}
		s := settingsByEnv[name]
		return s != nil && s.flag != "" && visited[s.flag]
	}
	names := shardNames(shard)
	var notes []settingNote
	var refusals []error
	for i := range settingsTable {
		s := &settingsTable[i]
		v, ok := e.lookup(s.env)
		if !ok || v == "" {
			continue
		}
		switch s.kind {
		case honoured:
			if f := s.readBy(); f != "" && fs.Lookup(f) == nil {
				notes = append(notes, settingNote{s.env, "setting not read by jetsync " + cmd, ""})
			}
		case refused:
			if s.refuse == nil || s.refuse(cmd, v, given) {
				refusals = append(refusals, fmt.Errorf("%s is set, and jetsync %s can't honour it: %s", s.env, cmd, names.Replace(plain(s.doc))))
				continue
			}
			fallthrough
		case inert:
			notes = append(notes, settingNote{s.env, "zero-cache setting has no effect in jetsync", names.Replace(plain(s.doc))})
		}
	}
	if len(refusals) > 0 {
		return nil, fmt.Errorf("%w: %v", errUsage, errors.Join(refusals...))
	}
	return notes, nil
}

// readBy is the flag that reads s, or an alias's setting.
func (s *setting) readBy() string {
	if s.aliasOf != "" {
		return settingFor(s.aliasOf).flag
	}
	return s.flag
}

// plain drops markdown's backquotes, for log lines.
func plain(s string) string { return strings.ReplaceAll(s, "`", "") }
