package main

import (
	"strings"

	"github.com/jetsync/jetsync/streams"
)

// The README's settings section sits between these markers; everything
// between them is settingsMarkdown's (TestREADMESettings).
const (
	settingsBegin = "<!-- settings: generated from cmd/jetsync/settings_table.go; go test ./cmd/jetsync -run TestREADMESettings -update rewrites it -->"
	settingsEnd   = "<!-- settings: end -->"
)

// settingsMarkdown renders the settings table for the README: what jetsync
// honours, then zero-cache's settings that have no effect, then those a role
// refuses.
func settingsMarkdown() string {
	// Names as the README writes them, for any app and shard.
	generic := streams.Shard{App: "APP", Num: 0}
	var pairs []string
	for _, k := range []string{"changes", "cvr", "owners", "state", "snapshots"} {
		n := shardNames(generic).Replace("{" + k + "}")
		pairs = append(pairs, "{"+k+"}", "`"+strings.Replace(n, "APP_0", "<app>_<shard>", 1)+"`")
	}
	names := strings.NewReplacer(pairs...)

	var b strings.Builder
	b.WriteString(settingsBegin + "\n\n")
	b.WriteString("| variable | flag | default | meaning |\n|---|---|---|---|\n")
	for _, s := range settingsTable {
		if s.kind != honoured {
			continue
		}
		flag := "(environment only)"
		switch {
		case s.aliasOf != "":
			flag = "(as `-" + settingFor(s.aliasOf).flag + "`)"
		case s.flag != "":
			flag = "`-" + s.flag + "`"
		}
		def, doc := s.def, s.doc
		if def == "" {
			def = "unset"
		}
		if doc == "" {
			doc = s.usage
		}
		b.WriteString("| `" + s.env + "` | " + flag + " | " + def + " | " + doc + " |\n")
	}
	b.WriteString(`
### zero-cache settings without effect

These are zero-cache's, accepted so that its environment files work as they
are: a role that finds one set logs ` + "`zero-cache setting has no effect in jetsync`" + `
with the reason below, naming the shard's streams and buckets.

| variable | why, and what takes its place |
|---|---|
`)
	for _, s := range settingsTable {
		if s.kind == inert {
			b.WriteString("| `" + s.env + "` | " + names.Replace(s.doc) + " |\n")
		}
	}
	b.WriteString(`
### zero-cache settings refused

Ignoring these would change what a zero-cache user expects without a word, so
a role that finds one set does not start: it exits 2 with the reason. A value
that asks for what jetsync does anyway is accepted and logged as above.

| variable | why |
|---|---|
`)
	for _, s := range settingsTable {
		if s.kind == refused {
			b.WriteString("| `" + s.env + "` | " + names.Replace(s.doc) + " |\n")
		}
	}
	b.WriteString("\n" + settingsEnd)
	return b.String()
}
