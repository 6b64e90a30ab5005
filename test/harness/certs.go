package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"time"
)

// SelfSigned returns a PEM certificate for cn (also its DNS name, or its IP address when cn is
// one, as for a webhook the API server calls at https://127.0.0.1:port), valid from an hour ago
// to an hour from now and signed by its own key, and that PEM key. The certificate is its own CA:
// it is the caBundle of a webhook configuration, or the CA file of a client.
func SelfSigned(cn string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	if ip := net.ParseIP(cn); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{cn}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// CA is a certificate authority for tests: the sidecars' serving certificates, one per node. It is
// not safe for concurrent use.
type CA struct {
	// CertPEM is the CA's certificate, the CA file of a client.
	CertPEM []byte
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	serial  int64
}

// NewCA returns a CA valid from an hour ago to an hour from now.
func NewCA(cn string) (*CA, error) { return NewCAFor(cn, time.Hour) }

// NewCAFor returns a CA valid from an hour ago until validity from now; the certificates it
// issues end with it.
func NewCAFor(cn string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key, serial: 1}, nil
}

// Issue returns a PEM serving certificate for the DNS name dnsName, signed by the CA, and its PEM
// key.
func (ca *CA) Issue(dnsName string) (certPEM, keyPEM []byte, err error) {
	return ca.IssueFor(Identity{Name: dnsName, DNSNames: []string{dnsName}, Server: true})
}

// Identity is what a certificate of the CA says.
type Identity struct {
	// Name is the subject's common name: a client's user name.
	Name string
	// Groups are the subject's organizations: a client's groups.
	Groups []string
	// DNSNames and IPs are the names a server answers for.
	DNSNames []string
	IPs      []net.IP
	// Server makes it a serving certificate, Client a client certificate; both may be set.
	Server, Client bool
}

// IssueFor returns a PEM certificate for id, signed by the CA and valid as long as the CA, and its
// PEM key.
func (ca *CA) IssueFor(id Identity) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	ca.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(ca.serial), Subject: pkix.Name{CommonName: id.Name, Organization: id.Groups},
		DNSNames: id.DNSNames, IPAddresses: id.IPs, NotBefore: time.Now().Add(-time.Hour), NotAfter: ca.cert.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature}
	if id.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if id.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
