package cluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// caValidity is how long the cluster's CA and its certificates stay valid: a held demo runs for
// hours.
const caValidity = 48 * time.Hour

// issue writes <dir>/<name>.crt and <name>.key, a certificate of ca for id, and returns their
// paths.
func issue(ca *harness.CA, dir, name string, id harness.Identity) (certPath, keyPath string, err error) {
	certPEM, keyPEM, err := ca.IssueFor(id)
	if err != nil {
		return "", "", fmt.Errorf("certificate %s: %w", name, err)
	}
	certPath, keyPath = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// writeServiceAccountKey writes the RSA key pair that signs and checks ServiceAccount tokens.
func writeServiceAccountKey(dir string) (privPath, pubPath string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	privPath, pubPath = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(privPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return "", "", err
	}
	return privPath, pubPath, nil
}

// kubeconfig writes a kubeconfig for the client certificate at certPath/keyPath.
func kubeconfig(path, server, caPath, certPath, keyPath string) error {
	const tmpl = `apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: user
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: local
  context:
    cluster: local
    user: user
current-context: local
`
	return os.WriteFile(path, fmt.Appendf(nil, tmpl, server, caPath, certPath, keyPath), 0o600)
}

// parseIPs parses IP addresses that are known to be valid.
func parseIPs(addrs ...string) []net.IP {
	ips := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip)
		}
	}
	return ips
}
