package main

import (
	"runtime/debug"
	"testing"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"536870912", 536870912, true},
		{"512MiB", 512 << 20, true},
		{"2GiB", 2 << 30, true},
		{"64KiB", 64 << 10, true},
		{"", 0, false},
		{"0", 0, false},
		{"-5MiB", 0, false},
		{"1.5GiB", 0, false},
		{"12MB", 0, false},
	}
	for _, tt := range tests {
		got, err := parseBytes(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestSetupRuntime(t *testing.T) {
	env := map[string]string{envMemoryLimit: "lots"}
	if err := setupRuntime(func(k string) string { return env[k] }); err == nil {
		t.Error("a malformed memory limit was accepted")
	}
}

func TestSetupRuntimeMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	env := map[string]string{envMemoryLimit: "1GiB"}
	if err := setupRuntime(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	// The runtime's soft limit leaves room below the ceiling for the
	// view-syncer's shedding to act.
	if got, want := debug.SetMemoryLimit(-1), int64(1<<30)/10*7; got != want {
		t.Errorf("soft memory limit %d; want %d", got, want)
	}
}
