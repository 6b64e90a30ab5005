// Package sidecarsigner is the controller's signer of the sidecars' serving certificates: it
// approves and signs the CertificateSigningRequests of signerName
// healerv1alpha1.SidecarSignerName whose requester is a pod of an allowed ServiceAccount running
// on the node the request names, and denies every other one with the reason, with the project's
// CA kept in a Secret that it creates on its first start, or that cert-manager issues and renews
// (CAReloader follows the renewals). It imports none of the controller's
// stages, no sidecar package and not the configuration: the composition root gives it its
// options.
package sidecarsigner

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// CAValidity is how long the CA that LoadOrCreateCA creates is valid.
const CAValidity = 10 * 365 * 24 * time.Hour

// CA is the key pair that signs the sidecars' certificates.
type CA struct {
	// Cert is the CA's certificate.
	Cert *x509.Certificate
	// Key is its private key.
	Key crypto.Signer
	// PEM is Cert, PEM encoded: the bundle the controller's client trusts.
	PEM []byte
}

// Pool returns a pool holding the CA's certificate alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// LoadOrCreateCA reads the CA from the kubernetes.io/tls Secret name in secrets' namespace, or,
// where there is none, creates a new CA and that Secret. Two controllers starting together
// both end with the one that was created first. A Secret that does not hold a CA key pair is an
// error naming it: it is never replaced.
func LoadOrCreateCA(ctx context.Context, secrets typedcorev1.SecretInterface, name string, now time.Time) (*CA, error) {
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		var created *corev1.Secret
		if created, err = newCASecret(name, now); err != nil {
			return nil, err
		}
		s, err = secrets.Create(ctx, created, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			s, err = secrets.Get(ctx, name, metav1.GetOptions{})
		}
		if apierrors.IsForbidden(err) {
			// The chart's sidecarCA.certManager: cert-manager writes the Secret, not us.
			return nil, fmt.Errorf("sidecar CA Secret %s does not exist, and the controller may not create it: "+
				"where cert-manager issues the CA (the chart's sidecarCA.certManager), its Certificate has not written the Secret yet: %w", name, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sidecar CA Secret %s: %w", name, err)
	}
	ca, err := parseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("%w: Secret %s/%s: %w", ErrInvalidCA, s.Namespace, s.Name, err)
	}
	return ca, nil
}

// newCASecret makes a new self-signed CA, valid from now for CAValidity, in a Secret.
func newCASecret(name string, now time.Time) (*corev1.Secret, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "volume-healer sidecar CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "volume-healer", "app.kubernetes.io/component": "sidecar-ca"}},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       certPEM,
			corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
			"ca.crt":                certPEM,
		},
	}, nil
}

// parseCA reads a CA key pair: the first certificate of certPEM must be a CA matching keyPEM.
func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.crt and tls.key: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("tls.crt: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("tls.crt (%q) is not a CA certificate", cert.Subject.CommonName)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("tls.key is a %T, which cannot sign", pair.PrivateKey)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}
