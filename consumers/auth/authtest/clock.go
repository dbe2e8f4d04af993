// Package authtest provides what tests of auth and its users share: a fake
// clock for code that drives an auth.Manager, and keys and tokens to verify.
package authtest

import (
	"slices"
	"sync"
	"time"

	"github.com/jetsync/jetsync/consumers/auth"
)

// Clock is a manual auth.Clock. Timers fire only in Advance, on the
// calling goroutine, in deadline order.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

type timer struct {
	c    *Clock
	when time.Time
	f    func()
}

// NewClock returns a Clock set to start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc registers f to run when Advance reaches now+d.
func (c *Clock) AfterFunc(d time.Duration, f func()) auth.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, when: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	i := slices.Index(t.c.timers, t)
	if i < 0 {
		return false
	}
	t.c.timers = slices.Delete(t.c.timers, i, i+1)
	return true
}

// Pending returns the deadlines of the timers that have not fired or been
// stopped, earliest first.
func (c *Clock) Pending() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := make([]time.Time, len(c.timers))
	for i, t := range c.timers {
		ws[i] = t.when
	}
	slices.SortFunc(ws, time.Time.Compare)
	return ws
}

const maxFires = 10000

// Advance moves the time forward by d, firing every timer that falls due,
// including timers that fired callbacks arm on the way. It returns the
// number of timers fired.
func (c *Clock) Advance(d time.Duration) int {
	c.mu.Lock()
	target := c.now.Add(d)
	fired := 0
	for {
		i := -1
		for j, t := range c.timers {
			if !t.when.After(target) && (i < 0 || t.when.Before(c.timers[i].when)) {
				i = j
			}
		}
		if i < 0 {
			break
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		t.f()
		fired++
		if fired > maxFires {
			panic("authtest: timers keep falling due at once (a hot loop?)")
		}
		c.mu.Lock()
	}
	c.now = target
	c.mu.Unlock()
	return fired
}
