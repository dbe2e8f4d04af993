package auth

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
)

// Settings and their zero-cache defaults (zero-config.ts, auth options).
const (
	EnvRevalidateInterval  = "ZERO_AUTH_REVALIDATE_INTERVAL_SECONDS"
	EnvRetransformInterval = "ZERO_AUTH_RETRANSFORM_INTERVAL_SECONDS"

	DefaultRevalidateInterval  = 300 * time.Second
	DefaultRetransformInterval = 300 * time.Second
)

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	// RevalidateInterval is how long a validation lasts before the periodic
	// revalidation of a validated connection. 0 disables it.
	RevalidateInterval time.Duration
	// RetransformInterval is the period of the group's background
	// retransform. 0 disables it.
	RetransformInterval time.Duration
	// Clock drives deadlines and the maintenance timer; nil means the system clock.
	Clock Clock
	// Wake is called on the timer's goroutine when the earliest deadline
	// passes. It must arrange for Maintain to run (under the caller's group
	// lock) without blocking. Nil arms no timer.
	Wake   func()
	Logger *slog.Logger
}

// Validate reports a config error.
func (c ManagerConfig) Validate() error {
	if c.RevalidateInterval < 0 {
		return fmt.Errorf("revalidate interval %v: must not be negative", c.RevalidateInterval)
	}
	if c.RetransformInterval < 0 {
		return fmt.Errorf("retransform interval %v: must not be negative", c.RetransformInterval)
	}
	return nil
}

// ParseIntervalSeconds parses the value of an *_INTERVAL_SECONDS setting.
// As in zero-cache, an unset or empty value takes the default (zero-cache's
// option parser skips empty env values, so its "unset means disabled" is not
// reachable from the environment) and fractional seconds are allowed.
//
// 0 disables the work. zero-cache would instead use a 0 ms interval, which
// makes every wake-up due again at once: back-to-back API calls for as long
// as a connection is validated. Negative values, which zero-cache treats the
// same way, are refused.
func ParseIntervalSeconds(v string, def time.Duration) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return def, nil
	}
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(s) || math.IsInf(s, 0) {
		return 0, fmt.Errorf("interval %q: not a number of seconds", v)
	}
	if s < 0 {
		return 0, fmt.Errorf("interval %q: must not be negative", v)
	}
	return time.Duration(s * float64(time.Second)), nil
}
