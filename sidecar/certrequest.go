package sidecar

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcertificatesv1 "k8s.io/client-go/kubernetes/typed/certificates/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// The files ServingCertificates writes in its folder.
const (
	// RequestedCertFile is the certificate's file name.
	RequestedCertFile = "tls.crt"
	// RequestedKeyFile is the key's file name.
	RequestedKeyFile = "tls.key"
)

// Defaults of CertificateRequestOptions.
const (
	// DefaultCertificateWait bounds the wait for a request to be signed.
	DefaultCertificateWait = 2 * time.Minute
	// DefaultCertificatePoll is the longest wait between two reads of a pending request.
	DefaultCertificatePoll = time.Second
)

// CertificateRequestOptions configure ServingCertificates.
type CertificateRequestOptions struct {
	// Requests creates and reads the CertificateSigningRequests. Required.
	Requests typedcertificatesv1.CertificateSigningRequestInterface
	// NodeName is the node the certificate names. Required.
	NodeName string
	// ServerName is the base of the DNS name (the controller's sidecar.tls.serverName): the
	// certificate is for healerv1alpha1.SidecarDNSName(NodeName, ServerName). Required.
	ServerName string
	// Dir is where the key and certificate are written, RequestedKeyFile and RequestedCertFile;
	// an emptyDir, never a folder of the node: the key never leaves the pod. Required.
	Dir string
	// Validity, when set, is asked for as spec.expirationSeconds (at least 10 minutes, the API
	// server's floor); the signer may give less. Default: the signer's.
	Validity time.Duration
	// Wait bounds each wait for a request to be signed. Default: DefaultCertificateWait.
	Wait time.Duration
	// Poll is the longest wait between two reads of a pending request: the first read again
	// comes after 50ms, each next one twice as long after the one before, up to Poll. Default:
	// DefaultCertificatePoll.
	Poll time.Duration
	// Clock times the renewals. Default: the real clock.
	Clock clock.WithTicker
}

// ServingCertificates keeps the sidecar's serving certificate: Obtain asks for a first one with a
// CertificateSigningRequest of signerName healerv1alpha1.SidecarSignerName, with a new key, and
// writes both to Dir; Run asks for a new one when two thirds of the current one's validity have
// passed. The server reads the files with the certificate watcher it uses for files given by
// the operator, so a renewed certificate is served without a restart.
type ServingCertificates struct {
	opts CertificateRequestOptions
	// notBefore and notAfter bound the certificate last written.
	notBefore, notAfter time.Time
}

