package streams

import "testing"

func TestLexi(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "00"}, {1, "01"}, {10, "0a"}, {35, "0z"}, {36, "110"}, {46655, "2zzz"},
		{23803720, "4e672g"}, {1 << 32, "61z141z4"}, {0x1A2B3C8, "4gc4w8"},
	} {
		if got := Lexi(tc.n); got != tc.want {
			t.Errorf("Lexi(%d) = %q; want %q", tc.n, got, tc.want)
		}
		back, err := ParseLexi(tc.want)
		if err != nil || back != tc.n {
			t.Errorf("ParseLexi(%q) = %d, %v; want %d", tc.want, back, err, tc.n)
		}
	}
	for _, bad := range []string{"", "0", "1a", "0A", "zz", "201", "0-"} {
		if _, err := ParseLexi(bad); err == nil {
			t.Errorf("ParseLexi(%q) succeeded; want error", bad)
		}
	}
}

func TestLexiOrder(t *testing.T) {
	prev := Lexi(0)
	for n := uint64(1); n < 1<<40; n = n*3 + 1 {
		cur := Lexi(n)
		if cur <= prev {
			t.Fatalf("Lexi(%d) = %q sorts before %q", n, cur, prev)
		}
		prev = cur
	}
}
