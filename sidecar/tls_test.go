package sidecar

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// writePair writes a self-signed certificate for cn (also its DNS name) and its key, stamped with
// modTime.
func writePair(t *testing.T, certFile, keyFile, cn string, modTime time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, DNSNames: []string{cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for file, block := range map[string]*pem.Block{
		certFile: {Type: "CERTIFICATE", Bytes: der},
		keyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, modTime, modTime); err != nil {
			t.Fatal(err)
		}
	}
}

func servedName(t *testing.T, k *keyPair) string {
	t.Helper()
	c, err := k.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

// TestKeyPairRotation serves a rotated certificate without a restart, and keeps the last good
// one while the files are half written.
func TestKeyPairRotation(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	writePair(t, certFile, keyFile, "first", t0)
	k, err := newKeyPair(certFile, keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := servedName(t, k); got != "first" {
		t.Fatalf("serving %q, want first", got)
	}
	// The watch also reads the files every interval, which catches a change made before its
	// file watches are in place.
	k.certs.WithWatchInterval(50 * time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	watched := make(chan error, 1)
	go func() { watched <- k.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-watched; err != nil {
			t.Errorf("watching the key pair: %v", err)
		}
	})
	writePair(t, certFile, keyFile, "second", t0.Add(time.Minute))
	poll.Eventually(t, 5*time.Second, "the rotated certificate served", func() (bool, string) {
		got := servedName(t, k)
		return got == "second", "serving " + got
	})
	if err := os.WriteFile(keyFile, []byte("half written"), 0o600); err != nil {
		t.Fatal(err)
	}
	// What the watch does on the change, done here so that the check below follows it.
	if err := k.certs.ReadCertificate(); err == nil {
		t.Fatal("a half-written key file loaded")
	}
	if got := servedName(t, k); got != "second" {
		t.Errorf("with a broken key file serving %q, want the last good certificate", got)
	}
}

func TestKeyPairInvalidAtStart(t *testing.T) {
	dir := t.TempDir()
	if _, err := newKeyPair(filepath.Join(dir, "missing.crt"), filepath.Join(dir, "missing.key"), ""); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("newKeyPair with missing files: %v, want ErrInvalidOptions", err)
	}
}

// TestKeyPairNamesItsNode: with a name to prove, a certificate for another node fails the start
// with a message naming the name the controller expects, and a rotated certificate for another
// node is passed over for the last good one.
func TestKeyPairNamesItsNode(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	writePair(t, certFile, keyFile, "node-a.healer-sidecar", t0)
	_, err := newKeyPair(certFile, keyFile, "node-b.healer-sidecar")
	if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), `"node-b.healer-sidecar"`) {
		t.Fatalf("node A's certificate on node B: %v, want ErrInvalidOptions naming node-b.healer-sidecar", err)
	}
	k, err := newKeyPair(certFile, keyFile, "node-a.healer-sidecar")
	if err != nil {
		t.Fatalf("node A's certificate on node A: %v", err)
	}
	writePair(t, certFile, keyFile, "node-c.healer-sidecar", t0.Add(time.Minute))
	// What the watch does on the change, done here so that the check below follows it.
	if err := k.certs.ReadCertificate(); err != nil {
		t.Fatalf("reading node C's certificate: %v", err)
	}
	if got := servedName(t, k); got != "node-a.healer-sidecar" {
		t.Errorf("after a rotation to another node's certificate the sidecar serves %q, want node A's kept", got)
	}
}