// NewServingCertificates checks opts.
func NewServingCertificates(opts CertificateRequestOptions) (*ServingCertificates, error) {
	switch {
	case opts.Requests == nil:
		return nil, fmt.Errorf("%w: certificate requests: no client", ErrInvalidOptions)
	case opts.NodeName == "":
		return nil, fmt.Errorf("%w: certificate requests: no node name (--node-name)", ErrInvalidOptions)
	case opts.ServerName == "":
		return nil, fmt.Errorf("%w: certificate requests need the base of the server name (--tls-server-name, the controller's sidecar.tls.serverName)", ErrInvalidOptions)
	case opts.Dir == "":
		return nil, fmt.Errorf("%w: certificate requests need a folder for the key and certificate (--tls-cert-dir, an emptyDir)", ErrInvalidOptions)
	case opts.Validity != 0 && opts.Validity < 10*time.Minute:
		return nil, fmt.Errorf("%w: certificate validity %s is under 10m, the API server's least spec.expirationSeconds", ErrInvalidOptions, opts.Validity)
	}
	if opts.Wait == 0 {
		opts.Wait = DefaultCertificateWait
	}
	if opts.Poll == 0 {
		opts.Poll = DefaultCertificatePoll
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &ServingCertificates{opts: opts}, nil
}

// CertFile is the path of the certificate, for Options.TLSCertFile.
func (c *ServingCertificates) CertFile() string { return filepath.Join(c.opts.Dir, RequestedCertFile) }

// KeyFile is the path of the key, for Options.TLSKeyFile.
func (c *ServingCertificates) KeyFile() string { return filepath.Join(c.opts.Dir, RequestedKeyFile) }

// RenewAt is when Run asks for the next certificate: two thirds into the current one's validity.
func (c *ServingCertificates) RenewAt() time.Time {
	return c.notBefore.Add(c.notAfter.Sub(c.notBefore) * 2 / 3)
}

// Ensure serves the key and certificate already in Dir when they are a pair for this node's name
// that is not yet due for renewal (the container restarted, the pod did not), and otherwise
// obtains new ones.
func (c *ServingCertificates) Ensure(ctx context.Context) error {
	pair, err := tls.LoadX509KeyPair(c.CertFile(), c.KeyFile())
	if err == nil {
		cert := pair.Leaf
		dnsName := healerv1alpha1.SidecarDNSName(c.opts.NodeName, c.opts.ServerName)
		if cert != nil && cert.VerifyHostname(dnsName) == nil {
			c.notBefore, c.notAfter = cert.NotBefore, cert.NotAfter
			if c.opts.Clock.Now().Before(c.RenewAt()) {
				klog.FromContext(ctx).Info("Serving the certificate already obtained", "name", dnsName, "notAfter", cert.NotAfter, "renewAt", c.RenewAt())
				return nil
			}
		}
	}
	return c.Obtain(ctx)
}

// Obtain asks for a certificate with a new key, waits until it is signed (or denied, or Wait
// passes), and writes the key and certificate to Dir.
func (c *ServingCertificates) Obtain(ctx context.Context) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	dnsName := healerv1alpha1.SidecarDNSName(c.opts.NodeName, c.opts.ServerName)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: healerv1alpha1.SidecarCommonName(c.opts.NodeName)},
		DNSNames: []string{dnsName},
	}, key)
	if err != nil {
		return err
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "volume-healer-sidecar-" + c.opts.NodeName + "-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: healerv1alpha1.SidecarSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	}
	if c.opts.Validity > 0 {
		seconds := int32(c.opts.Validity / time.Second)
		csr.Spec.ExpirationSeconds = &seconds
	}
	created, err := c.opts.Requests.Create(ctx, csr, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create a CertificateSigningRequest for %s: %w", dnsName, err)
	}
	log := klog.FromContext(ctx).WithValues("csr", created.Name)
	log.Info("Asked for a serving certificate", "name", dnsName, "signerName", healerv1alpha1.SidecarSignerName)
	certPEM, err := c.wait(ctx, created.Name)
	if err != nil {
		return err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return fmt.Errorf("CertificateSigningRequest %s: status.certificate is not PEM", created.Name)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("CertificateSigningRequest %s: status.certificate: %w", created.Name, err)
	}
	if err := cert.VerifyHostname(dnsName); err != nil {
		return fmt.Errorf("CertificateSigningRequest %s: the signed certificate is not for %s: %w", created.Name, dnsName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	// The key first: until the certificate follows, the watcher fails to load the pair and keeps
	// serving the last one that loaded.
	if err := writeFileAtomic(c.KeyFile(), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return err
	}
	if err := writeFileAtomic(c.CertFile(), certPEM); err != nil {
		return err
	}
	c.notBefore, c.notAfter = cert.NotBefore, cert.NotAfter
	log.Info("Got a serving certificate", "name", dnsName, "notAfter", cert.NotAfter, "renewAt", c.RenewAt())
	return nil
}

// firstCertificatePoll is the wait before the first read again of a new request: the
// controller's signer answers within a moment, and the sidecar writes its restart marker only
// once it serves, so each read waits twice as long as the one before, from this up to Poll.
const firstCertificatePoll = 50 * time.Millisecond

// wait polls the request until it holds a certificate, is denied or failed, or Wait passes.
func (c *ServingCertificates) wait(ctx context.Context, name string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Wait)
	defer cancel()
	poll := min(firstCertificatePoll, c.opts.Poll)
	for {
		csr, err := c.opts.Requests.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, cond := range csr.Status.Conditions {
				if (cond.Type == certificatesv1.CertificateDenied || cond.Type == certificatesv1.CertificateFailed) && cond.Status == corev1.ConditionTrue {
					return nil, fmt.Errorf("%w: CertificateSigningRequest %s was %s (%s): %s", ErrCertificateRefused, name, cond.Type, cond.Reason, cond.Message)
				}
			}
			if len(csr.Status.Certificate) > 0 {
				return csr.Status.Certificate, nil
			}
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("%w: CertificateSigningRequest %s was not signed within %s (is the controller's signer on, and does it allow this pod's ServiceAccount?): %w",
				ErrCertificateRefused, name, c.opts.Wait, err)
		case <-c.opts.Clock.After(poll):
		}
		poll = min(2*poll, c.opts.Poll)
	}
}

// Run renews the certificate two thirds into its validity, until ctx ends. A failed renewal is
// tried again, after 10 seconds and then twice as long each time up to 5 minutes, while the
// current certificate keeps being served.
func (c *ServingCertificates) Run(ctx context.Context) error {
	log := klog.FromContext(ctx)
	for {
		if err := c.sleepUntil(ctx, c.RenewAt()); err != nil {
			return nil
		}
		for backoff := 10 * time.Second; ; backoff = min(2*backoff, 5*time.Minute) {
			err := c.Obtain(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			log.Error(err, "Renewing the serving certificate; trying again", "in", backoff, "notAfter", c.notAfter)
			if c.sleepUntil(ctx, c.opts.Clock.Now().Add(backoff)) != nil {
				return nil
			}
		}
	}
}

func (c *ServingCertificates) sleepUntil(ctx context.Context, t time.Time) error {
	d := t.Sub(c.opts.Clock.Now())
	if d <= 0 {
		return ctx.Err()
	}
	timer := c.opts.Clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C():
		return nil
	}
}

// writeFileAtomic replaces path with data, readable by its owner alone, through a rename so
// that a reader never sees half a file.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
