package pgvalue

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCopyFields(t *testing.T) {
	tests := []struct {
		name string
		line string
		want []*string // nil entry is NULL
	}{
		{"One", "abc", strs("abc")},
		{"Empty", "", strs("")},
		{"Several", "1\tabc\t", strs("1", "abc", "")},
		{"Null", `1\N` + "\t" + `\N` + "\t", []*string{ptr(`1N`), nil, ptr("")}},
		{"NullInside", `a\Nb`, strs("aNb")},
		{"Escapes", `a\tb\nc\\d\re\bf\fg\vh`, strs("a\tb\nc\\d\re\bf\fg\vh")},
		{"Octal", `\101\0\1234\777`, strs("A\x00S4\xff")},
		{"Hex", `\x41\x4a\xg\x4`, strs("AJxg\x04")},
		{"Other", `\a\"\é`, strs(`a"é`)},
		{"EscapedTab", "a\\\tb\tc", strs("a\tb", "c")},
		{"UTF8", "héllo\t世界", strs("héllo", "世界")},
		{"Array", `{"a\\"b"}`, strs(`{"a\"b"}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fields, _, err := CopyFields([]byte(tc.line), nil, nil)
			if err != nil {
				t.Fatalf("CopyFields(%q) = %v", tc.line, err)
			}
			var got []*string
			for _, f := range fields {
				if f == nil {
					got = append(got, nil)
				} else {
					got = append(got, ptr(string(f)))
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("CopyFields(%q) mismatch (-want +got):\n%s", tc.line, diff)
			}
		})
	}
}

func TestCopyFields_TrailingBackslash(t *testing.T) {
	for _, line := range []string{`abc\`, "a\tb\\"} {
		if _, _, err := CopyFields([]byte(line), nil, nil); !errors.Is(err, ErrCopyLine) {
			t.Errorf("CopyFields(%q) = %v; want ErrCopyLine", line, err)
		}
	}
}

// TestCopyFields_Reuse checks that fields decoded into buf stay intact when
// buf grows while a later field is decoded.
func TestCopyFields_Reuse(t *testing.T) {
	var fields [][]byte
	buf := make([]byte, 0, 2)
	line := []byte(`\\a` + "\t" + `\\bcdefghijklmnop` + "\t" + `\\q`)
	fields, buf, err := CopyFields(line, fields, buf)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`\a`, `\bcdefghijklmnop`, `\q`}
	for i, f := range fields {
		if string(f) != want[i] {
			t.Errorf("field %d = %q; want %q", i, f, want[i])
		}
	}
	fields, _, err = CopyFields([]byte("x\ty"), fields, buf)
	if err != nil || len(fields) != 2 || string(fields[0]) != "x" || string(fields[1]) != "y" {
		t.Errorf("reused CopyFields = %q, %v", fields, err)
	}
}

func ptr(s string) *string { return &s }

func strs(ss ...string) []*string {
	out := make([]*string, len(ss))
	for i, s := range ss {
		out[i] = ptr(s)
	}
	return out
}
