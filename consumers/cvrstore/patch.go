package cvrstore

import "iter"

// PatchKind says what a Patch patches.
type PatchKind uint8

const (
	// DesirePatch is an entry of a client's desiredQueriesPatch.
	DesirePatch PatchKind = iota
	// GotPatch is an entry of the gotQueriesPatch.
	GotPatch
	// RowPatch is a row's patch: the view-syncer turns it into a
	// rowsPatch entry, or, for its internal tables, into
	// lastMutationIDChanges or a mutationsPatch entry.
	RowPatch
)

// Patch is one change a poke carries, protocol-neutral: a put, or a del
// (Del).
type Patch struct {
	Kind PatchKind
	Del  bool
	// ClientID names a DesirePatch's client; Hash a DesirePatch's or a
	// GotPatch's query.
	ClientID, Hash string
	// Row is a RowPatch's row: a put carries its Value, a del its Key.
	Row *Row
}

// Delta is the update's patches, for the clients at its starting version,
// but for the rows in skip (streamed already).
func (u *Update) Delta(skip map[string]struct{}) iter.Seq[Patch] {
	return u.delta(skip, false)
}

// Unstreamed is the update's patches but for the rows whose puts were
// streamed (Stream): the rest of a poke begun while it was built.
func (u *Update) Unstreamed() iter.Seq[Patch] { return u.delta(nil, true) }

func (u *Update) delta(skip map[string]struct{}, unstreamed bool) iter.Seq[Patch] {
	c := u.c
	return func(yield func(Patch) bool) {
		for _, k := range u.desires {
			if d := c.Clients[k.ClientID].Desired[k.Hash]; d != nil && d.PatchVersion == u.Version {
				if !yield(Patch{Kind: DesirePatch, Del: !d.Active(), ClientID: k.ClientID, Hash: k.Hash}) {
					return
				}
			}
		}
		for _, h := range u.queries {
			if q := c.Queries[h]; q != nil && q.PatchVersion == u.Version {
				if !yield(Patch{Kind: GotPatch, Del: !q.Got, Hash: h}) {
					return
				}
			}
		}
		for _, rec := range u.rows {
			if skip != nil {
				if _, ok := skip[rec.id()]; ok {
					continue
				}
			}
			if unstreamed && u.Streamed(rec) {
				continue
			}
			if rec.PatchVersion == u.Version {
				if !yield(Patch{Kind: RowPatch, Del: rec.Refs == nil, Row: rec}) {
					return
				}
			}
		}
	}
}

// Catchup is everything that changed after base (docs/protocol.md §6.4);
// with no base (hasBase false), everything there is: deleted clients,
// inactive desires, queries no longer got and tombstones are left out.
// Internal queries are never patched. Within a kind, the order is a map's.
func (c *CVR) Catchup(base string, hasBase bool) iter.Seq[Patch] {
	newer := func(pv string) bool { return pv != "" && (!hasBase || pv > base) }
	return func(yield func(Patch) bool) {
		for _, cl := range c.Clients {
			if cl.Deleted && !hasBase {
				continue
			}
			for h, d := range cl.Desired {
				if newer(d.PatchVersion) && (hasBase || d.Active()) {
					if !yield(Patch{Kind: DesirePatch, Del: !d.Active(), ClientID: cl.ID, Hash: h}) {
						return
					}
				}
			}
		}
		for _, q := range c.Queries {
			if !q.Internal && q.EverGot && newer(q.PatchVersion) && (hasBase || q.Got) {
				if !yield(Patch{Kind: GotPatch, Del: !q.Got, Hash: q.Hash}) {
					return
				}
			}
		}
		for _, rec := range c.Rows {
			if newer(rec.PatchVersion) && (hasBase || rec.Refs != nil) {
				if !yield(Patch{Kind: RowPatch, Del: rec.Refs == nil, Row: rec}) {
					return
				}
			}
		}
	}
}
