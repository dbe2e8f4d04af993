package cvrstore

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
		got := BumpConfig(tc.in)
		if got != tc.want {
			t.Errorf("BumpConfig(%q) = %q; want %q", tc.in, got, tc.want)
		}
		if tc.in != "" && got <= tc.in {
			t.Errorf("BumpConfig(%q) = %q does not sort after it", tc.in, got)
		}
		if StateOf(got) != StateOf(tc.in) && tc.in != "" {
			t.Errorf("StateOf(%q) = %q; want %q", got, StateOf(got), StateOf(tc.in))
		}
	}
}
