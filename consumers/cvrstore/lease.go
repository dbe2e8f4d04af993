package cvrstore

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetsync/jetsync/internal/logkey"
	"github.com/jetsync/jetsync/streams"
)

// ErrLeaseLost reports a lease that another view-syncer took over, or that
// expired before it could be renewed.
var ErrLeaseLost = errors.New("cvr lease lost")

// ErrReleased reports a lease given up by Release.
var ErrReleased = errors.New("cvr lease released")

// OwnedError reports a group whose lease a live peer holds; Owner.Address
// is where to forward its connections.
type OwnedError struct {
	GroupID string
	Owner   streams.CVROwner
	// Signed is true when the record bears a good signature with the
	// store's PeerSecret: only then may a connection be relayed to
	// Owner.Address, since whoever can write the owners bucket could
	// otherwise redirect clients, tokens included, anywhere.
	Signed bool
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("client group %q is owned by %s at %q until %s", e.GroupID, e.Owner.ID, e.Owner.Address,
		time.UnixMilli(e.Owner.ExpiresMs).UTC().Format(time.RFC3339Nano))
}

// Lease is this store's ownership of one group, held by the revision of
// its record in the owners bucket.
type Lease struct {
	s       *Store
	groupID string
	key     string
	granted int64

	// renewMu keeps one renewal in flight: the renewal loop and a publish
	// finding the lease expired would otherwise race on one revision, and
	// the loser would take the winner's write for a takeover.
	renewMu sync.Mutex

	mu      sync.Mutex
	rev     uint64
	expires time.Time
	err     error // why it ended
	done    chan struct{}
}

// GroupID is the leased group.
func (l *Lease) GroupID() string { return l.groupID }

// Done is closed when the lease ends: lost (the caller must stop serving
// the group at once) or released.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while the lease holds, then ErrLeaseLost or ErrReleased.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// check is nil if the lease holds now: not ended and not past its expiry,
// after which a peer may already have taken over.
func (l *Lease) check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if !time.Now().Before(l.expires) {
		return fmt.Errorf("%w: expired at %s", ErrLeaseLost, l.expires.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// holds is nil if the lease holds, renewing one that expired unnoticed:
// while NATS was unreachable, or while the record that took it was in
// flight. A renewal at the lease's revision succeeds only if no peer
// rewrote the record since, which a takeover does, so nobody else can
// have served the group in between.
func (l *Lease) holds(ctx context.Context) error {
	if l.check() == nil {
		return nil
	}
	if err := l.Err(); err != nil {
		return err
	}
	if err := l.Renew(ctx); err != nil {
		return err
	}
	return l.check()
}

// end ends the lease with err; it reports whether this call ended it.
func (l *Lease) end(err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false
	}
	l.err = err
	close(l.done)
	return true
}

func (l *Lease) record(now time.Time) []byte {
	return l.s.ownerRecord(l.key, streams.CVROwner{
		ID:        l.s.cfg.OwnerID,
		Address:   l.s.cfg.Address,
		ExpiresMs: now.Add(l.s.cfg.LeaseTTL).UnixMilli(),
		GrantedMs: l.granted,
	})
}

// ownerRecord encodes o for key in the owners bucket, signed when the
// store has a PeerSecret.
func (s *Store) ownerRecord(key string, o streams.CVROwner) []byte {
	if len(s.cfg.PeerSecret) > 0 {
		o.Sig = base64.RawURLEncoding.EncodeToString(s.ownerMAC(key, o))
	}
	b, _ := json.Marshal(o)
	return b
}

// ownerMAC is the signature of o under key. The key binds it to one group
// and the expiry to one term, so a copied record can name only a genuine
// peer, for the group and the time that peer claimed.
func (s *Store) ownerMAC(key string, o streams.CVROwner) []byte {
	m := hmac.New(sha256.New, s.cfg.PeerSecret)
	for _, f := range []string{"jetsync owner v1", key, o.ID, o.Address,
		strconv.FormatInt(o.ExpiresMs, 10), strconv.FormatInt(o.GrantedMs, 10)} {
		// Length-prefixed, so no two field lists encode alike.
		m.Write(binary.AppendUvarint(nil, uint64(len(f))))
		m.Write([]byte(f))
	}
	return m.Sum(nil)
}

// PeerSecretSet reports whether the store signs and checks lease records.
func (s *Store) PeerSecretSet() bool { return len(s.cfg.PeerSecret) > 0 }

// signed reports whether o, read at key, checks with the PeerSecret.
func (s *Store) signed(key string, o streams.CVROwner) bool {
	if len(s.cfg.PeerSecret) == 0 || o.Sig == "" {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(o.Sig)
	return err == nil && hmac.Equal(sig, s.ownerMAC(key, o))
}

// Acquire takes a group's lease: it creates the group's record, or takes
// over one that has expired or that names this OwnerID (a restart). A
// group a live peer owns gives *OwnedError.
func (s *Store) Acquire(ctx context.Context, groupID string) (*Lease, error) {
	if err := streams.CheckGroupID(groupID); err != nil {
		return nil, err
	}
	// Garbage collection here neither starts on a group being acquired
	// nor lets one it purges be acquired.
	s.mu.Lock()
	if s.purging[groupID] {
		s.mu.Unlock()
		return nil, fmt.Errorf("acquire %q: %w", groupID, ErrPurging)
	}
	s.acquiring[groupID]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.acquiring[groupID]--; s.acquiring[groupID] == 0 {
			delete(s.acquiring, groupID)
		}
		s.mu.Unlock()
	}()
	return s.acquire(ctx, groupID, true)
}

// acquire takes a group's lease; a lease for serving the group (serve) is
// registered for Run to renew and may reclaim a live record of this
// OwnerID (a restart), while the garbage collector's refuses every live
// record.
func (s *Store) acquire(ctx context.Context, groupID string, serve bool) (*Lease, error) {
	now := time.Now()
	l := &Lease{s: s, groupID: groupID, key: streams.OwnerKey(groupID), granted: now.UnixMilli(), done: make(chan struct{})}
	// A few rounds cover a record that changes between reading and
	// writing it; the loser of such a race sees the winner's live lease.
	for range 3 {
		rev, val, err := s.readOwner(ctx, l.key)
		if err != nil {
			return nil, fmt.Errorf("acquire %q: %w", groupID, err)
		}
		var cur streams.CVROwner
		if val != nil && json.Unmarshal(val, &cur) == nil && (cur.ID != s.cfg.OwnerID || !serve) && now.UnixMilli() < cur.ExpiresMs {
			return nil, &OwnedError{GroupID: groupID, Owner: cur, Signed: s.signed(l.key, cur)}
		}
		rev, err = s.writeOwner(ctx, l.key, l.record(now), rev)
		if err == nil {
			return s.hold(l, rev, now, serve), nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, fmt.Errorf("acquire %q: %w", groupID, err)
		}
		now = time.Now()
	}
	return nil, fmt.Errorf("acquire %q: lease record keeps changing", groupID)
}

// ownerSubject is the subject of key's record in the owners bucket, as the
// KV writes it without a JetStream domain or API prefix, which jetsync
// does not use.
func (s *Store) ownerSubject(key string) string { return "$KV." + s.kv.Bucket() + "." + key }

// readOwner reads key's last message in the owners bucket: its revision,
// 0 if there is none, and the record, nil if it was deleted.
func (s *Store) readOwner(ctx context.Context, key string) (uint64, []byte, error) {
	m, err := s.ownersStream.GetLastMsgForSubject(ctx, s.ownerSubject(key))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, err
	}
	switch m.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return m.Sequence, nil, nil
	}
	return m.Sequence, m.Data, nil
}

