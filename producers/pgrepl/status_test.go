package pgrepl

import (
	"testing"
	"time"
)

func TestStatusIntervalFor(t *testing.T) {
	for _, tc := range []struct {
		show string
		want time.Duration
	}{
		{"1min", statusInterval},          // the default 60 s: the usual 10 s
		{"0", statusInterval},             // no timeout
		{"15s", 5 * time.Second},          // a third of a short timeout
		{"1s", 333 * time.Millisecond},    // as TestSource_DDLCopyOutlastsSenderTimeout sets
		{"200ms", 100 * time.Millisecond}, // floored
		{"5000", 10 * time.Second / 6},    // a bare number is in ms
		{"2h", statusInterval},
	} {
		d, err := parsePgDuration(tc.show)
		if err != nil {
			t.Errorf("parsePgDuration(%q): %v", tc.show, err)
			continue
		}
		if got := statusIntervalFor(d); got.Round(time.Millisecond) != tc.want.Round(time.Millisecond) {
			t.Errorf("statusIntervalFor(%q) = %v; want %v", tc.show, got, tc.want)
		}
	}
	for _, bad := range []string{"", "s", "10 parsecs", "-5s"} {
		if d, err := parsePgDuration(bad); err == nil {
			t.Errorf("parsePgDuration(%q) = %v; want an error", bad, d)
		}
	}
}
