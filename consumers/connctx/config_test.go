package connctx_test

import (
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/connctx"
)

func TestParseIntervalSeconds(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", connctx.DefaultRevalidateInterval, false},
		{"  ", connctx.DefaultRevalidateInterval, false},
		{"300", 300 * time.Second, false},
		{"60", time.Minute, false},
		{"1.5", 1500 * time.Millisecond, false},
		{"0", 0, false}, // disabled
		{"-1", 0, true},
		{"NaN", 0, true},
		{"Inf", 0, true},
		{"5m", 0, true},
	} {
		got, err := connctx.ParseIntervalSeconds(tc.in, connctx.DefaultRevalidateInterval)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParseIntervalSeconds(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     connctx.Config
		wantErr bool
	}{
		{"Zero", connctx.Config{}, false},
		{"Defaults", connctx.Config{RevalidateInterval: connctx.DefaultRevalidateInterval, RetransformInterval: connctx.DefaultRetransformInterval}, false},
		{"NegativeRevalidate", connctx.Config{RevalidateInterval: -time.Second}, true},
		{"NegativeRetransform", connctx.Config{RetransformInterval: -time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err != nil) != tc.wantErr {
				t.Errorf("Validate() = %v; want error %v", err, tc.wantErr)
			}
			if _, err := connctx.New[string, string, string](tc.cfg); (err != nil) != tc.wantErr {
				t.Errorf("New() error = %v; want error %v", err, tc.wantErr)
			}
		})
	}
}
