package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/jetsync/jetsync/nats-config/natstest"
)

// natsConnFrom registers a natsConn from vars (the environment) and args,
// as a subcommand does.
func natsConnFrom(t *testing.T, vars map[string]string, args ...string) *natsConn {
	t.Helper()
	e := &env{lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
	var n natsConn
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	n.register(fs, e)
	if err := parseFlags(fs, e, &bytes.Buffer{}, "", args); err != nil {
		t.Fatal(err)
	}
	return &n
}

// tlsVars are the settings that pass the Secure server's TLS with verify.
func tlsVars(s *natstest.Secure, more map[string]string) map[string]string {
	v := map[string]string{
		"JETSYNC_NATS_URL":      s.URL,
		"JETSYNC_NATS_TLS_CA":   s.CA,
		"JETSYNC_NATS_TLS_CERT": s.Cert,
		"JETSYNC_NATS_TLS_KEY":  s.Key,
	}
	for k, x := range more {
		v[k] = x
	}
	return v
}

// dialJS connects n and asks JetStream for the account's info, which needs
// an authenticated user in a JetStream account with API rights.
func dialJS(t *testing.T, n *natsConn, log *slog.Logger) error {
	t.Helper()
	return dialJSWithin(t, n, log, 10*time.Second)
}

func dialJSWithin(t *testing.T, n *natsConn, log *slog.Logger, timeout time.Duration) error {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nc, err := n.dial("jetsync test", log, false)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func TestNATSUserPassword(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Accounts)
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_USER": s.User, "JETSYNC_NATS_PASSWORD": s.Password})), nil); err != nil {
		t.Fatalf("user/password from the environment: %v", err)
	}
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, nil), "-nats-user", s.User, "-nats-password", s.Password), nil); err != nil {
		t.Fatalf("user/password from flags: %v", err)
	}
	err := dialJS(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_USER": s.User, "JETSYNC_NATS_PASSWORD": "wrong"})), nil)
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("wrong password: got %v, want an authorization error", err)
	}
}

// TestNATSPermissions: a user the server limits to inboxes connects but
// can't use the JetStream API, so the permissions are the server's and not
// widened by anything jetsync sends.
func TestNATSPermissions(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Accounts)
	// The server drops a denied publish: the request times out.
	err := dialJSWithin(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_USER": s.Limited, "JETSYNC_NATS_PASSWORD": s.Password})), nil, 2*time.Second)
	if errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("the limited user could not connect: %v", err)
	}
	if err == nil {
		t.Fatal("a user allowed only _INBOX.> used the JetStream API")
	}
}

func TestNATSNKey(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Accounts)
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_NKEY": s.NKeySeed})), nil); err != nil {
		t.Fatalf("nkey: %v", err)
	}
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	other := filepath.Join(t.TempDir(), "other.nk")
	if err := os.WriteFile(other, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, nil), "-nats-nkey", other), nil); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("unknown nkey: got %v, want an authorization error", err)
	}
}

func TestNATSToken(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Token)
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_TOKEN": s.Token})), nil); err != nil {
		t.Fatalf("token: %v", err)
	}
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_TOKEN": "nope"})), nil); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("wrong token: got %v, want an authorization error", err)
	}
}

func TestNATSCreds(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Operator)
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_CREDS": s.Creds})), nil); err != nil {
		t.Fatalf("creds: %v", err)
	}
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, nil)), nil); err == nil {
		t.Fatal("an operator-mode server let in a client without creds")
	}
}

// TestNATSTLS: the CA is what makes the server's certificate trusted, and
// the client certificate is what the server's verify asks for.
func TestNATSTLS(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Token)
	auth := map[string]string{"JETSYNC_NATS_TOKEN": s.Token}
	noCA := tlsVars(s, auth)
	delete(noCA, "JETSYNC_NATS_TLS_CA")
	if err := dialJS(t, natsConnFrom(t, noCA), nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: got %v, want a certificate error", err)
	}
	noCert := tlsVars(s, auth)
	delete(noCert, "JETSYNC_NATS_TLS_CERT")
	delete(noCert, "JETSYNC_NATS_TLS_KEY")
	if err := dialJS(t, natsConnFrom(t, noCert), nil); err == nil {
		t.Fatal("the server's verify let in a client without a certificate")
	}
}

