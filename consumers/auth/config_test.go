package auth_test

import (
	"testing"
	"time"

	"github.com/jetsync/jetsync/consumers/auth"
)

func TestParseIntervalSeconds(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", auth.DefaultRevalidateInterval, false},
		{"  ", auth.DefaultRevalidateInterval, false},
		{"300", 300 * time.Second, false},
		{"60", time.Minute, false},
		{"1.5", 1500 * time.Millisecond, false},
		{"0", 0, false}, // disabled
		{"-1", 0, true},
		{"NaN", 0, true},
		{"Inf", 0, true},
		{"5m", 0, true},
	} {
		got, err := auth.ParseIntervalSeconds(tc.in, auth.DefaultRevalidateInterval)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ParseIntervalSeconds(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestConfig_Validate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     auth.ManagerConfig
		wantErr bool
	}{
		{"Zero", auth.ManagerConfig{}, false},
		{"Defaults", auth.ManagerConfig{RevalidateInterval: auth.DefaultRevalidateInterval, RetransformInterval: auth.DefaultRetransformInterval}, false},
		{"NegativeRevalidate", auth.ManagerConfig{RevalidateInterval: -time.Second}, true},
		{"NegativeRetransform", auth.ManagerConfig{RetransformInterval: -time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err != nil) != tc.wantErr {
				t.Errorf("Validate() = %v; want error %v", err, tc.wantErr)
			}
			if _, err := auth.NewManager[string, string, string](tc.cfg); (err != nil) != tc.wantErr {
				t.Errorf("NewManager() error = %v; want error %v", err, tc.wantErr)
			}
		})
	}
}