// writeOwner writes key's record if its revision is still rev (0: none),
// in one batch with the other lease writes under way.
func (s *Store) writeOwner(ctx context.Context, key string, rec []byte, rev uint64) (uint64, error) {
	r := s.ownerReq(key, rec, rev)
	s.owners.run(ctx, []*commitReq{r})
	return r.last, ownerErr(r.err)
}

func (s *Store) ownerReq(key string, rec []byte, rev uint64) *commitReq {
	return &commitReq{subject: s.ownerSubject(key), msgs: [][]byte{rec}, prev: rev}
}

// ownerErr gives a write's refusal for a wrong revision as the KV does.
func ownerErr(err error) error {
	if conflict(err) {
		return fmt.Errorf("%w: %w", err, jetstream.ErrKeyRevisionMismatch)
	}
	return err
}

func (s *Store) hold(l *Lease, rev uint64, now time.Time, register bool) *Lease {
	l.rev, l.expires = rev, now.Add(s.cfg.LeaseTTL)
	if !register {
		return l
	}
	s.mu.Lock()
	old := s.leases[l.groupID]
	s.leases[l.groupID] = l
	s.mu.Unlock()
	if old != nil {
		// Superseded, not lost: the group stays here, so LeaseLost is not
		// called.
		old.end(fmt.Errorf("%w: acquired again", ErrLeaseLost))
	}
	return l
}

func (s *Store) lost(l *Lease, err error) {
	s.mu.Lock()
	if s.leases[l.groupID] == l {
		delete(s.leases, l.groupID)
	}
	s.mu.Unlock()
	if l.end(err) {
		s.log.Info("cvr lease lost", logkey.ClientGroup, l.groupID, "err", err)
		if s.cfg.LeaseLost != nil {
			s.cfg.LeaseLost(l.groupID)
		}
	}
}

// Renew extends the lease by LeaseTTL. A record rewritten or deleted by
// someone else ends the lease (ErrLeaseLost); other failures leave it to
// be retried, even once it expired: a peer that took the group over
// meanwhile rewrote the record, which the next renewal finds.
func (l *Lease) Renew(ctx context.Context) error {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	rev, err := l.held()
	if err != nil {
		return err
	}
	now := time.Now()
	rev, err = l.s.kv.Update(ctx, l.key, l.record(now), rev)
	return l.renewed(ctx, now, rev, err)
}

