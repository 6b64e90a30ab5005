package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volume-healer/volume-healer/test/harness"
)

// allowAll stands in for the policy source in tests of the transport.
type allowAll struct{}

func (allowAll) Check(context.Context, *corev1.ConfigMap, *corev1.ConfigMap) error { return nil }

// writeKeyPair writes a new self-signed certificate for 127.0.0.1 to dir and returns it as the
// CA a client trusts.
func writeKeyPair(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	certPEM, keyPEM, err := harness.SelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// Written next to their place and renamed, as the kubelet swaps a Secret's files.
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return pool
}

// TestServerServesReviewsOverTLS runs the server as the controller does: it answers a review over
// HTTPS on Path, serves a renewed certificate without a restart, reports ready while it listens,
// and stops with its context.
func TestServerServesReviewsOverTLS(t *testing.T) {
	dir := t.TempDir()
	first := writeKeyPair(t, dir)
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(Options{Addr: addr, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), Checker: allowAll{}})
	if err != nil {
		t.Fatal(err)
	}
	if srv.NeedLeaderElection() {
		t.Error("the webhook would run on the leader only; every replica must answer the API server")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	defer cancel()
	harness.Eventually(t, 10*time.Second, "the webhook to be ready", func() (bool, string) {
		err := srv.Ready(nil)
		return err == nil, fmt.Sprint(err)
	})

	client := func(roots *x509.CertPool) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}}
	}
	review := reviewOf(t, admissionv1.Create, metav1.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, policyConfigMap("site-policy", goodPolicy), nil)
	send := func(c *http.Client) (*admissionv1.AdmissionReview, error) {
		resp, err := c.Post("https://"+addr+Path+"?timeout=5s", "application/json", bytes.NewReader(review))
		if err != nil {
			return nil, err
		}
		defer func() { _ = resp.Body.Close() }()
		var got admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			return nil, err
		}
		return &got, nil
	}
	got, err := send(client(first))
	if err != nil || got.Response == nil || !got.Response.Allowed {
		t.Fatalf("review over TLS: %+v, %v; want it allowed", got, err)
	}
	if _, err := send(client(x509.NewCertPool())); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client that does not trust the certificate got through: %v", err)
	}

	// The certificate renewed in place: new connections see it, without a restart.
	second := writeKeyPair(t, dir)
	harness.Eventually(t, 30*time.Second, "the renewed certificate to be served", func() (bool, string) {
		_, err := send(client(second))
		return err == nil, fmt.Sprint(err)
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the webhook server did not stop")
	}
	if err := srv.Ready(nil); err == nil {
		t.Error("the stopped webhook still reports ready")
	}
}

// TestNewServerReadsTheCertificate: a missing or broken certificate stops the start, naming the
// files.
func TestNewServerReadsTheCertificate(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Options{
		"missing files":   {Addr: "127.0.0.1:0", CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), Checker: allowAll{}},
		"not PEM":         {Addr: "127.0.0.1:0", CertFile: garbage, KeyFile: garbage, Checker: allowAll{}},
		"no files at all": {Addr: "127.0.0.1:0", Checker: allowAll{}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewServer(o)
			if err == nil {
				t.Fatal("NewServer accepted it")
			}
			if o.CertFile != "" && !strings.Contains(err.Error(), o.CertFile) {
				t.Errorf("%v does not name %s", err, o.CertFile)
			}
		})
	}
}
