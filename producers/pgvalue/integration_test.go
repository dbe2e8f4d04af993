package pgvalue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jetsync/jetsync/streams"
)

// startPostgres starts a throwaway Postgres cluster and returns its URL. It
// is a small stand-in for the shared pgtest helper, which this package must
// not depend on: initdb and pg_ctl from $PGBIN, fsync off, a free port, run
// as the postgres user when the test runs as root, and stopped in
// t.Cleanup.
func startPostgres(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("PGBIN")
	if bin == "" {
		bin = "/usr/lib/postgresql/15/bin"
	}
	if _, err := os.Stat(filepath.Join(bin, "pg_ctl")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Postgres binaries: %v", err)
		}
		t.Skipf("no Postgres binaries: %v", err)
	}

	// t.TempDir's parent is root-only, so the postgres user could not
	// enter it.
	root, err := os.MkdirTemp("", "pgvalue-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o711); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(root, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	asRoot := os.Geteuid() == 0
	if asRoot {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("look up the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, d := range []string{root, data} {
			if err := os.Chown(d, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		if asRoot {
			cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", cmd.Path}, args...)...)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c fsync=off", port, root)
	run("pg_ctl", "-D", data, "-l", filepath.Join(root, "log"), "-o", opts, "-w", "start")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "stop")
		if asRoot {
			cmd = exec.Command("runuser", "-u", "postgres", "--", cmd.Path, "-D", data, "-m", "immediate", "stop")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("stop postgres: %v\n%s", err, out)
		}
	})
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
}

// column is one column of the integration table: its type, a SQL literal
// per row (NULL allowed), and the SQL computing the expected JSON from the
// column's value, with %[1]s standing for the column.
type column struct {
	typ    string
	values [3]string
	expect string
}

const (
	expectJSON   = "to_json(%[1]s)"
	expectEpoch  = "to_json(extract(epoch from %[1]s) * 1000)"
	expectMillis = "to_json(((floor(extract(epoch from %[1]s) * 1000)::int8 %% 86400000) + 86400000) %% 86400000)"
	expectText   = "to_json(%[1]s::text)"
	// Element-wise epoch milliseconds of a one-dimensional array.
	expectEpochs = `CASE WHEN %[1]s IS NOT NULL THEN coalesce((SELECT json_agg(extract(epoch from e) * 1000 ORDER BY o)
		FROM unnest(%[1]s) WITH ORDINALITY AS u(e, o)), '[]') END`
)

