package cvrstore

import (
	"strings"

	"github.com/jetsync/jetsync/streams"
)

// Versions are CVR versions in their cookie form (docs/protocol.md §6.3):
// "<stateVersion>" or "<stateVersion>:<lexi(configVersion)>". With the
// replica's lexi watermarks as state versions, string order is version
// order, so they are compared as strings, exactly as the client compares
// cookies. "" stands for null: no version yet.

// InitialStateVersion is a new CVR's state version.
const InitialStateVersion = "00"

// StateOf is v's state version.
func StateOf(v string) string {
	if i := strings.IndexByte(v, ':'); i >= 0 {
		return v[:i]
	}
	return v
}

// BumpConfig is the version after a change made at state version
// StateOf(v) without a database change.
func BumpConfig(v string) string {
	if v == "" {
		return InitialStateVersion + ":" + streams.Lexi(1)
	}
	st, cfg := v, uint64(0)
	if i := strings.IndexByte(v, ':'); i >= 0 {
		st = v[:i]
		n, err := streams.ParseLexi(v[i+1:])
		if err == nil {
			cfg = n
		}
	}
	return st + ":" + streams.Lexi(cfg+1)
}
