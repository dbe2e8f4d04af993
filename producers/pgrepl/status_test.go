package pgrepl

import (
	"testing"
	"time"
)

func TestStatusIntervalFor(t *testing.T) {
	for _, tc := range []struct {
		timeout, want time.Duration
	}{
		{time.Minute, statusInterval},                    // the default 60 s: the usual 10 s
		{0, statusInterval},                              // no timeout
		{15 * time.Second, 5 * time.Second},              // a third of a short timeout
		{time.Second, 333 * time.Millisecond},            // as TestSource_DDLCopyOutlastsSenderTimeout sets
		{200 * time.Millisecond, 100 * time.Millisecond}, // floored
		{5 * time.Second, 10 * time.Second / 6},
		{2 * time.Hour, statusInterval},
	} {
		if got := statusIntervalFor(tc.timeout); got.Round(time.Millisecond) != tc.want.Round(time.Millisecond) {
			t.Errorf("statusIntervalFor(%v) = %v; want %v", tc.timeout, got, tc.want)
		}
	}
}