var columns = []column{
	{"int2", [3]string{"-32768", "32767", "0"}, expectJSON},
	{"int4", [3]string{"-2147483648", "2147483647", "NULL"}, expectJSON},
	{"int8", [3]string{"9223372036854775807", "-9223372036854775808", "9007199254740993"}, expectJSON},
	{"float4", [3]string{"'1.1'", "'-0'", "'NaN'"}, expectJSON},
	{"float8", [3]string{"'0.1'", "'1e300'", "'-Infinity'"}, expectJSON},
	{"numeric", [3]string{"'1234567890123456789012345678901234567890.0123456789'", "'-0.000001'", "'Infinity'"}, expectJSON},
	{"numeric(10,2)", [3]string{"'1.5'", "'NaN'", "'0'"}, expectJSON},
	{"bool", [3]string{"true", "false", "NULL"}, expectJSON},
	{"text", [3]string{`E'tab\there\nnew "q" \\ \u00e9 \U0001F389 \x01'`, "''", `'\N'`}, expectJSON},
	{"varchar(20)", [3]string{"'héllo'", "'NULL'", "' '"}, expectJSON},
	{"char(5)", [3]string{"'ab'", "'abcde'", "NULL"}, expectJSON},
	{"name", [3]string{"'pg_class'", "'x'", "NULL"}, expectJSON},
	{"uuid", [3]string{"'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "NULL", "'00000000-0000-0000-0000-000000000000'"}, expectJSON},
	{"inet", [3]string{"'192.168.0.1/24'", "'::1'", "NULL"}, expectJSON},
	{"cidr", [3]string{"'10.0.0.0/8'", "'2001:db8::/32'", "NULL"}, expectJSON},
	{"macaddr", [3]string{"'08:00:2b:01:02:03'", "NULL", "NULL"}, expectJSON},
	{"macaddr8", [3]string{"'08:00:2b:01:02:03:04:05'", "NULL", "NULL"}, expectJSON},
	{"pg_lsn", [3]string{"'16/B374D848'", "'0/0'", "NULL"}, expectText},
	{"citext", [3]string{"'MiXeD'", "NULL", "''"}, expectText},
	{"ean13", [3]string{"'978-0-306-40615-7'", "NULL", "NULL"}, expectText},
	{"timestamp", [3]string{"'2024-01-01 00:00:00.123456'", "'0044-03-15 12:00:00 BC'", "'infinity'"}, expectEpoch},
	{"timestamp(0)", [3]string{"'1969-12-31 23:59:59'", "'294276-12-31 23:59:59'", "'-infinity'"}, expectEpoch},
	{"timestamptz", [3]string{"'2024-01-01 00:00:00.123456+00'", "'1800-06-01 12:00:00.5+00'", "'0044-03-15 12:00:00.000001+00 BC'"}, expectEpoch},
	{"date", [3]string{"'2024-02-29'", "'4713-01-01 BC'", "'infinity'"}, expectEpoch},
	{"time", [3]string{"'12:34:56.789999'", "'24:00:00'", "'00:00:00'"}, expectMillis},
	{"timetz", [3]string{"'12:34:56.789999+05:30'", "'01:00:00-08'", "'23:59:59.999+00:00:30'"}, expectMillis},
	{"json", [3]string{`'{"b": 1,  "a": [1, 2.50, "x"]}'`, `'"just a string"'`, `'null'`}, expectJSON},
	{"jsonb", [3]string{`'{"b": 1, "a": {"c": [true, null]}}'`, `'123456789012345678901234567890'`, `'[]'`}, expectJSON},
	{"int4[]", [3]string{"'{1,NULL,3}'", "'{}'", "'[0:1]={7,8}'"}, expectJSON},
	{"int4[][]", [3]string{"'{{1,2},{3,4}}'", "'{{NULL}}'", "NULL"}, expectJSON},
	{"text[]", [3]string{`ARRAY['a b', 'c"d', 'e\f', 'NULL', NULL, '', '{x}', 'é,']`, "'{}'", `'{"\\x"}'`}, expectJSON},
	{"numeric[]", [3]string{"'{1.50,NaN,-3}'", "NULL", "'{}'"}, expectJSON},
	{"bool[]", [3]string{"'{t,f,NULL}'", "NULL", "NULL"}, expectJSON},
	{"jsonb[]", [3]string{`ARRAY['{"a": "x,y"}'::jsonb, '[1]', NULL]`, "NULL", "'{}'"}, expectJSON},
	{"timestamptz[]", [3]string{"ARRAY['2024-01-01 00:00:00.5+00'::timestamptz, 'infinity', '1800-01-01 00:00:00+00']", "'{}'", "NULL"}, expectEpochs},
	{"date[]", [3]string{"'{2024-01-01,NULL}'", "NULL", "'{}'"}, expectEpochs},
	{"mood", [3]string{"'happy'", "'so \"so\"'", "NULL"}, expectJSON},
	{"mood[]", [3]string{"'{happy,\"so \\\"so\\\"\"}'", "'{}'", "NULL"}, expectJSON},
	{"posint", [3]string{"1", "2147483647", "NULL"}, expectJSON},
	{"moods", [3]string{"'{sad}'", "NULL", "NULL"}, expectJSON},
	{"bytea", [3]string{`'\x00ff'`, "''", "NULL"}, expectText},
	{"interval", [3]string{"'1 day 02:03:04.5'", "NULL", "NULL"}, expectText},
	{"hstore", [3]string{`'a=>1'`, "NULL", "NULL"}, expectText},
	{"int4range", [3]string{"'[1,3)'", "'empty'", "NULL"}, expectText},
}

const setup = `
CREATE EXTENSION citext;
CREATE EXTENSION isn;
CREATE EXTENSION hstore;
CREATE TYPE mood AS ENUM ('happy', 'so "so"', 'sad');
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE DOMAIN moods AS mood[];
`

// wantTypes is what Load must make of the user types, by column.
var wantTypes = map[string]struct {
	name  string
	kind  streams.Kind
	enum  bool
	array bool
}{
	"mood":   {"mood", streams.KindString, true, false},
	"mood[]": {"mood[]", streams.KindJSON, true, true},
	"posint": {"int4", streams.KindNumber, false, false},
	"moods":  {"mood[]", streams.KindJSON, true, true},
	"citext": {"citext", streams.KindString, false, false},
	"ean13":  {"ean13", streams.KindString, false, false},
	"hstore": {"hstore", streams.KindUnsupported, false, false},
}

func TestAppendJSON_Postgres(t *testing.T) {
	url := startPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	// A zone whose old dates have local mean time offsets in seconds
	// (+05:53:28) and whose current one is a half hour (+05:30).
	cfg.RuntimeParams["DateStyle"] = "ISO"
	cfg.RuntimeParams["TimeZone"] = "Asia/Kolkata"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	pc := conn.PgConn()

	cols := make([]string, len(columns))
	var ddl strings.Builder
	ddl.WriteString(setup + "CREATE TABLE t (id int4 PRIMARY KEY")
	for i, c := range columns {
		cols[i] = fmt.Sprintf("c%d", i)
		fmt.Fprintf(&ddl, ", %s %s", cols[i], c.typ)
	}
	ddl.WriteString(");\n")
	for row := range 3 {
		fmt.Fprintf(&ddl, "INSERT INTO t VALUES (%d", row)
		for _, c := range columns {
			fmt.Fprintf(&ddl, ", %s", c.values[row])
		}
		ddl.WriteString(");\n")
	}
	ddl.WriteString("INSERT INTO t (id) VALUES (3);\n")
	if err := pc.Exec(ctx, ddl.String()).Close(); err != nil {
		t.Fatalf("create table: %v", err)
	}

	// The column types, loaded as a producer would for a relation.
	rows, err := conn.Query(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM t LIMIT 0")
	if err != nil {
		t.Fatal(err)
	}
	fds := rows.FieldDescriptions()
	rows.Close()
	reg := NewRegistry()
	oids := make([]uint32, len(fds))
	for i, fd := range fds {
		oids[i] = fd.DataTypeOID
	}
	if err := reg.Load(ctx, conn, oids...); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := reg.Load(ctx, conn, 4000000000); err == nil {
		t.Error("Load(4000000000) = nil; want an error for a missing type")
	}
	types := make([]Type, len(columns))
	for i, c := range columns {
		typ, ok := reg.Lookup(oids[i])
		if !ok {
			t.Fatalf("Lookup(%d) for %s: not found after Load", oids[i], c.typ)
		}
		types[i] = typ
		if w, ok := wantTypes[c.typ]; ok && (typ.Name != w.name || typ.Kind != w.kind || typ.Enum != w.enum || typ.Array != w.array) {
			t.Errorf("Lookup(%s) = %+v; want %+v", c.typ, typ, w)
		}
	}

	order := " FROM t ORDER BY id"
	exprs := make([]string, len(columns))
	for i, c := range columns {
		exprs[i] = fmt.Sprintf(c.expect, cols[i])
	}
	want := queryText(ctx, t, pc, "SELECT "+strings.Join(exprs, ", ")+order)
	// The columns in text format, as pgoutput sends them: each type's
	// output function. A ::text cast would differ (char(5) drops its
	// padding, inet gains a /128).
	viaText := queryText(ctx, t, pc, "SELECT "+strings.Join(cols, ", ")+order)
	viaCopy := copyText(ctx, t, pc, "COPY (SELECT "+strings.Join(cols, ", ")+order+") TO STDOUT")

	checked := 0
	for name, got := range map[string][][][]byte{"text": viaText, "copy": viaCopy} {
		if len(got) != len(want) {
			t.Fatalf("%s: %d rows; want %d", name, len(got), len(want))
		}
		for r := range want {
			for i, c := range columns {
				text, w := got[r][i], want[r][i]
				if text == nil || w == nil {
					if (text == nil) != (w == nil) {
						t.Errorf("%s row %d %s: value %q; want JSON %q", name, r, c.typ, text, w)
					}
					continue
				}
				js, err := AppendJSON(nil, types[i], text)
				if err != nil {
					t.Errorf("%s row %d: AppendJSON(%s, %q) = %v", name, r, c.typ, text, err)
					continue
				}
				checked++
				if !sameJSON(t, js, w) {
					t.Errorf("%s row %d: AppendJSON(%s, %q) = %s; Postgres says %s", name, r, c.typ, text, js, w)
				}
			}
		}
	}
	if want := 2 * 3 * len(columns) * 3 / 4; checked < want {
		t.Errorf("checked %d values; want at least %d", checked, want)
	}
}

// queryText runs sql and returns its rows in text format, NULL as nil.
func queryText(ctx context.Context, t *testing.T, pc *pgconn.PgConn, sql string) [][][]byte {
	t.Helper()
	res := pc.ExecParams(ctx, sql, nil, nil, nil, nil).Read()
	if res.Err != nil {
		t.Fatalf("%s: %v", sql, res.Err)
	}
	return res.Rows
}

// copyText runs a COPY TO STDOUT and splits its text output with CopyFields.
func copyText(ctx context.Context, t *testing.T, pc *pgconn.PgConn, sql string) [][][]byte {
	t.Helper()
	var out bytes.Buffer
	if _, err := pc.CopyTo(ctx, &out, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	var rows [][][]byte
	for line := range bytes.Lines(out.Bytes()) {
		fields, _, err := CopyFields(bytes.TrimSuffix(line, []byte("\n")), nil, nil)
		if err != nil {
			t.Fatalf("CopyFields(%q) = %v", line, err)
		}
		rows = append(rows, fields)
	}
	return rows
}

// sameJSON compares two JSON texts by value, numbers exactly by their
// decimal value (so 1.50 = 1.5 and -0 = 0).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	va, err := decodeJSON(a)
	if err != nil {
		t.Errorf("decode %s: %v", a, err)
		return false
	}
	vb, err := decodeJSON(b)
	if err != nil {
		t.Errorf("decode %s: %v", b, err)
		return false
	}
	return equalJSON(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	return v, d.Decode(&v)
}

func equalJSON(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		fa, _, errA := big.ParseFloat(string(a), 10, 512, big.ToNearestEven)
		fb, _, errB := big.ParseFloat(string(b), 10, 512, big.ToNearestEven)
		return errA == nil && errB == nil && fa.Cmp(fb) == 0
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equalJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !equalJSON(v, w) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}
