package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
)

// natsConn is how a subcommand reaches and authenticates to an external NATS
// server: the one place its connection options are built. Each setting may
// also come from a nats CLI context; a setting given here beats the
// context's.
type natsConn struct {
	url      string
	context  string
	creds    string
	nkey     string
	user     string
	password string
	token    string
	tlsCA    string
	tlsCert  string
	tlsKey   string

	// configDir is where nats CLI contexts live ($XDG_CONFIG_HOME/nats or
	// ~/.config/nats), read from the environment at registration.
	configDir string
}

func (n *natsConn) register(fs *flag.FlagSet, e *env) {
	n.url = e.str("JETSYNC_NATS_URL", "")
	bindVar(fs, secret{&n.url}, "JETSYNC_NATS_URL", "")
	// The nats CLI reads NATS_CONTEXT; jetsync's own variable beats it.
	e.strVar(fs, &n.context, "JETSYNC_NATS_CONTEXT", e.str("NATS_CONTEXT", ""))
	e.strVar(fs, &n.creds, "JETSYNC_NATS_CREDS", "")
	e.strVar(fs, &n.nkey, "JETSYNC_NATS_NKEY", "")
	e.strVar(fs, &n.user, "JETSYNC_NATS_USER", "")
	n.password = e.str("JETSYNC_NATS_PASSWORD", "")
	bindVar(fs, hidden{&n.password}, "JETSYNC_NATS_PASSWORD", "")
	n.token = e.str("JETSYNC_NATS_TOKEN", "")
	bindVar(fs, hidden{&n.token}, "JETSYNC_NATS_TOKEN", "")
	e.strVar(fs, &n.tlsCA, "JETSYNC_NATS_TLS_CA", "")
	e.strVar(fs, &n.tlsCert, "JETSYNC_NATS_TLS_CERT", "")
	e.strVar(fs, &n.tlsKey, "JETSYNC_NATS_TLS_KEY", "")
	n.configDir = natsConfigDir(e)
}

func natsConfigDir(e *env) string {
	if d := e.str("XDG_CONFIG_HOME", ""); d != "" {
		return filepath.Join(d, "nats")
	}
	if h := e.str("HOME", ""); h != "" {
		return filepath.Join(h, ".config", "nats")
	}
	return ""
}

// natsContext is the part of a nats CLI context file (ADR-21) jetsync
// reads. Fields it can't honour are named so that a context relying on one
// is refused rather than half-applied.
type natsContext struct {
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	InboxPrefix string `json:"inbox_prefix"`
	TLSFirst    bool   `json:"tls_first"`

	NSC              string `json:"nsc"`
	UserJWT          string `json:"user_jwt"`
	JSDomain         string `json:"jetstream_domain"`
	JSAPIPrefix      string `json:"jetstream_api_prefix"`
	JSEventPrefix    string `json:"jetstream_event_prefix"`
	WindowsCertStore string `json:"windows_cert_store"`
}

