package replicator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"modernc.org/sqlite"

	"github.com/jetsync/jetsync/internal/logkey"
)

// SQLite result codes that decide what a failed write or open means.
const (
	sqliteCorrupt = 11
	sqliteFull    = 13
	sqliteNotADB  = 26
	// sqliteIOErrShmSize is SQLITE_IOERR_SHMSIZE: no room to grow the
	// -shm file, which a full disk causes too.
	sqliteIOErrShmSize = 10 | 19<<8
)

// Backoff between attempts to write to a full disk. The first retry comes
// soon, since space is often freed at once (a log rotated, a volume grown);
// later ones settle at one every DiskFullMaxInterval, so a disk that stays
// full costs a log line and a few failed writes a minute, not a tight loop.
const (
	DiskFullInitialInterval = 500 * time.Millisecond
	DiskFullMaxInterval     = 30 * time.Second
)

// sqliteCode is err's primary SQLite result code, or 0.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() & 0xff
	}
	return 0
}

// isDiskFull reports whether err is a write that failed for want of space
// (SQLITE_FULL, which SQLite returns for ENOSPC and for max_page_count).
// Such a write is rolled back whole and can be retried as it is once there
// is space. The message test catches a code lost to a %v wrap.
func isDiskFull(err error) bool {
	if err == nil {
		return false
	}
	var se *sqlite.Error
	if errors.As(err, &se) && (se.Code()&0xff == sqliteFull || se.Code() == sqliteIOErrShmSize) {
		return true
	}
	return errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "database or disk is full")
}

// diskFull is the consumer's record of a disk-full episode: from the first
// write that failed for want of space to the first commit after it.
type diskFull struct {
	mu       sync.Mutex
	since    time.Time // zero: writes succeed
	lastErr  error
	attempts int
	bo       *backoff.ExponentialBackOff
}

// Health reports whether the replica is being written: nil, or an error
// saying since when the disk under it has been full. The consumer keeps
// retrying meanwhile; nothing is acked, so nothing is lost.
func (c *Consumer) Health() error {
	f := &c.full
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.since.IsZero() {
		return nil
	}
	return fmt.Errorf("replica %s: disk full since %s (%d attempts): %w", c.cfg.File, f.since.Format(time.RFC3339), f.attempts, f.lastErr)
}

// waitForSpace records a write that failed with a full disk and waits out
// the backoff before the caller tries again. It returns false when ctx ends
// first. The batch that failed was rolled back and never acked: JetStream
// delivers it again once the durable consumer is recreated at the
// replica's position.
func (c *Consumer) waitForSpace(ctx context.Context, err error) bool {
	f := &c.full
	f.mu.Lock()
	first := f.since.IsZero()
	if first {
		f.since = time.Now()
		f.attempts = 0
		f.bo = backoff.NewExponentialBackOff()
		f.bo.InitialInterval = DiskFullInitialInterval
		f.bo.MaxInterval = DiskFullMaxInterval
		f.bo.MaxElapsedTime = 0
		f.bo.Reset()
	}
	f.attempts++
	f.lastErr = err
	d := f.bo.NextBackOff()
	attempts := f.attempts
	f.mu.Unlock()

	c.metrics.diskFull.Set(1)
	c.metrics.diskFullRetries.Inc()
	if first {
		c.log.Error("replica disk full: the batch is rolled back and not acked; retrying until there is space",
			"file", c.cfg.File, logkey.Seq, c.appliedSeq(), "err", err, "in", d)
	} else {
		c.log.Warn("replica disk still full; retrying", "file", c.cfg.File, "attempt", attempts, "err", err, "in", d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// wrote ends a disk-full episode, if one is under way: a commit succeeded.
func (c *Consumer) wrote() {
	f := &c.full
	f.mu.Lock()
	if f.since.IsZero() {
		f.mu.Unlock()
		return
	}
	since, attempts := f.since, f.attempts
	f.since, f.lastErr, f.attempts = time.Time{}, nil, 0
	f.mu.Unlock()
	c.metrics.diskFull.Set(0)
	c.log.Info("replica disk has space again; writing resumed", "file", c.cfg.File, logkey.Seq, c.appliedSeq(),
		"full_for", time.Since(since).Round(time.Millisecond), "attempts", attempts)
}

// whileFull runs write, a local write that rolls back whole on failure,
// again after a backoff for as long as it fails with a full disk.
func (c *Consumer) whileFull(ctx context.Context, write func() error) error {
	for {
		err := write()
		if !isDiskFull(err) {
			if err == nil {
				c.wrote()
			}
			return err
		}
		if !c.waitForSpace(ctx, err) {
			return ctx.Err()
		}
	}
}

// appliedSeq is the last stream sequence committed to the replica, for logs.
func (c *Consumer) appliedSeq() uint64 {
	if c.proc == nil {
		return 0
	}
	return c.proc.st.StreamSeq
}
