package cvrstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/polltest"
	"github.com/jetsync/jetsync/nats-config/natstest"
	"github.com/jetsync/jetsync/streams"
)

// gcQuiet is the inactivity threshold of the GC tests: groups written
// before it elapsed are inactive. It must outlast the time between a
// "recent" write and the pass that must spare it, which under -race on a
// loaded machine has exceeded 150 ms.
const gcQuiet = time.Second

func newPurger(t *testing.T, s *Store, cfg GCConfig) *Purger {
	t.Helper()
	if cfg.Inactivity == 0 {
		cfg.Inactivity = gcQuiet
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	p, err := s.NewPurger(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writeGroups publishes n updates to each group through s.
func writeGroups(t *testing.T, s *Store, groups ...string) {
	t.Helper()
	for i, id := range groups {
		publishN(t, load(t, s, id), newHistory(uint64(i)), 2, 3)
	}
}

// waitInactive waits until writes made before now are older than gcQuiet.
func waitInactive(t *testing.T) {
	t.Helper()
	since := time.Now()
	polltest.UntilNil(t, time.Second, "writes older than gcQuiet", func() error {
		if time.Since(since) <= gcQuiet {
			return errors.New("not yet inactive")
		}
		return nil
	})
}

func TestPurger_PurgeInactive(t *testing.T) {
	ns := natstest.Start(t)
	a := openStore(t, ns, "a", "")
	b := openStore(t, ns, "b", "")
	writeGroups(t, a, "old-1", "old-2", "served-here", "served-there", "old-3")
	// Owned groups are active whatever their last write.
	if _, err := a.Acquire(testCtx(t), "served-here"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(testCtx(t), "served-there"); err != nil {
		t.Fatal(err)
	}
	waitInactive(t)
	writeGroups(t, a, "recent")

	p := newPurger(t, a, GCConfig{})
	purged, remaining, err := p.PurgeInactive(testCtx(t), 2)
	if err != nil || purged != 2 || remaining != 3 {
		t.Fatalf("PurgeInactive(2) = %d, %d, %v; want 2 purged (the oldest), 3 remaining (two owned)", purged, remaining, err)
	}
	purged, remaining, err = p.PurgeInactive(testCtx(t), 25)
	if err != nil || purged != 1 || remaining != 2 {
		t.Fatalf("second PurgeInactive = %d, %d, %v; want 1 purged, the 2 owned remaining", purged, remaining, err)
	}

	for _, tc := range []struct {
		group  string
		purged bool
	}{
		{"old-1", true}, {"old-2", true}, {"old-3", true},
		{"served-here", false}, {"served-there", false}, {"recent", false},
	} {
		t.Run(tc.group, func(t *testing.T) {
			// A view-syncer whose projection knew the group, and one
			// that never saw it, both find the tombstone.
			c := openStore(t, ns, "c", "")
			for _, s := range []*Store{a, c} {
				st := state(t, load(t, s, tc.group))
				if st.Instance.Deleted != tc.purged {
					t.Errorf("%s: instance %+v; purged %v", s.cfg.OwnerID, st.Instance, tc.purged)
				}
				if tc.purged && (st.Instance.Version != PurgedVersion || len(st.Rows) > 0 || len(st.Queries) > 0 || len(st.Clients) > 0) {
					t.Errorf("%s: purged group kept %+v", s.cfg.OwnerID, st)
				}
			}
			if n := subjectMsgs(t, a, tc.group); tc.purged && n != 1 {
				t.Errorf("purged group's subject holds %d messages; want the tombstone alone", n)
			}
			if tc.purged {
				m, err := a.stream.GetLastMsgForSubject(testCtx(t), shard.CVRSubject(tc.group))
				if err != nil || m.Header.Get(streams.CVRHeaderDeleted) == "" {
					t.Errorf("tombstone %v without its header: %v", m, err)
				}
			}
		})
	}
	// The lease a purge took is given back.
	if o, err := a.Owner(testCtx(t), "old-1"); err != nil || o.ID != "" {
		t.Errorf("purged group's lease %+v, %v; want none", o, err)
	}
}

func TestPurger_OnePassAtATime(t *testing.T) {
	ns := natstest.Start(t)
	a := openStore(t, ns, "a", "")
	b := openStore(t, ns, "b", "")
	writeGroups(t, a, "g")
	waitInactive(t)
	lock, err := a.lockGC(testCtx(t))
	if err != nil || lock == nil {
		t.Fatalf("lockGC = %v, %v", lock, err)
	}
	purged, _, err := newPurger(t, b, GCConfig{}).PurgeInactive(testCtx(t), 25)
	if err != nil || purged != 0 {
		t.Fatalf("PurgeInactive while a peer's pass runs = %d, %v; want 0", purged, err)
	}
	if l, err := b.lockGC(testCtx(t)); l != nil || err != nil {
		t.Fatalf("second lockGC = %v, %v; want nil while held", l, err)
	}
	if err := lock.unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	purged, _, err = newPurger(t, b, GCConfig{}).PurgeInactive(testCtx(t), 25)
	if err != nil || purged != 1 {
		t.Fatalf("PurgeInactive after the lock was released = %d, %v; want 1", purged, err)
	}
}

func TestPurger_Races(t *testing.T) {
	ns := natstest.Start(t)
	a := openStore(t, ns, "a", "")
	writeGroups(t, a, "g")
	waitInactive(t)
	p := newPurger(t, a, GCConfig{})

	t.Run("AcquireDuringPurge", func(t *testing.T) {
		if !a.startPurge("g") {
			t.Fatal("startPurge refused an idle group")
		}
		_, err := a.Acquire(testCtx(t), "g")
		a.endPurge("g")
		if !errors.Is(err, ErrPurging) {
			t.Fatalf("Acquire during a purge = %v; want ErrPurging", err)
		}
	})
	t.Run("WriteAfterListing", func(t *testing.T) {
		// A write lands between the listing and the tombstone: the
		// group is active after all.
		g := load(t, a, "g")
		publishN(t, g, newHistory(9), 1, 1)
		ok, err := p.purge(testCtx(t), shard.CVRSubject("g"), time.Now().Add(-gcQuiet))
		if err != nil || ok {
			t.Fatalf("purge of a group written after the threshold = %v, %v; want skipped", ok, err)
		}
	})
	t.Run("WriterLosesToTombstone", func(t *testing.T) {
		g := load(t, a, "g")
		waitInactive(t)
		if ok, err := p.purge(testCtx(t), shard.CVRSubject("g"), time.Now().Add(-gcQuiet)); err != nil || !ok {
			t.Fatalf("purge = %v, %v", ok, err)
		}
		v, evs := newHistory(10).next(1)
		if err := g.Publish(testCtx(t), v, evs); !errors.Is(err, ErrConflict) {
			t.Fatalf("Publish to a group loaded before its purge = %v; want ErrConflict", err)
		}
	})
}

func TestPurger_Tombstones(t *testing.T) {
	ns := natstest.Start(t)
	a := openStore(t, ns, "a", "")
	writeGroups(t, a, "g")
	waitInactive(t)
	p := newPurger(t, a, GCConfig{TombstoneAge: gcQuiet})
	if purged, _, err := p.PurgeInactive(testCtx(t), 25); err != nil || purged != 1 {
		t.Fatalf("PurgeInactive = %d, %v", purged, err)
	}
	waitInactive(t)
	if _, _, err := p.PurgeInactive(testCtx(t), 25); err != nil {
		t.Fatal(err)
	}
	if _, err := a.stream.GetLastMsgForSubject(testCtx(t), shard.CVRSubject("g")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("tombstone older than its age still there: %v", err)
	}
}

func TestGCConfig_Validate(t *testing.T) {
	for i, tc := range []struct {
		cfg GCConfig
		ok  bool
	}{
		{GCConfig{Inactivity: time.Hour, Interval: time.Minute, BatchSize: 25}, true},
		{GCConfig{Inactivity: time.Hour, Interval: time.Minute}, true},
		{GCConfig{Interval: time.Minute, BatchSize: 25}, false},
		{GCConfig{Inactivity: time.Hour, BatchSize: 25}, false},
		{GCConfig{Inactivity: time.Hour, Interval: time.Minute, BatchSize: -1}, false},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate(%+v) = %v; want ok %v", tc.cfg, err, tc.ok)
			}
		})
	}
}
