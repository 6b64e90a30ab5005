package sidecar

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// keyPair serves the certificate in two PEM files, which controller-runtime's certwatcher reads
// again when either file changes (and every 10 seconds), so that a rotated certificate
// (cert-manager, a projected Secret) is picked up without a restart. Mid-rotation one file may be
// new and the other old: certwatcher keeps the last pair that loaded.
type keyPair struct {
	certFile, keyFile string
	certs             *certwatcher.CertWatcher
	// name, when set, is the DNS name the certificate must carry: a pair without it is refused at
	// start, and passed over after a reload.
	name string

	mu sync.Mutex
	// seen is the pair certs served last; good the last one valid for name, which is served.
	seen, good *tls.Certificate
}

// newKeyPair loads the pair once, so that a bad file fails the start rather than the first call.
// With name set, the certificate must be valid for that DNS name. Start watches the files.
func newKeyPair(certFile, keyFile, name string) (*keyPair, error) {
	certs, err := certwatcher.New(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: TLS key pair %s, %s: %w", ErrInvalidOptions, certFile, keyFile, err)
	}
	k := &keyPair{certFile: certFile, keyFile: keyFile, certs: certs, name: name}
	cert, _ := certs.GetCertificate(nil)
	if err := k.check(cert); err != nil {
		return nil, fmt.Errorf("%w: TLS key pair %s, %s: %w", ErrInvalidOptions, certFile, keyFile, err)
	}
	k.seen, k.good = cert, cert
	return k, nil
}

// Start watches the files until ctx ends.
func (k *keyPair) Start(ctx context.Context) error {
	if err := k.certs.Start(ctx); err != nil {
		return fmt.Errorf("watch the TLS key pair %s, %s: %w", k.certFile, k.keyFile, err)
	}
	return nil
}

// GetCertificate is the tls.Config hook.
func (k *keyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert, err := k.certs.GetCertificate(nil)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if cert != k.seen {
		k.seen = cert
		if k.check(cert) == nil {
			k.good = cert
		}
	}
	return k.good, nil
}

// check tells whether cert is valid for the name the controller expects of this node's sidecar.
func (k *keyPair) check(cert *tls.Certificate) error {
	if k.name == "" {
		return nil
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return err
		}
	}
	if err := leaf.VerifyHostname(k.name); err != nil {
		return fmt.Errorf("it is not for %q, the name the controller expects of this node's sidecar "+
			"(<--node-name>.<--tls-server-name>, sidecar.tls.serverName of the controller), and the controller would refuse it; "+
			"give each node a certificate of its own: %w", k.name, err)
	}
	return nil
}

// tlsConfig serves the key pair; with clientCAFile, it requires a client certificate signed by
// one of the CAs in it.
func (k *keyPair) tlsConfig(clientCAFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: k.GetCertificate}
	if clientCAFile == "" {
		return cfg, nil
	}
	data, err := os.ReadFile(clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("%w: client CA file (--client-ca-file): %w", ErrInvalidOptions, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%w: client CA file %s (--client-ca-file) holds no PEM certificate", ErrInvalidOptions, clientCAFile)
	}
	cfg.ClientCAs = pool
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	return cfg, nil
}