// The nats CLI's rule for context names: no path separators or dots at the
// start, so a name can't leave the context directory.
var contextNameRe = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.@-]*$`)

// loadContext reads the context named name, or the selected one for ".".
func (n *natsConn) loadContext() (natsContext, string, error) {
	var c natsContext
	if n.configDir == "" {
		return c, "", usageError("nats context %q: no HOME or XDG_CONFIG_HOME to find it in", n.context)
	}
	name := n.context
	if name == "." {
		b, err := os.ReadFile(filepath.Join(n.configDir, "context.txt"))
		if errors.Is(err, fs.ErrNotExist) {
			return c, "", usageError("nats context \".\": no context is selected (%s)", filepath.Join(n.configDir, "context.txt"))
		}
		if err != nil {
			return c, "", fmt.Errorf("nats context: %w", err)
		}
		name = strings.TrimSpace(string(b))
	}
	if !contextNameRe.MatchString(name) || strings.Contains(name, "..") {
		return c, "", usageError("nats context %q: not a context name", name)
	}
	path := filepath.Join(n.configDir, "context", name+".json")
	b, err := os.ReadFile(path)
	if err != nil {
		return c, "", usageError("nats context %q: %v", name, err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, "", usageError("nats context %q: %s: %v", name, path, err)
	}
	unsupported := map[string]string{
		"nsc": c.NSC, "user_jwt": c.UserJWT, "jetstream_domain": c.JSDomain,
		"jetstream_api_prefix": c.JSAPIPrefix, "jetstream_event_prefix": c.JSEventPrefix,
		"windows_cert_store": c.WindowsCertStore,
	}
	for _, k := range []string{"nsc", "user_jwt", "jetstream_domain", "jetstream_api_prefix", "jetstream_event_prefix", "windows_cert_store"} {
		if unsupported[k] != "" {
			return c, "", usageError("nats context %q sets %s, which jetsync does not support", name, k)
		}
	}
	for _, f := range []*string{&c.Creds, &c.NKey} {
		p, err := contextPath(*f)
		if err != nil {
			return c, "", usageError("nats context %q: %v", name, err)
		}
		*f = p
	}
	return c, name, nil
}

// contextPath takes a context's creds or nkey value: a path, or a file://
// URI. The other credential URI schemes shell out or read the environment,
// which jetsync leaves to the operator.
func contextPath(v string) (string, error) {
	if v == "" || !strings.Contains(v, ":") {
		return v, nil
	}
	u, err := url.Parse(v)
	if err != nil || u.Scheme == "" || len(u.Scheme) == 1 {
		return v, nil // a Windows drive letter, or a plain path with a colon
	}
	if u.Scheme != "file" {
		return "", fmt.Errorf("credential %s:// URIs are not supported; use a file path", u.Scheme)
	}
	return u.Path, nil
}

// natsSettings are the resolved connection settings: what connectNATS
// dials, and a description for the log with no secrets in it.
type natsSettings struct {
	url  string
	opts []nats.Option
	desc []any
}

// resolve merges the context under the explicit settings, checks them and
// builds the connection options.
func (n *natsConn) resolve() (natsSettings, error) {
	var s natsSettings
	m := *n
	var ctx natsContext
	if n.context != "" {
		c, name, err := n.loadContext()
		if err != nil {
			return s, err
		}
		ctx = c
		s.desc = append(s.desc, "context", name)
		for _, f := range []struct {
			dst *string
			v   string
		}{
			{&m.url, c.URL}, {&m.creds, c.Creds}, {&m.nkey, c.NKey}, {&m.tlsCA, c.CA},
			{&m.tlsCert, c.Cert}, {&m.tlsKey, c.Key},
		} {
			if *f.dst == "" {
				*f.dst = f.v
			}
		}
		// User/password and token go together: take the context's only when
		// none is set here.
		if m.user == "" && m.password == "" && m.token == "" {
			m.user, m.password, m.token = c.User, c.Password, c.Token
		}
	}
	if m.url == "" {
		m.url = DefaultNATSURL
	}
	s.url = m.url
	s.desc = append([]any{"url", redact(m.url)}, s.desc...)

	var kinds []string
	if m.creds != "" {
		kinds = append(kinds, "creds")
	}
	if m.nkey != "" {
		kinds = append(kinds, "nkey")
	}
	if m.user != "" || m.password != "" {
		if m.user == "" || m.password == "" {
			return s, usageError("nats user and password go together: set both JETSYNC_NATS_USER and JETSYNC_NATS_PASSWORD")
		}
		kinds = append(kinds, "user")
	}
	if m.token != "" {
		kinds = append(kinds, "token")
	}
	if len(kinds) > 1 {
		return s, usageError("nats authentication: set one of creds, nkey, user/password and token, not %s", strings.Join(kinds, " and "))
	}
	if (m.tlsCert == "") != (m.tlsKey == "") {
		return s, usageError("nats TLS client certificate and key go together: set both JETSYNC_NATS_TLS_CERT and JETSYNC_NATS_TLS_KEY")
	}
	for _, f := range []struct{ what, path string }{
		{"creds", m.creds}, {"nkey", m.nkey}, {"TLS CA", m.tlsCA}, {"TLS certificate", m.tlsCert}, {"TLS key", m.tlsKey},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return s, usageError("nats %s file: %v", f.what, err)
		}
	}

	switch {
	case m.creds != "":
		s.opts = append(s.opts, nats.UserCredentials(m.creds))
		s.desc = append(s.desc, "auth", "creds", "creds", m.creds)
	case m.nkey != "":
		opt, err := nats.NkeyOptionFromSeed(m.nkey)
		if err != nil {
			return s, usageError("nats nkey file %s: %v", m.nkey, err)
		}
		s.opts = append(s.opts, opt)
		s.desc = append(s.desc, "auth", "nkey", "nkey", m.nkey)
	case m.user != "":
		s.opts = append(s.opts, nats.UserInfo(m.user, m.password))
		s.desc = append(s.desc, "auth", "user", "user", m.user)
	case m.token != "":
		s.opts = append(s.opts, nats.Token(m.token))
		s.desc = append(s.desc, "auth", "token")
	}
	if m.tlsCA != "" {
		s.opts = append(s.opts, nats.RootCAs(m.tlsCA))
		s.desc = append(s.desc, "tls_ca", m.tlsCA)
	}
	if m.tlsCert != "" {
		s.opts = append(s.opts, nats.ClientCert(m.tlsCert, m.tlsKey))
		s.desc = append(s.desc, "tls_cert", m.tlsCert)
	}
	if ctx.TLSFirst {
		s.opts = append(s.opts, nats.TLSHandshakeFirst())
	}
	if ctx.InboxPrefix != "" {
		s.opts = append(s.opts, nats.CustomInboxPrefix(ctx.InboxPrefix))
	}
	return s, nil
}

// dial connects as name. With retry the first connection is retried too
// (the server may start after jetsync) and reconnects never stop.
func (n *natsConn) dial(name string, log *slog.Logger, retry bool) (*nats.Conn, error) {
	s, err := n.resolve()
	if err != nil {
		return nil, err
	}
	opts := append([]nats.Option{nats.Name(name)}, s.opts...)
	if retry {
		opts = append(opts,
			nats.MaxReconnects(-1),
			nats.RetryOnFailedConnect(true),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil {
					log.Warn("nats disconnected", "err", err)
				}
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) {
				log.Info("nats reconnected", "url", redact(nc.ConnectedUrl()))
			}),
		)
	}
	log.Info("nats connecting", s.desc...)
	nc, err := nats.Connect(s.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(s.url), err)
	}
	return nc, nil
}

// displayURL is the URL for log lines, password redacted.
func (n *natsConn) displayURL() string {
	if n.url == "" && n.context != "" {
		return "(nats context " + n.context + ")"
	}
	if n.url == "" {
		return DefaultNATSURL
	}
	return redact(n.url)
}
