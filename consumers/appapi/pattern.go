package appapi

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Pattern is a compiled allow-list entry of ZERO_QUERY_URL or
// ZERO_MUTATE_URL. zero-cache compiles each entry with WHATWG URLPattern
// (new URLPattern(entry)) and allows a URL when any entry's test(url) is
// true. Pattern implements the subset of that syntax its configurations use:
//
//   - a full URL: scheme://host[:port][/path][?search][#hash];
//   - literal text, compared after the URL's canonicalisation (the scheme and
//     host lower-cased, the scheme's default port dropped, the path
//     percent-encoded);
//   - "*", which matches any run of characters, "/" and "." included
//     ("https://*.example.com/q" allows "https://a.b.example.com/q", and
//     "https://api.example.com/*" any path);
//   - ":name", which matches one non-empty host label or path segment
//     ("https://api.example.com/:version/q").
//
// Components the pattern leaves out match anything, as in URLPattern: a
// pattern without a path allows every path, without "?" every query string,
// without "#" every fragment, and user info is never compared. A pattern
// with a "?" compares the query string literally, so the usual form without
// one ignores the query, as zero-cache's docs say.
//
// Regexp groups "(...)", "{...}" groups, modifiers after ":name" and
// backslash escapes are refused by Compile rather than misread.
type Pattern struct {
	src                                    string
	protocol, hostname, port, path, search *regexp.Regexp
	hash                                   *regexp.Regexp
}

// ErrUnsupportedPattern is wrapped by Compile's errors for URLPattern syntax
// outside the supported subset.
var ErrUnsupportedPattern = errors.New("unsupported URLPattern syntax")

// CompilePattern parses one URL pattern. Its errors read as zero-cache's
// ("Invalid URLPattern in URL configuration: ...").
func CompilePattern(src string) (*Pattern, error) {
	p, err := compilePattern(src)
	if err != nil {
		return nil, fmt.Errorf("invalid URLPattern in URL configuration: %q: %w", src, err)
	}
	return p, nil
}

func compilePattern(src string) (*Pattern, error) {
	if strings.ContainsAny(src, `(){}\`) {
		return nil, fmt.Errorf(`%w: groups and escapes ("(", "{", "\") are not supported`, ErrUnsupportedPattern)
	}
	scheme, rest, ok := strings.Cut(src, "://")
	if !ok || scheme == "" {
		return nil, errors.New("a pattern must be a full URL (scheme://host/...)")
	}
	if i := strings.IndexByte(rest, '?'); i > 0 && modifierAt(rest, i) {
		return nil, fmt.Errorf("%w: modifier %q after a group", ErrUnsupportedPattern, '?')
	}
	p := &Pattern{src: src}
	rest, hash, hasHash := strings.Cut(rest, "#")
	rest, search, hasSearch := strings.Cut(rest, "?")
	authority, path := rest, ""
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	if strings.Contains(authority, "@") {
		return nil, fmt.Errorf("%w: user info in a pattern", ErrUnsupportedPattern)
	}
	host, port := authority, ""
	if i := strings.LastIndexByte(authority, ':'); i >= 0 && portLike(authority[i+1:]) {
		host, port = authority[:i], authority[i+1:]
	}
	if host == "" {
		return nil, errors.New("a pattern needs a host")
	}
	scheme = strings.ToLower(scheme)
	if port == defaultPort(scheme) {
		port = ""
	}
	var err error
	if p.protocol, err = componentRegexp(scheme, "", identity); err != nil {
		return nil, err
	}
	if p.hostname, err = componentRegexp(strings.ToLower(host), `[^.]+`, identity); err != nil {
		return nil, err
	}
	if p.port, err = componentRegexp(port, `[^:]+`, identity); err != nil {
		return nil, err
	}
	pathSrc := path
	if path == "" && !hasSearch && !hasHash {
		pathSrc = "*"
	} else if path == "" {
		pathSrc = "/"
	}
	if p.path, err = componentRegexp(pathSrc, `[^/]+`, escapePath); err != nil {
		return nil, err
	}
	searchSrc, hashSrc := "*", "*"
	if hasSearch {
		searchSrc = search
	}
	if hasHash {
		hashSrc = hash
	}
	if p.search, err = componentRegexp(searchSrc, `.+`, identity); err != nil {
		return nil, err
	}
	if p.hash, err = componentRegexp(hashSrc, `.+`, identity); err != nil {
		return nil, err
	}
	return p, nil
}

// modifierAt reports whether the "?" at s[i] follows "*" or a ":name",
// where URLPattern reads it as a modifier rather than the search delimiter.
func modifierAt(s string, i int) bool {
	if s[i-1] == '*' {
		return true
	}
	j := i
	for j > 0 && nameChar(s[j-1]) {
		j--
	}
	return j < i && j > 0 && s[j-1] == ':' && nameStart(s[j])
}

// portLike tells a port (digits, or a wildcard) from a ":name" group in
// the host.
func portLike(s string) bool {
	if s == "" || s == "*" {
		return true
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func identity(s string) string { return s }

// escapePath percent-encodes a literal path piece as URL parsing encodes the
// URL's path, so "a b" in a pattern matches "a%20b" in a URL.
func escapePath(s string) string {
	return (&url.URL{Path: s}).EscapedPath()
}

// componentRegexp turns one component's pattern into an anchored regexp.
// segment is what ":name" matches there.
func componentRegexp(src, segment string, lit func(string) string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	var literal strings.Builder
	flush := func() {
		b.WriteString(regexp.QuoteMeta(lit(literal.String())))
		literal.Reset()
	}
	for i := 0; i < len(src); i++ {
		switch c := src[i]; {
		case c == '*':
			flush()
			b.WriteString(".*")
		case c == ':' && i+1 < len(src) && nameStart(src[i+1]):
			flush()
			j := i + 1
			for j < len(src) && nameChar(src[j]) {
				j++
			}
			if j < len(src) && strings.IndexByte("?+*", src[j]) >= 0 {
				return nil, fmt.Errorf("%w: modifier %q after :%s", ErrUnsupportedPattern, src[j], src[i+1:j])
			}
			b.WriteString("(?:" + segment + ")")
			i = j - 1
		case c == '+' || c == '?':
			return nil, fmt.Errorf("%w: modifier %q", ErrUnsupportedPattern, c)
		default:
			literal.WriteByte(c)
		}
	}
	flush()
	b.WriteString("$")
	return regexp.Compile(b.String())
}

func nameStart(c byte) bool {
	return c == '_' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func nameChar(c byte) bool { return nameStart(c) || c >= '0' && c <= '9' }

func defaultPort(scheme string) string {
	switch scheme {
	case "http", "ws":
		return "80"
	case "https", "wss":
		return "443"
	case "ftp":
		return "21"
	}
	return ""
}

// String returns the pattern as configured.
func (p *Pattern) String() string { return p.src }

// Match reports whether rawURL is allowed by the pattern. A URL that does not
// parse as an absolute URL matches nothing.
func (p *Pattern) Match(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return false
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == defaultPort(scheme) {
		port = ""
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	return p.protocol.MatchString(scheme) &&
		p.hostname.MatchString(strings.ToLower(u.Hostname())) &&
		p.port.MatchString(port) &&
		p.path.MatchString(path) &&
		p.search.MatchString(u.RawQuery) &&
		p.hash.MatchString(u.EscapedFragment())
}

// matchAny reports whether any pattern allows rawURL (zero-cache urlMatch).
func matchAny(patterns []*Pattern, rawURL string) bool {
	for _, p := range patterns {
		if p.Match(rawURL) {
			return true
		}
	}
	return false
}
