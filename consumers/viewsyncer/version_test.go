package viewsyncer

import "testing"

func TestBumpConfig(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "00:01"},
		{"00", "00:01"},
		{"00:01", "00:02"},
		{"4gc54g", "4gc54g:01"},
		{"4gc54g:0z", "4gc54g:110"},
	}
	for _, tc := range tests {
		got := bumpConfig(tc.in)
		if got != tc.want {
			t.Errorf("bumpConfig(%q) = %q; want %q", tc.in, got, tc.want)
		}
		if tc.in != "" && got <= tc.in {
			t.Errorf("bumpConfig(%q) = %q does not sort after it", tc.in, got)
		}
		if stateOf(got) != stateOf(tc.in) && tc.in != "" {
			t.Errorf("stateOf(%q) = %q; want %q", got, stateOf(got), stateOf(tc.in))
		}
	}
}