// writeContext writes a nats CLI context under a fresh XDG_CONFIG_HOME and
// returns that directory.
func writeContext(t *testing.T, name, body string, selected bool) string {
	t.Helper()
	dir := t.TempDir()
	cdir := filepath.Join(dir, "nats", "context")
	if err := os.MkdirAll(cdir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdir, name+".json"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if selected {
		if err := os.WriteFile(filepath.Join(dir, "nats", "context.txt"), []byte(name+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestNATSContext(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Operator)
	q := func(v string) string { return `"` + strings.ReplaceAll(v, `\`, `\\`) + `"` }
	body := `{"description": "test", "url": ` + q(s.URL) + `, "creds": ` + q("file://"+s.Creds) +
		`, "cert": ` + q(s.Cert) + `, "key": ` + q(s.Key) + `, "ca": ` + q(s.CA) + `, "color_scheme": ""}`
	xdg := writeContext(t, "prod", body, true)
	for _, tc := range []struct {
		name string
		vars map[string]string
	}{
		{"JETSYNC_NATS_CONTEXT", map[string]string{"XDG_CONFIG_HOME": xdg, "JETSYNC_NATS_CONTEXT": "prod"}},
		{"NATS_CONTEXT", map[string]string{"XDG_CONFIG_HOME": xdg, "NATS_CONTEXT": "prod"}},
		{"selected", map[string]string{"XDG_CONFIG_HOME": xdg, "JETSYNC_NATS_CONTEXT": "."}},
		{"HOME", map[string]string{"HOME": filepath.Dir(xdg), "JETSYNC_NATS_CONTEXT": "prod"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "HOME" {
				// ~/.config/nats: move the tree under a fake home.
				home := t.TempDir()
				if err := os.Rename(xdg, filepath.Join(home, ".config")); err != nil {
					t.Fatal(err)
				}
				defer os.Rename(filepath.Join(home, ".config"), xdg)
				tc.vars["HOME"] = home
			}
			if err := dialJS(t, natsConnFrom(t, tc.vars), nil); err != nil {
				t.Fatalf("context: %v", err)
			}
		})
	}

	// A setting given to jetsync beats the context's: a bad URL in the
	// context is overridden, and a bad explicit creds file is used.
	bad := writeContext(t, "bad", `{"url": "tls://127.0.0.1:1", "creds": `+q(s.Creds)+`, "ca": `+q(s.CA)+`, "cert": `+q(s.Cert)+`, "key": `+q(s.Key)+`}`, false)
	if err := dialJS(t, natsConnFrom(t, map[string]string{"XDG_CONFIG_HOME": bad, "JETSYNC_NATS_CONTEXT": "bad", "JETSYNC_NATS_URL": s.URL}), nil); err != nil {
		t.Fatalf("explicit URL over the context's: %v", err)
	}
	other := natstest.StartSecure(t, natstest.Operator)
	if err := dialJS(t, natsConnFrom(t, map[string]string{"XDG_CONFIG_HOME": xdg, "JETSYNC_NATS_CONTEXT": "prod", "JETSYNC_NATS_CREDS": other.Creds}), nil); err == nil {
		t.Fatal("explicit creds of another operator: connected with the context's instead")
	}

	for _, tc := range []struct{ name, body, want string }{
		{"missing", "", "no such file"},
		{"domain", `{"jetstream_domain": "hub"}`, "jetstream_domain"},
		{"uri", `{"creds": "op://vault/item/creds"}`, "op://"},
		{"json", `{"url": `, "unexpected end"},
	} {
		dir := xdg
		if tc.body != "" {
			dir = writeContext(t, tc.name, tc.body, false)
		}
		_, err := natsConnFrom(t, map[string]string{"XDG_CONFIG_HOME": dir, "JETSYNC_NATS_CONTEXT": tc.name}).resolve()
		if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("context %s: got %v, want a usage error naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := natsConnFrom(t, map[string]string{"XDG_CONFIG_HOME": xdg, "JETSYNC_NATS_CONTEXT": "../prod"}).resolve(); err == nil {
		t.Error("context name ../prod: accepted")
	}
}

func TestNATSSettingsRefused(t *testing.T) {
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		vars map[string]string
	}{
		{"user without password", map[string]string{"JETSYNC_NATS_USER": "u"}},
		{"password without user", map[string]string{"JETSYNC_NATS_PASSWORD": "p"}},
		{"creds and nkey", map[string]string{"JETSYNC_NATS_CREDS": f, "JETSYNC_NATS_NKEY": f}},
		{"token and user", map[string]string{"JETSYNC_NATS_TOKEN": "t", "JETSYNC_NATS_USER": "u", "JETSYNC_NATS_PASSWORD": "p"}},
		{"cert without key", map[string]string{"JETSYNC_NATS_TLS_CERT": f}},
		{"missing creds file", map[string]string{"JETSYNC_NATS_CREDS": f + ".missing"}},
		{"bad nkey seed", map[string]string{"JETSYNC_NATS_NKEY": f}},
	} {
		if _, err := natsConnFrom(t, tc.vars).resolve(); !errors.Is(err, errUsage) {
			t.Errorf("%s: got %v, want a usage error", tc.name, err)
		}
	}
}

// TestNATSSecretsNotLogged: neither the connect log line nor -h shows a
// password or token.
func TestNATSSecretsNotLogged(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Accounts)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: redactAttr}))
	if err := dialJS(t, natsConnFrom(t, tlsVars(s, map[string]string{"JETSYNC_NATS_USER": s.User, "JETSYNC_NATS_PASSWORD": s.Password})), log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "nats connecting") || !strings.Contains(buf.String(), "user="+s.User) {
		t.Fatalf("no connect line naming the user:\n%s", buf.String())
	}
	tok := natstest.StartSecure(t, natstest.Token)
	if err := dialJS(t, natsConnFrom(t, tlsVars(tok, map[string]string{"JETSYNC_NATS_TOKEN": tok.Token})), log); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{s.Password, tok.Token} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("log shows %q:\n%s", secret, buf.String())
		}
	}
	var out bytes.Buffer
	e := &env{lookup: func(k string) (string, bool) {
		v, ok := map[string]string{"JETSYNC_NATS_PASSWORD": "pw-in-env", "JETSYNC_NATS_TOKEN": "tok-in-env"}[k]
		return v, ok
	}}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	new(natsConn).register(fs, e)
	_ = parseFlags(fs, e, &out, "", []string{"-h"})
	if h := out.String(); !strings.Contains(h, "nats-token") || strings.Contains(h, "pw-in-env") || strings.Contains(h, "tok-in-env") {
		t.Errorf("-h shows a secret, or no -nats-token:\n%s", h)
	}
}

// TestBackupNowCreds: backup now, a role's client, gets through TLS and
// creds to the request (no change-streamer answers it here).
func TestBackupNowCreds(t *testing.T) {
	s := natstest.StartSecure(t, natstest.Operator)
	for k, v := range tlsVars(s, map[string]string{"JETSYNC_NATS_CREDS": s.Creds}) {
		t.Setenv(k, v)
	}
	var stdout, stderr bytes.Buffer
	err := cmdBackup(context.Background(), []string{"now", "-timeout", "5s"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "no change-streamer answers") {
		t.Fatalf("backup now: got %v, want no responders\n%s", err, stderr.String())
	}
	t.Setenv("JETSYNC_NATS_CREDS", "")
	err = cmdBackup(context.Background(), []string{"now", "-timeout", "5s"}, &stdout, &stderr)
	if err == nil || strings.Contains(err.Error(), "no change-streamer answers") {
		t.Fatalf("backup now without creds: got %v, want a connect error", err)
	}
}
