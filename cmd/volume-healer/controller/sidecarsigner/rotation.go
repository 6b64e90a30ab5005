package sidecarsigner

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultReloadInterval is how often a CAReloader reads its Secret again unless told otherwise.
const DefaultReloadInterval = time.Minute

// maxRetired bounds how many replaced CAs a CAReloader keeps trusting at once: a CA renewed more
// often than that within one certificate validity loses the oldest first.
const maxRetired = 4

// CAReloader keeps the CA of the sidecars' certificates in step with its Secret, which someone
// else may renew (cert-manager, with the chart's sidecarCA.certManager): it reads the Secret again
// every interval (Start), signs with the newest CA it read (Current) and trusts, besides it, each
// CA it replaced for as long as a certificate that CA signed may still be valid (Pool). A Secret
// that can no longer be read or holds no CA key pair leaves the last good CA in use, and each
// failed read is logged with the Secret's name. Its methods are safe for concurrent use.
type CAReloader struct {
	secrets   typedcorev1.SecretInterface
	namespace string
	name      string
	interval  time.Duration
	leafLife  time.Duration
	clock     clock.PassiveClock

	mu      sync.RWMutex
	current *CA
	retired []retiredCA
	lastErr error
}

// retiredCA is a CA replaced in its Secret, trusted until until.
type retiredCA struct {
	ca    *CA
	until time.Time
}

// ReloaderOptions configure a CAReloader.
type ReloaderOptions struct {
	// Secrets reads the Secret, in its namespace. Required.
	Secrets typedcorev1.SecretInterface
	// Namespace and Name name the kubernetes.io/tls Secret of the CA. Required.
	Namespace, Name string
	// Initial is the CA read at start (LoadOrCreateCA). Required.
	Initial *CA
	// LeafValidity is the longest validity of a certificate the CA signs (the signer's
	// Validity): a replaced CA is trusted that long after it was replaced, or until it expires,
	// whichever comes first. Default: DefaultValidity.
	LeafValidity time.Duration
	// Interval is how often the Secret is read again. Default: DefaultReloadInterval.
	Interval time.Duration
	// Clock dates the replacements. Default: the real clock.
	Clock clock.PassiveClock
}

// NewCAReloader checks opts and makes a CAReloader.
func NewCAReloader(opts ReloaderOptions) (*CAReloader, error) {
	switch {
	case opts.Secrets == nil:
		return nil, fmt.Errorf("%w: no Secret client for the CA", ErrInvalidOptions)
	case opts.Name == "":
		return nil, fmt.Errorf("%w: no CA Secret name", ErrInvalidOptions)
	case opts.Initial == nil:
		return nil, fmt.Errorf("%w: no initial CA of Secret %s/%s", ErrInvalidOptions, opts.Namespace, opts.Name)
	case opts.Interval < 0 || opts.LeafValidity < 0:
		return nil, fmt.Errorf("%w: negative reload interval %s or certificate validity %s", ErrInvalidOptions, opts.Interval, opts.LeafValidity)
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultReloadInterval
	}
	if opts.LeafValidity == 0 {
		opts.LeafValidity = DefaultValidity
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &CAReloader{
		secrets: opts.Secrets, namespace: opts.Namespace, name: opts.Name,
		interval: opts.Interval, leafLife: opts.LeafValidity, clock: opts.Clock,
		current: opts.Initial,
	}, nil
}

// Current returns the CA that signs: the newest good one read from the Secret.
func (r *CAReloader) Current() *CA {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.current
}

// Pool returns a new pool of the CAs to trust now: the current one and the replaced ones whose
// certificates may still be valid.
func (r *CAReloader) Pool() *x509.CertPool {
	now := r.clock.Now()
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := x509.NewCertPool()
	p.AddCert(r.current.Cert)
	for _, old := range r.retired {
		if now.Before(old.until) {
			p.AddCert(old.ca.Cert)
		}
	}
	return p
}

// Err returns the error of the last read of the Secret, nil when it gave a good CA.
func (r *CAReloader) Err() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.lastErr
}

// Reload reads the Secret once. A CA other than the current one becomes current, and the
// replaced one is trusted on (Pool); the same CA changes nothing. An error (the Secret cannot be
// read, or holds no CA key pair) names the Secret and leaves the CAs as they were.
func (r *CAReloader) Reload(ctx context.Context) (changed bool, err error) {
	defer func() {
		r.mu.Lock()
		r.lastErr = err
		r.mu.Unlock()
	}()
	s, err := r.secrets.Get(ctx, r.name, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read the sidecar CA Secret %s/%s: %w", r.namespace, r.name, err)
	}
	ca, err := parseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return false, fmt.Errorf("%w: Secret %s/%s: %w", ErrInvalidCA, r.namespace, r.name, err)
	}
	now := r.clock.Now()
	if !now.Before(ca.Cert.NotAfter) {
		return false, fmt.Errorf("%w: Secret %s/%s: its certificate %q expired at %s", ErrInvalidCA, r.namespace, r.name,
			ca.Cert.Subject.CommonName, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if bytes.Equal(ca.Cert.Raw, r.current.Cert.Raw) {
		// The same certificate, so the same key: parseCA checked that the key is the certificate's.
		return false, nil
	}
	until := now.Add(r.leafLife)
	if r.current.Cert.NotAfter.Before(until) {
		until = r.current.Cert.NotAfter
	}
	kept := []retiredCA{{ca: r.current, until: until}}
	for _, old := range r.retired {
		if now.Before(old.until) && !bytes.Equal(old.ca.Cert.Raw, ca.Cert.Raw) && len(kept) < maxRetired {
			kept = append(kept, old)
		}
	}
	r.current, r.retired = ca, kept
	return true, nil
}

// Start reads the Secret every interval, each read bounded by the interval, until ctx ends. It
// runs on every replica: each one's client trusts the sidecars by Pool.
func (r *CAReloader) Start(ctx context.Context) error {
	log := klog.FromContext(ctx).WithName("sidecar-ca").WithValues("secret", r.namespace+"/"+r.name)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		readCtx, cancel := context.WithTimeout(ctx, r.interval)
		changed, err := r.Reload(readCtx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			cur := r.Current().Cert
			log.Error(err, "The sidecar CA Secret is unusable; signing with and trusting the last good CA",
				"ca", cur.Subject.CommonName, "caNotAfter", cur.NotAfter.UTC().Format(time.RFC3339))
		case changed:
			cur := r.Current().Cert
			log.Info("The sidecar CA was renewed; signing with the new CA, trusting the replaced one until its certificates expire",
				"ca", cur.Subject.CommonName, "caSerial", cur.SerialNumber.String(), "caNotAfter", cur.NotAfter.UTC().Format(time.RFC3339))
		}
	}
}
