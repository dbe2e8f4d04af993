package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// env reads flag defaults from the environment, so that a flag beats its
// variable and the variable beats the built-in default. A malformed variable
// is an error, reported after parsing rather than silently ignored.
type env struct {
	lookup func(string) (string, bool)
	errs   []error
}

func newEnv() *env { return &env{lookup: os.LookupEnv} }

func (e *env) str(name, def string) string {
	// LookupEnv, not Getenv: JETSYNC_NATS_LISTEN= (set but empty) means
	// something different from unset.
	if v, ok := e.lookup(name); ok {
		return v
	}
	return def
}

func (e *env) int(name string, def int) int {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not an integer", name, v))
		return def
	}
	return n
}

func (e *env) duration(name string, def time.Duration) time.Duration {
	v, ok := e.lookup(name)
	if !ok || v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a duration (like 90s or 24h)", name, v))
		return def
	}
	return d
}

func (e *env) err() error { return errors.Join(e.errs...) }

// secret is a string flag whose default never shows in usage text.
type secret struct{ v *string }

func (s secret) String() string {
	if s.v == nil {
		return ""
	}
	return redact(*s.v)
}

func (s secret) Set(v string) error { *s.v = v; return nil }

// errUsage marks command-line mistakes, which exit 2 rather than 1.
var errUsage = errors.New("usage")

// usageError wraps a command-line mistake.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// parseFlags parses args into fs and checks the environment read for its
// defaults. -h and --help return flag.ErrHelp after printing usage to stdout.
func parseFlags(fs *flag.FlagSet, e *env, stdout io.Writer, summary string, args []string) error {
	// The flag package's own messages are replaced by the error returned.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs, summary)
			return err
		}
		return fmt.Errorf("%w: %v (see %s -h)", errUsage, err, fs.Name())
	}
	if fs.NArg() > 0 {
		return usageError("unexpected argument %q (see %s -h)", fs.Arg(0), fs.Name())
	}
	if err := e.err(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

func printUsage(w io.Writer, fs *flag.FlagSet, summary string) {
	fmt.Fprintf(w, "Usage: %s [flags]\n\n%s\n\n", fs.Name(), summary)
	fmt.Fprintln(w, "Flags (each flag's environment variable is named in brackets; a flag beats its variable):")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

var (
	dsnPasswordRe = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|[^\s&]+)`)
	urlRe         = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"',]+`)
)

// redact hides passwords in URLs (postgres://u:pw@h, nats://u:pw@h), NATS
// tokens in URLs (nats://token@h) and passwords in
// key=value connection strings, anywhere in s.
func redact(s string) string {
	if !strings.Contains(s, "://") && !strings.Contains(strings.ToLower(s), "password") {
		return s
	}
	s = urlRe.ReplaceAllStringFunc(s, func(raw string) string {
		u, err := url.Parse(raw)
		if err != nil || u.User == nil {
			return raw
		}
		if _, ok := u.User.Password(); !ok {
			// nats://TOKEN@host: a NATS URL's lone user part is its token.
			switch u.Scheme {
			case "nats", "tls", "ws", "wss":
				u.User = url.User("xxxxx")
				return u.String()
			}
			return raw
		}
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
		return u.String()
	})
	if u, err := url.Parse(s); err == nil && u.RawQuery != "" && u.Query().Has("password") {
		q := u.Query()
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
		s = u.String()
	}
	return dsnPasswordRe.ReplaceAllString(s, "${1}xxxxx")
}
