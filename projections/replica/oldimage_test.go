package replica_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/jetsync/jetsync/projections/replica"
	"github.com/jetsync/jetsync/streams"
)

// imageSpec has a column of each affinity the replica's types fall in.
var imageSpec = streams.TableSpec{
	Schema: "public", Name: "thing", PrimaryKey: []string{"id"},
	Columns: []streams.ColumnSpec{
		{Name: "id", Pos: 1, DataType: "text", Kind: streams.KindString, NotNull: true},
		{Name: "n", Pos: 2, DataType: "int8", Kind: streams.KindNumber},
		{Name: "f", Pos: 3, DataType: "float8", Kind: streams.KindNumber},
		{Name: "num", Pos: 4, DataType: "numeric", Kind: streams.KindNumber},
		{Name: "b", Pos: 5, DataType: "bool", Kind: streams.KindBoolean},
		{Name: "u", Pos: 6, DataType: "uuid", Kind: streams.KindString},
		{Name: "j", Pos: 7, DataType: "jsonb", Kind: streams.KindJSON},
		{Name: "ts", Pos: 8, DataType: "timestamptz", Kind: streams.KindNumber},
		{Name: "e", Pos: 9, DataType: "mood", Kind: streams.KindString, Enum: true},
		{Name: "big", Pos: 10, DataType: "text", Kind: streams.KindString},
	},
}

// values are raw values per column, tricky ones included: integral floats
// and numeric-looking text, which SQLite's affinity converts.
var imageValues = map[string][]string{
	"n":   {`0`, `-7`, `9007199254740993`, `null`},
	"f":   {`1.5`, `3`, `0`, `-2.25`, `"Infinity"`, `"NaN"`, `null`},
	"num": {`3`, `3.5`, `1e20`, `0`, `-0.5`, `2251799813685249`, `null`},
	"b":   {`true`, `false`, `null`},
	"u":   {`"123e4567-e89b-12d3-a456-426614174000"`, `"12"`, `" 7 "`, `"1e3"`, `"abc"`, `null`},
	"j":   {`{"a":1}`, `[1,2]`, `12`, `1.0`, `"12"`, `"s"`, `true`, `null`},
	"ts":  {`1764504000123.5`, `1764504000123`, `null`},
	"e":   {`"happy"`, `"12"`, `null`},
	"big": {`"a long text that Postgres would TOAST"`, `"another"`, `null`},
}

// identity says how an update or delete carries the old row.
type identity int

const (
	identDefault identity = iota // the key, and for updates only when it changed
	identFull                    // the whole old row
	identMixed                   // either, change by change: the identity changed
)

// imageWorkload makes a random sequence of single-change transactions on
// thing, with old rows as a table of identity id publishes them. Under the
// default identity an update leaves out a column it does not change now
// and then, as pgoutput leaves out an unchanged TOASTed value.
func imageWorkload(seed uint64, n int, id identity, values map[string][]string) []streams.Change {
	r := rand.New(rand.NewPCG(seed, 1))
	// The identity's choices have their own source, so that the rows are
	// the same whatever the identity.
	how := rand.New(rand.NewPCG(seed, 2))
	model := map[string]streams.Row{}
	var keys []string
	randRow := func(key string) streams.Row {
		row := streams.Row{"id": raw(key)}
		for _, c := range imageSpec.Columns[1:] {
			vs := values[c.Name]
			row[c.Name] = json.RawMessage(vs[r.IntN(len(vs))])
		}
		return row
	}
	var out []streams.Change
	for i := 0; i < n; i++ {
		full := id == identFull || id == identMixed && how.IntN(2) == 0
		op := r.IntN(10)
		switch {
		case op < 3 || len(keys) == 0:
			k := "k" + strconv.Itoa(i)
			row := randRow(k)
			model[k] = row
			keys = append(keys, k)
			out = append(out, streams.Change{Op: streams.OpInsert, New: row})
		case op < 8:
			j := r.IntN(len(keys))
			k := keys[j]
			old := model[k]
			row := randRow(k)
			if r.IntN(4) == 0 {
				nk := "k" + strconv.Itoa(i)
				row["id"] = raw(nk)
				keys[j] = nk
				delete(model, k)
			}
			// An unchanged TOASTed value: pgoutput marks it unchanged,
			// and the decoder fills it in from a whole old row only.
			toasted := r.IntN(3) == 0
			if toasted {
				row["big"] = old["big"]
			}
			newKey := string(row["id"])
			model[jsonString(newKey)] = row
			c := streams.Change{Op: streams.OpUpdate, New: row}
			switch {
			case full:
				c.Old = old
			default:
				if jsonString(newKey) != k {
					c.Old = streams.Row{"id": old["id"]}
				}
				if toasted {
					sent := streams.Row{}
					for col, v := range row {
						if col != "big" {
							sent[col] = v
						}
					}
					c.New = sent
				}
			}
			out = append(out, c)
		default:
			j := r.IntN(len(keys))
			k := keys[j]
			keys = append(keys[:j], keys[j+1:]...)
			old := model[k]
			delete(model, k)
			c := streams.Change{Op: streams.OpDelete, Old: streams.Row{"id": old["id"]}}
			if full {
				c.Old = old
			}
			out = append(out, c)
		}
	}
	return out
}