// held is the lease's revision, or why it ended.
func (l *Lease) held() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev, l.err
}

// renewed settles a renewal, under renewMu, whose record written at now
// gave rev or err.
func (l *Lease) renewed(ctx context.Context, now time.Time, rev uint64, err error) error {
	// Renewals whose answers were lost (they timed out while NATS was
	// unreachable, and nats.go sent them after the reconnect) move the
	// record on while it still names this lease; several may land one
	// after another, so look again a few times.
	for try := 0; try < maxLostRenewals && errors.Is(err, jetstream.ErrKeyRevisionMismatch); try++ {
		cur, ok := l.ownRecord(ctx)
		if !ok {
			break
		}
		rev, err = l.s.kv.Update(ctx, l.key, l.record(now), cur)
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) {
			err = fmt.Errorf("%w: %w", ErrLeaseLost, err)
			l.s.lost(l, err)
			return err
		}
		// Unreachable, not refused: the lease stands until a renewal
		// finds the record rewritten, even past its expiry, since nothing
		// is published under it meanwhile (a publish renews it first).
		return fmt.Errorf("renew lease of %q: %w", l.groupID, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	l.rev, l.expires = rev, now.Add(l.s.cfg.LeaseTTL)
	return nil
}

// maxLostRenewals bounds how many of its own lost renewals a renewal
// steps over before it takes the record for rewritten by a peer.
const maxLostRenewals = 5

// ownRecord reads the lease's record and returns its revision if it is
// still this lease's: written by this OwnerID for this grant, which only
// this lease's own renewals write.
func (l *Lease) ownRecord(ctx context.Context) (uint64, bool) {
	e, err := l.s.kv.Get(ctx, l.key)
	if err != nil {
		return 0, false
	}
	var cur streams.CVROwner
	if json.Unmarshal(e.Value(), &cur) != nil || cur.ID != l.s.cfg.OwnerID || cur.GrantedMs != l.granted {
		return 0, false
	}
	return e.Revision(), true
}

// Release gives the lease up, deleting its record if it is still this
// lease's, so that a peer can take the group at once.
func (s *Store) Release(ctx context.Context, l *Lease) error {
	l.mu.Lock()
	rev, held := l.rev, l.err == nil
	l.mu.Unlock()
	if !held {
		return nil
	}
	s.mu.Lock()
	if s.leases[l.groupID] == l {
		delete(s.leases, l.groupID)
	}
	s.mu.Unlock()
	l.end(ErrReleased)
	err := s.kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("release %q: %w", l.groupID, err)
	}
	return nil
}

// Leases are the leases this store holds.
func (s *Store) Leases() []*Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Lease, 0, len(s.leases))
	for _, l := range s.leases {
		out = append(out, l)
	}
	return out
}

// Run renews every held lease each third of LeaseTTL until ctx ends, and
// returns nil then. A lease it cannot keep is reported (Done, LeaseLost).
func (s *Store) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.renewAll(ctx, s.Leases())
	}
}

// renewAll renews leases in as few atomic batches as fit: with one write
// (one fsync) each, the renewals of a thousand groups kept JetStream busy
// under every other write. A batch is all or nothing, so one refused is
// written again one record at a time (committer), and only the leases
// whose records a peer rewrote are lost.
func (s *Store) renewAll(ctx context.Context, leases []*Lease) {
	type renewal struct {
		l *Lease
		r *commitReq
	}
	rs := make([]renewal, 0, len(leases))
	reqs := make([]*commitReq, 0, len(leases))
	now := time.Now()
	for _, l := range leases {
		l.renewMu.Lock()
		rev, err := l.held()
		if err != nil {
			l.renewMu.Unlock()
			continue
		}
		r := s.ownerReq(l.key, l.record(now), rev)
		rs = append(rs, renewal{l, r})
		reqs = append(reqs, r)
	}
	s.owners.run(ctx, reqs)
	for _, x := range rs {
		rctx, cancel := context.WithTimeout(ctx, s.cfg.LeaseTTL/3)
		err := x.l.renewed(rctx, now, x.r.last, ownerErr(x.r.err))
		cancel()
		x.l.renewMu.Unlock()
		if err != nil && !errors.Is(err, ErrLeaseLost) && ctx.Err() == nil {
			s.log.Warn("cvr lease renewal failed", logkey.ClientGroup, x.l.groupID, "err", err)
		}
	}
}

// Owner reads a group's lease record; the zero CVROwner when nobody holds
// it.
func (s *Store) Owner(ctx context.Context, groupID string) (streams.CVROwner, error) {
	var o streams.CVROwner
	e, err := s.kv.Get(ctx, streams.OwnerKey(groupID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return o, nil
	}
	if err != nil {
		return o, fmt.Errorf("owner of %q: %w", groupID, err)
	}
	if err := json.Unmarshal(e.Value(), &o); err != nil {
		return o, fmt.Errorf("owner of %q: %w", groupID, err)
	}
	return o, nil
}
