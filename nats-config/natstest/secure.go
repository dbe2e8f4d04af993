package natstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// Auth is how a Secure server authenticates its clients.
type Auth int

const (
	// Accounts: an APP account with JetStream holding a user/password user,
	// an nkey user and a user that may only use inboxes; a SYS account.
	Accounts Auth = iota
	// Operator: decentralized JWT auth (an operator, an APP account with
	// JetStream, preloaded) and a creds file for one APP user.
	Operator
	// Token: one token, no accounts.
	Token
)

// Secure is a running server that wants TLS with client certificates
// (verify) and auth, and the files a client needs. Paths are in a temp dir.
type Secure struct {
	Server *server.Server
	URL    string // tls://127.0.0.1:port

	CA, Cert, Key string // PEM files: the CA, and a client certificate it signed

	User, Password string // Accounts: the APP user with all rights
	Limited        string // Accounts: a user (password Password) allowed only _INBOX.>
	NKeySeed       string // Accounts: file with the nkey user's seed
	Creds          string // Operator: the APP user's creds file
	Token          string // Token
}

// StartSecure runs a TLS server with the given auth.
func StartSecure(t testing.TB, auth Auth) *Secure {
	t.Helper()
	dir := t.TempDir()
	s := &Secure{}
	ca, caKey := writeCA(t, dir)
	s.CA = filepath.Join(dir, "ca.pem")
	serverCert, serverKey := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	writeLeaf(t, ca, caKey, serverCert, serverKey, true)
	s.Cert, s.Key = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	writeLeaf(t, ca, caKey, s.Cert, s.Key, false)

	var conf strings.Builder
	fmt.Fprintf(&conf, "listen: \"127.0.0.1:-1\"\nserver_name: natstest_secure\n")
	fmt.Fprintf(&conf, "jetstream { store_dir: %q }\n", filepath.Join(dir, "js"))
	fmt.Fprintf(&conf, "tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true, timeout: 5 }\n", serverCert, serverKey, s.CA)
	switch auth {
	case Accounts:
		s.User, s.Password, s.Limited = "app", "app-secret", "limited"
		kp, err := nkeys.CreateUser()
		must(t, err)
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		s.NKeySeed = filepath.Join(dir, "user.nk")
		must(t, os.WriteFile(s.NKeySeed, seed, 0o600))
		fmt.Fprintf(&conf, `accounts {
  APP {
    jetstream: enabled
    users: [
      {user: %q, password: %q}
      {nkey: %q}
      {user: %q, password: %q, permissions: {publish: ["_INBOX.>"], subscribe: ["_INBOX.>"]}}
    ]
  }
  SYS { users: [{user: sys, password: %q}] }
}
system_account: SYS
`, s.User, s.Password, pub, s.Limited, s.Password, s.Password+"-sys")
	case Operator:
		s.Creds = filepath.Join(dir, "app.creds")
		writeOperator(t, &conf, s.Creds)
	case Token:
		s.Token = "tok-secret"
		fmt.Fprintf(&conf, "authorization { token: %q }\n", s.Token)
	}
	path := filepath.Join(dir, "server.conf")
	must(t, os.WriteFile(path, []byte(conf.String()), 0o600))
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("natstest: %v\n%s", err, conf.String())
	}
	o.NoLog, o.NoSigs = true, true
	s.Server = start(t, o)
	s.URL = fmt.Sprintf("tls://%s", s.Server.Addr().String())
	return s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
}

// writeOperator writes an operator, SYS and APP accounts and a resolver
// preload into conf, and the APP user's creds file to creds.
func writeOperator(t testing.TB, conf *strings.Builder, creds string) {
	t.Helper()
	op, err := nkeys.CreateOperator()
	must(t, err)
	opPub, _ := op.PublicKey()
	opClaims := jwt.NewOperatorClaims(opPub)
	opClaims.Name = "natstest"
	account := func(name string, js bool) (nkeys.KeyPair, string, string) {
		kp, err := nkeys.CreateAccount()
		must(t, err)
		pub, _ := kp.PublicKey()
		c := jwt.NewAccountClaims(pub)
		c.Name = name
		if js {
			c.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		tok, err := c.Encode(op)
		must(t, err)
		return kp, pub, tok
	}
	_, sysPub, sysJWT := account("SYS", false)
	opClaims.SystemAccount = sysPub
	opJWT, err := opClaims.Encode(op)
	must(t, err)
	app, appPub, appJWT := account("APP", true)

	user, err := nkeys.CreateUser()
	must(t, err)
	userPub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(userPub)
	uc.Name = "app"
	userJWT, err := uc.Encode(app)
	must(t, err)
	seed, _ := user.Seed()
	file, err := jwt.FormatUserConfig(userJWT, seed)
	must(t, err)
	must(t, os.WriteFile(creds, file, 0o600))

	fmt.Fprintf(conf, "operator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %q\n  %s: %q\n}\n",
		opJWT, sysPub, sysPub, sysJWT, appPub, appJWT)
}

func writeCA(t testing.TB, dir string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "natstest CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	ca, err := x509.ParseCertificate(der)
	must(t, err)
	return ca, key
}

func writeLeaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string, server bool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	sn, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "natstest client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.Subject.CommonName = "natstest server"
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	must(t, err)
	kb, err := x509.MarshalECPrivateKey(key)
	must(t, err)
	must(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
}