func jsonString(raw string) string {
	var s string
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		panic(err)
	}
	return s
}

// changeLog is a Collector that keeps the row changes.
type changeLog struct{ rows []replica.RowChange }

func (l *changeLog) RowChanged(c replica.RowChange) { l.rows = append(l.rows, c) }
func (l *changeLog) TableChanged(string)            {}

// applyImages applies changes, one transaction each, to a new replica
// holding thing, checks each new row reported against a read of the
// replica, and returns what a collector was told and how many rows the
// applier read for old images.
func applyImages(t *testing.T, changes []streams.Change) ([]replica.RowChange, int) {
	t.Helper()
	ctx := context.Background()
	db, a := newThingReplica(t)
	log := &changeLog{}
	a.Collector = log
	for i, c := range changes {
		from := len(log.rows)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := streams.Part{Watermark: streams.Lexi(uint64(100 + i)), Num: 0, Last: true, Changes: []streams.Change{c}}
		if err := a.Apply(ctx, tx, "public", "thing", &p); err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		if err := a.Commit(tx); err != nil {
			t.Fatal(err)
		}
		// A new row reported is the row as the replica holds it.
		for _, rc := range log.rows[from:] {
			if rc.New == nil {
				continue
			}
			if diff := cmp.Diff(readThing(t, db, rc.Key["id"].(string)), rc.New); diff != "" {
				t.Fatalf("change %d (%s): new row reported differs from the replica's (-read +reported):\n%s", i, c.Op, diff)
			}
		}
	}
	return log.rows, a.OldRowReads
}

// withoutVersion drops the old rows' versions, which a full image lacks.
func withoutVersion(rcs []replica.RowChange) []replica.RowChange {
	out := make([]replica.RowChange, len(rcs))
	for i, rc := range rcs {
		if rc.Old != nil {
			old := make(map[string]any, len(rc.Old))
			for k, v := range rc.Old {
				if k != replica.VersionColumn {
					old[k] = v
				}
			}
			rc.Old = old
		}
		out[i] = rc
	}
	return out
}

// plainValues are values whose stored form is certain.
var plainValues = map[string][]string{
	"n":   {`0`, `-7`, `9007199254740993`, `null`},
	"f":   {`1.5`, `3`, `-2.25`, `"Infinity"`, `null`},
	"num": {`3`, `3.5`, `-0.5`, `null`},
	"b":   {`true`, `false`, `null`},
	"u":   {`"123e4567-e89b-12d3-a456-426614174000"`, `"abc"`, `null`},
	"j":   {`{"a":1}`, `[1,2]`, `"s"`, `true`, `null`},
	"ts":  {`1764504000123.5`, `1764504000123`, `null`},
	"e":   {`"happy"`, `"12"`, `null`},
	"big": {`"a long text that Postgres would TOAST"`, `"another"`, `null`},
}

