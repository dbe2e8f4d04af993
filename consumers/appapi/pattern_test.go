package appapi

import (
	"errors"
	"testing"
)

// The expectations come from urlpattern-polyfill (what zero-cache 1.9.0
// uses): new URLPattern(pattern).test(url) under Node 22.
func TestPattern_Match(t *testing.T) {
	tests := []struct {
		pattern, url string
		want         bool
	}{
		{"https://api.example.com/endpoint", "https://api.example.com/endpoint?x=1#f", true},
		{"https://api.example.com/endpoint", "https://api.example.com/endpoint/", false},
		{"https://api.example.com/endpoint", "https://API.example.com/endpoint", true},
		{"https://api.example.com/endpoint", "https://api.example.com:443/endpoint", true},
		{"https://api.example.com/endpoint", "https://user:pw@api.example.com/endpoint", true},
		{"https://api.example.com/endpoint", "http://api.example.com/endpoint", false},
		{"https://*.example.com/endpoint", "https://a.b.example.com/endpoint", true},
		{"https://*.example.com/endpoint", "https://example.com/endpoint", false},
		{"https://*.example.com/endpoint", "https://evil.com/.example.com/endpoint", false},
		{"https://api.example.com/*", "https://api.example.com/", true},
		{"https://api.example.com/*", "https://api.example.com/a/b", true},
		{"https://api.example.com/*", "https://api.example.com:8443/a", false},
		{"https://api.example.com", "https://api.example.com/", true},
		{"https://api.example.com", "https://api.example.com/x", true},
		{"https://api.example.com/:version/endpoint", "https://api.example.com/v1/endpoint", true},
		{"https://api.example.com/:version/endpoint", "https://api.example.com/v1/x/endpoint", false},
		{"http://127.0.0.1:4860/query", "http://127.0.0.1:4860/query", true},
		{"http://127.0.0.1:4860/query", "http://127.0.0.1:4861/query", false},
		{"http://127.0.0.1:*/query", "http://127.0.0.1:4861/query", true},
		{"http://localhost/query", "http://localhost:80/query", true},
		{"http://*:4860/query", "http://anything.here:4860/query", true},
		{"https://api.example.com/a b", "https://api.example.com/a%20b", true},
		{"https://api.example.com/endpoint", "https://api.example.com/Endpoint", false},
		{"https://api.example.com/endpoint?x=1", "https://api.example.com/endpoint?x=1", true},
		{"https://api.example.com/endpoint?x=1", "https://api.example.com/endpoint?x=2", false},
		{"https://api.example.com/endpoint?x=1", "https://api.example.com/endpoint", false},
		{"https://api.example.com/endpoint", "not a url", false},
		{"https://api.example.com/*.json", "https://api.example.com/a/b.json", true},
		{"http://127.0.0.1:8080?x=1", "http://127.0.0.1:8080/?x=1", true},
	}
	for _, tc := range tests {
		p, err := CompilePattern(tc.pattern)
		if err != nil {
			t.Fatalf("CompilePattern(%q): %v", tc.pattern, err)
		}
		if got := p.Match(tc.url); got != tc.want {
			t.Errorf("CompilePattern(%q).Match(%q) = %v; want %v", tc.pattern, tc.url, got, tc.want)
		}
	}
}

func TestCompilePattern_Refuses(t *testing.T) {
	tests := []struct {
		pattern     string
		unsupported bool
	}{
		{"api.example.com/query", false},
		{"https:///query", false},
		{"https://api.example.com/:version(v\\d+)/q", true},
		{"https://api.example.com/{a}?", true},
		{"https://api.example.com/:path?", true},
		{"https://api.example.com/:path+", true},
		{"https://user@api.example.com/q", true},
	}
	for _, tc := range tests {
		_, err := CompilePattern(tc.pattern)
		if err == nil {
			t.Errorf("CompilePattern(%q) = nil error; want one", tc.pattern)
			continue
		}
		if got := errors.Is(err, ErrUnsupportedPattern); got != tc.unsupported {
			t.Errorf("CompilePattern(%q) = %v; unsupported %v, want %v", tc.pattern, err, got, tc.unsupported)
		}
	}
}
