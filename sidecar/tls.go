package sidecar

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"
)

// keyPair serves the certificate in two PEM files and reads them again when either file
// changes, so that a rotated certificate (cert-manager, a projected Secret) is picked up without
// a restart. The files are checked at each TLS handshake; the controller keeps its connections,
// so handshakes are rare.
type keyPair struct {
	certFile, keyFile string
	// name, when set, is the DNS name the certificate must carry: a pair without it is refused at
	// start, and passed over at a reload.
	name string

	mu                sync.Mutex
	cert              *tls.Certificate
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// newKeyPair loads the pair once, so that a bad file fails the start rather than the first call.
// With name set, the certificate must be valid for that DNS name.
func newKeyPair(certFile, keyFile, name string) (*keyPair, error) {
	k := &keyPair{certFile: certFile, keyFile: keyFile, name: name}
	if _, err := k.get(); err != nil {
		return nil, err
	}
	return k, nil
}

// GetCertificate is the tls.Config hook.
func (k *keyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.get()
}

func (k *keyPair) get() (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	cfi, cerr := os.Stat(k.certFile)
	kfi, kerr := os.Stat(k.keyFile)
	if cerr == nil && kerr == nil && k.cert != nil &&
		cfi.ModTime().Equal(k.certMod) && kfi.ModTime().Equal(k.keyMod) &&
		cfi.Size() == k.certSize && kfi.Size() == k.keySize {
		return k.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err == nil && k.name != "" {
		err = cert.Leaf.VerifyHostname(k.name)
		if err != nil {
			err = fmt.Errorf("it is not for %q, the name the controller expects of this node's sidecar "+
				"(<--node-name>.<--tls-server-name>, sidecar.tls.serverName of the controller), and the controller would refuse it; "+
				"give each node a certificate of its own: %w", k.name, err)
		}
	}
	if err != nil {
		if k.cert != nil {
			// Mid-rotation one file may be new and the other old: keep serving the last good pair.
			return k.cert, nil
		}
		return nil, fmt.Errorf("%w: TLS key pair %s, %s: %w", ErrInvalidOptions, k.certFile, k.keyFile, err)
	}
	k.cert = &cert
	if cerr == nil && kerr == nil {
		k.certMod, k.keyMod = cfi.ModTime(), kfi.ModTime()
		k.certSize, k.keySize = cfi.Size(), kfi.Size()
	}
	return k.cert, nil
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
