package pgrepl

import (
	"testing"

	"github.com/jetsync/jetsync/streams"
)

func TestInStream(t *testing.T) {
	at := streams.Lexi(0x1000)
	for _, c := range []struct {
		name     string
		wm       string
		resumeWM string
		partial  bool
		want     bool
	}{
		{"before the resume point", streams.Lexi(0xff8), at, false, true},
		{"before a partial resume point", streams.Lexi(0xff8), at, true, true},
		{"the resume point, whole", at, at, false, true},
		{"the resume point, partly published", at, at, true, false},
		{"after the resume point", streams.Lexi(0x1008), at, false, false},
		{"after a partial resume point", streams.Lexi(0x1008), at, true, false},
		// Lexi puts longer numbers after shorter ones: no digit-by-digit
		// comparison may call 0x1000 older than 0xfff.
		{"a shorter LSN before a longer one", streams.Lexi(0xfff), streams.Lexi(0x1000), false, true},
		{"a longer LSN after a shorter one", streams.Lexi(0x10000), streams.Lexi(0xffff), false, false},
		{"no resume point", at, "", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := inStream(c.wm, c.resumeWM, c.partial); got != c.want {
				t.Errorf("inStream(%q, %q, %v) = %v; want %v", c.wm, c.resumeWM, c.partial, got, c.want)
			}
		})
	}
}