// TestApplier_OldImages checks that the old rows reported from the
// change's image are what a read of the replica reports, value for value
// and type for type, and that they cost no read where the image is whole
// and its stored form certain.
func TestApplier_OldImages(t *testing.T) {
	const n = 600
	for _, vs := range []struct {
		name   string
		values map[string][]string
	}{{"plain", plainValues}, {"tricky", imageValues}} {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", vs.name, seed), func(t *testing.T) {
				def := imageWorkload(seed, n, identDefault, vs.values)
				want, defReads := applyImages(t, def)
				if r := expectedReads(def); defReads != r {
					t.Errorf("default identity: %d reads; want one per update and delete, and one more per key change, %d", defReads, r)
				}
				for _, id := range []identity{identFull, identMixed} {
					changes := imageWorkload(seed, n, id, vs.values)
					got, reads := applyImages(t, changes)
					if diff := cmp.Diff(withoutVersion(want), withoutVersion(got)); diff != "" {
						t.Fatalf("identity %d: reported changes differ from the default identity's reads (-read +image):\n%s", id, diff)
					}
					r := expectedReads(changes)
					full := 0
					for _, c := range changes {
						if len(c.Old) == len(imageSpec.Columns) {
							full++
						}
					}
					if full == 0 {
						t.Fatalf("identity %d: the workload sent no whole old rows", id)
					}
					// A whole image whose stored form is uncertain is read.
					if reads < r || reads > r+full || vs.name == "plain" && reads != r {
						t.Errorf("identity %d: %d reads; want %d, plus at most one per uncertain whole image (%d)", id, reads, r, full)
					}
					t.Logf("identity %d: %d reads (default identity: %d)", id, reads, defReads)
				}
			})
		}
	}
}

// expectedReads is how many rows applying changes reads at the least:
// inserts of new keys read none; an update or a delete reads its old row
// unless the change carries it whole, and an update that moves the key
// reads the row the new key may displace.
func expectedReads(changes []streams.Change) int {
	n := 0
	for _, c := range changes {
		if c.Op == streams.OpInsert {
			continue
		}
		if len(c.Old) != len(imageSpec.Columns) {
			n++
		}
		if c.Op == streams.OpUpdate && c.Old != nil && string(c.Old["id"]) != string(c.New["id"]) {
			n++
		}
	}
	return n
}

// TestAffinityStored checks, against SQLite, the stored form the applier
// assumes for old values taken from a change: a value it claims to know
// must read back exactly so.
func TestAffinityStored(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	types := []string{"int4", "int8", "float8", "float4", "numeric", "bool", "text", "varchar", "uuid",
		"json", "jsonb", "timestamptz", "date", "interval", "point", "bytea", "mood|TEXT_ENUM", "int4[]|TEXT_ARRAY", "text|NOT_NULL"}
	values := []any{
		int64(0), int64(-7), int64(1) << 53, int64(math.MaxInt64),
		0.0, math.Copysign(0, -1), 1.5, 3.0, -2.0, 1e20, float64(1 << 52), float64(1<<51 - 1), math.Inf(1), math.Inf(-1),
		"12", " 12 ", "1e3", "3.0", ".5", "5.", "-4", "abc", "123e4567-e89b-12d3-a456-426614174000",
		"0x10", "", "true", `{"a":1}`, `"x"`, "12abc", "1e", nil,
	}
	known := 0
	for i, typ := range types {
		tbl := fmt.Sprintf("aff%d", i)
		if _, err := db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s (v "%s")`, tbl, typ)); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			got, ok := replica.StoredForTest(typ, v)
			if !ok {
				continue
			}
			known++
			if _, err := db.ExecContext(ctx, "DELETE FROM "+tbl); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "INSERT INTO "+tbl+" VALUES (?)", v); err != nil {
				t.Fatal(err)
			}
			var read any
			if err := db.QueryRowContext(ctx, "SELECT v FROM "+tbl).Scan(&read); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(read, got) {
				t.Errorf("%s: %#v stored as %#v (%T); the applier assumes %#v (%T)", typ, v, read, read, got, got)
			}
		}
	}
	if known < len(types)*len(values)/2 {
		t.Errorf("only %d of %d stored forms known: most old images would be read", known, len(types)*len(values))
	}
}
