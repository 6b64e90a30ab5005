package sidecar_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// TestServingCertificatesRenewalDecision: at start, a key pair left in the folder by the
// container's last run is served while it is not due for renewal (two thirds of its validity),
// without a request; past that point, or for another node's name, a new certificate is asked for.
func TestServingCertificatesRenewalDecision(t *testing.T) {
	ca, err := harness.NewCA("sidecar CA")
	if err != nil {
		t.Fatal(err)
	}
	// Valid from an hour ago to an hour from now: due for renewal 20 minutes from now.
	certPEM, keyPEM, err := ca.Issue("node-a.healer-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	errAsked := errors.New("asked for a certificate")
	for name, tc := range map[string]struct {
		node  string
		after time.Duration
		asks  bool
	}{
		"not yet due":       {"node-a", 10 * time.Minute, false},
		"due":               {"node-a", 30 * time.Minute, true},
		"another node's":    {"node-b", 0, true},
		"no pair in folder": {"", 0, true},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			node := tc.node
			if node != "" {
				for file, data := range map[string][]byte{sidecar.RequestedCertFile: certPEM, sidecar.RequestedKeyFile: keyPEM} {
					if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				node = "node-a"
			}
			cs := fake.NewClientset()
			cs.PrependReactor("create", "certificatesigningrequests", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, errAsked
			})
			certs, err := sidecar.NewServingCertificates(sidecar.CertificateRequestOptions{
				Requests:   cs.CertificatesV1().CertificateSigningRequests(),
				NodeName:   node,
				ServerName: "healer-sidecar",
				Dir:        dir,
				Clock:      clocktesting.NewFakeClock(time.Now().Add(tc.after)),
			})
			if err != nil {
				t.Fatal(err)
			}
			err = certs.Ensure(context.Background())
			if asked := errors.Is(err, errAsked); asked != tc.asks || (!tc.asks && err != nil) {
				t.Fatalf("Ensure: %v; want a request %v", err, tc.asks)
			}
			if !tc.asks && !certs.RenewAt().After(time.Now()) {
				t.Errorf("renewal at %s, want two thirds into the served certificate, after now", certs.RenewAt())
			}
		})
	}
}

// TestServingCertificatesOptions: options that cannot ask for a certificate are refused, naming
// the flag to set.
func TestServingCertificatesOptions(t *testing.T) {
	requests := fake.NewClientset().CertificatesV1().CertificateSigningRequests()
	valid := sidecar.CertificateRequestOptions{Requests: requests, NodeName: "node-a", ServerName: "healer-sidecar", Dir: t.TempDir()}
	for name, tc := range map[string]struct {
		mutate func(*sidecar.CertificateRequestOptions)
		want   string
	}{
		"no server name":     {func(o *sidecar.CertificateRequestOptions) { o.ServerName = "" }, "--tls-server-name"},
		"no folder":          {func(o *sidecar.CertificateRequestOptions) { o.Dir = "" }, "--tls-cert-dir"},
		"no node":            {func(o *sidecar.CertificateRequestOptions) { o.NodeName = "" }, "--node-name"},
		"validity under 10m": {func(o *sidecar.CertificateRequestOptions) { o.Validity = 5 * time.Minute }, "under 10m"},
	} {
		t.Run(name, func(t *testing.T) {
			o := valid
			tc.mutate(&o)
			_, err := sidecar.NewServingCertificates(o)
			if !errors.Is(err, sidecar.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrInvalidOptions naming %s", err, tc.want)
			}
		})
	}
	if _, err := sidecar.NewServingCertificates(valid); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

// TestServingCertificateReadSoonAfterTheRequest: the controller's signer answers a request within
// a moment, and the sidecar writes its restart marker only once it serves: the request is read
// again 50ms after it was made, not a whole poll interval later, so that a node plugin's new
// pod announces its start without waiting out a second.
func TestServingCertificateReadSoonAfterTheRequest(t *testing.T) {
	ca, err := harness.NewCA("sidecar CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := ca.Issue("node-a.healer-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset()
	var gets atomic.Int32
	// The signer has signed by the second read.
	cs.PrependReactor("get", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if gets.Add(1) < 2 {
			return false, nil, nil
		}
		obj, err := cs.Tracker().Get(certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests"), "", a.(k8stesting.GetAction).GetName())
		if err != nil {
			return true, nil, err
		}
		csr := obj.(*certificatesv1.CertificateSigningRequest).DeepCopy()
		csr.Status.Certificate = certPEM
		return true, csr, nil
	})
	fc := clocktesting.NewFakeClock(time.Now())
	certs, err := sidecar.NewServingCertificates(sidecar.CertificateRequestOptions{
		Requests:   cs.CertificatesV1().CertificateSigningRequests(),
		NodeName:   "node-a",
		ServerName: "healer-sidecar",
		Dir:        t.TempDir(),
		Clock:      fc,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- certs.Obtain(t.Context()) }()
	poll.Eventually(t, 5*time.Second, "the request read once and a wait begun", poll.True(func() bool {
		return gets.Load() == 1 && fc.HasWaiters()
	}))
	fc.Step(60 * time.Millisecond)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Obtain: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("60ms after the request, the signed request was not read again (%d reads): the sidecar waits out a longer poll before it serves", gets.Load())
	}
}
