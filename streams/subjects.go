package streams

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Shard names one app's shard, as zero-cache does with ZERO_APP_ID and
// ZERO_SHARD_NUM. Every subject, stream and bucket name derives from it, so
// two apps or shards can share one NATS account.
type Shard struct {
	App string // [a-z0-9_]+, default "zero"
	Num int    // default 0
}

var appIDRe = regexp.MustCompile(`^[a-z0-9_]+$`)

// Validate checks the app ID as zero-cache does.
func (s Shard) Validate() error {
	if !appIDRe.MatchString(s.App) {
		return fmt.Errorf("app id %q: must match [a-z0-9_]+", s.App)
	}
	if s.Num < 0 {
		return errors.New("shard number must not be negative")
	}
	return nil
}

// ID is "<app>_<num>", the name of the upstream shard schema.
func (s Shard) ID() string { return s.App + "_" + strconv.Itoa(s.Num) }

// Prefix is the first two subject tokens of everything this shard publishes.
func (s Shard) Prefix() string { return "jetsync." + s.ID() }

// ChangesStream is the name of the change stream.
func (s Shard) ChangesStream() string { return "JETSYNC_" + s.ID() + "_CHANGES" }

// ChangesFilter matches every subject of the change stream.
func (s Shard) ChangesFilter() string { return s.Prefix() + ".changes.>" }

// TableSubject is where a table's changes go:
// jetsync.<app>_<num>.changes.<schema>.<table>.
func (s Shard) TableSubject(schema, table string) string {
	return s.Prefix() + ".changes." + SubjectToken(schema) + "." + SubjectToken(table)
}

// TxSubject carries messages that belong to no table: the reset that opens an
// initial sync and the final part of a transaction whose last change was not
// a row change. It has one token fewer than a table subject, so no table can
// collide with it.
func (s Shard) TxSubject() string { return s.Prefix() + ".changes.tx" }

// ResyncSubject is the core NATS request subject on which a consumer that
// lost history asks the producer for a new initial sync. It lies outside the
// change stream's subjects.
func (s Shard) ResyncSubject() string { return s.Prefix() + ".control.resync" }

// StateBucket is the KV bucket holding the producer's upstream identity and
// copies of consumer watermarks.
func (s Shard) StateBucket() string { return "jetsync_" + s.ID() + "_state" }

// SubjectToken escapes a schema or table name into one subject token.
// Characters outside [A-Za-z0-9_-] become %XX, so "." "*" ">" and spaces
// never split or widen a subject.
func SubjectToken(name string) string {
	ok := true
	for i := 0; i < len(name); i++ {
		if !tokenByte(name[i]) {
			ok = false
			break
		}
	}
	if ok && name != "" {
		return name
	}
	var b strings.Builder
	if name == "" {
		return "%"
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if tokenByte(c) {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// ResyncRequest is the body of a request on ResyncSubject.
type ResyncRequest struct {
	TaskID    string `json:"taskID"`
	Consumer  string `json:"consumer"`
	Reason    string `json:"reason"`
	Watermark string `json:"watermark,omitempty"`
}
