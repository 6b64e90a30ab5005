package sidecarsigner_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller/sidecarsigner"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

const (
	rotNamespace = "volume-healer"
	rotSecret    = "volume-healer-sidecar-ca"
)

// testCA is a CA as cert-manager writes it into its Secret.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	data map[string][]byte
}

func newTestCA(t *testing.T, cn string, notBefore, notAfter time.Time) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &testCA{cert: cert, key: key, data: map[string][]byte{
		corev1.TLSCertKey:       certPEM,
		corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":                certPEM,
	}}
}

// issue signs a sidecar serving certificate for dnsName, valid from notBefore for a day.
func (ca *testCA) issue(t *testing.T, dnsName string, notBefore time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: notBefore, NotAfter: notBefore.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func setSecret(t *testing.T, secrets typedcorev1.SecretInterface, data map[string][]byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: rotSecret, Namespace: rotNamespace}, Type: corev1.SecretTypeTLS, Data: data}
	if _, err := secrets.Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// trusted tells whether a client verifying with pool at when accepts leaf for dnsName.
func trusted(pool *x509.CertPool, leaf *x509.Certificate, dnsName string, when time.Time) error {
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: dnsName, CurrentTime: when})
	return err
}

// reloaderWorld is a CA Secret first written by cert-manager, read at start, and its reloader.
type reloaderWorld struct {
	cs       *fake.Clientset
	secrets  typedcorev1.SecretInterface
	clock    *clocktesting.FakePassiveClock
	first    *testCA
	reloader *sidecarsigner.CAReloader
}

func newReloaderWorld(t *testing.T, interval time.Duration) *reloaderWorld {
	t.Helper()
	now := time.Now()
	first := newTestCA(t, "volume-healer sidecar CA", now.Add(-time.Hour), now.Add(90*24*time.Hour))
	cs := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: rotSecret, Namespace: rotNamespace}, Type: corev1.SecretTypeTLS, Data: first.data})
	secrets := cs.CoreV1().Secrets(rotNamespace)
	ca, err := sidecarsigner.LoadOrCreateCA(context.Background(), secrets, rotSecret, now)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.Equal(first.cert) {
		t.Fatal("LoadOrCreateCA did not take the CA already in the Secret")
	}
	clk := clocktesting.NewFakePassiveClock(now)
	r, err := sidecarsigner.NewCAReloader(sidecarsigner.ReloaderOptions{
		Secrets: secrets, Namespace: rotNamespace, Name: rotSecret, Initial: ca,
		LeafValidity: 24 * time.Hour, Interval: interval, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &reloaderWorld{cs: cs, secrets: secrets, clock: clk, first: first, reloader: r}
}

// TestCAReloaderTakesTheRenewedCAAndTrustsTheOldOne: cert-manager renews the CA in its Secret; the
// next read signs with the new CA, and the client still trusts the sidecars' certificates of the
// old one until they may have expired, then no more.
func TestCAReloaderTakesTheRenewedCAAndTrustsTheOldOne(t *testing.T) {
	w := newReloaderWorld(t, time.Minute)
	ctx := context.Background()
	now := w.clock.Now()
	const name = "node-a.healer-sidecar"
	oldLeaf := w.first.issue(t, name, now.Add(-time.Minute))

	if changed, err := w.reloader.Reload(ctx); err != nil || changed {
		t.Fatalf("reading the unchanged Secret: changed %v, %v; want nothing changed", changed, err)
	}
	renewed := newTestCA(t, "volume-healer sidecar CA", now, now.Add(90*24*time.Hour))
	setSecret(t, w.secrets, renewed.data)
	changed, err := w.reloader.Reload(ctx)
	if err != nil || !changed {
		t.Fatalf("reading the renewed Secret: changed %v, %v; want the new CA", changed, err)
	}
	if !w.reloader.Current().Cert.Equal(renewed.cert) {
		t.Fatalf("signing with %q serial %s, want the renewed CA", w.reloader.Current().Cert.Subject.CommonName, w.reloader.Current().Cert.SerialNumber)
	}
	newLeaf := renewed.issue(t, name, now)
	stranger := newTestCA(t, "another CA", now.Add(-time.Hour), now.Add(time.Hour)).issue(t, name, now)
	pool := w.reloader.Pool()
	if err := trusted(pool, oldLeaf, name, now); err != nil {
		t.Errorf("a sidecar certificate of the replaced CA is no longer trusted: %v", err)
	}
	if err := trusted(pool, newLeaf, name, now); err != nil {
		t.Errorf("a sidecar certificate of the renewed CA is not trusted: %v", err)
	}
	if err := trusted(pool, stranger, name, now); err == nil {
		t.Error("a certificate of another CA is trusted")
	}

	// Past the longest validity of a certificate the old CA signed, it is trusted no more.
	w.clock.SetTime(now.Add(25 * time.Hour))
	pool = w.reloader.Pool()
	if err := trusted(pool, oldLeaf, name, now); err == nil {
		t.Error("the replaced CA is still trusted after every certificate it signed expired")
	}
	if err := trusted(pool, newLeaf, name, now); err != nil {
		t.Errorf("the renewed CA is no longer trusted: %v", err)
	}
}

// TestCAReloaderKeepsTheLastGoodCA: a Secret emptied, broken or deleted leaves the last good CA
// signing and trusted, with an error naming the Secret; Start logs it.
func TestCAReloaderKeepsTheLastGoodCA(t *testing.T) {
	w := newReloaderWorld(t, 20*time.Millisecond)
	ctx := context.Background()
	now := w.clock.Now()
	leaf := w.first.issue(t, "node-a.healer-sidecar", now)
	for name, breakIt := range map[string]func(){
		"no key": func() { setSecret(t, w.secrets, map[string][]byte{corev1.TLSCertKey: w.first.data[corev1.TLSCertKey]}) },
		"another CA's key": func() {
			other := newTestCA(t, "x", now, now.Add(time.Hour))
			setSecret(t, w.secrets, map[string][]byte{corev1.TLSCertKey: w.first.data[corev1.TLSCertKey], corev1.TLSPrivateKeyKey: other.data[corev1.TLSPrivateKeyKey]})
		},
		"not a CA": func() {
			leafKey, _ := x509.MarshalPKCS8PrivateKey(w.first.key)
			setSecret(t, w.secrets, map[string][]byte{
				corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}),
				corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: leafKey}),
			})
		},
		"expired": func() {
			setSecret(t, w.secrets, newTestCA(t, "expired CA", now.Add(-48*time.Hour), now.Add(-24*time.Hour)).data)
		},
	} {
		breakIt()
		changed, err := w.reloader.Reload(ctx)
		if changed || !errors.Is(err, sidecarsigner.ErrInvalidCA) || !strings.Contains(err.Error(), rotNamespace+"/"+rotSecret) {
			t.Errorf("%s: changed %v, %v; want ErrInvalidCA naming %s/%s", name, changed, err, rotNamespace, rotSecret)
		}
		if !w.reloader.Current().Cert.Equal(w.first.cert) || w.reloader.Err() == nil {
			t.Errorf("%s: the last good CA is no longer the one signing, or no error is kept (%v)", name, w.reloader.Err())
		}
		if err := trusted(w.reloader.Pool(), leaf, "node-a.healer-sidecar", now); err != nil {
			t.Errorf("%s: the last good CA's sidecar certificate is no longer trusted: %v", name, err)
		}
	}

	// Deleted: an error naming it, and Start logs it while the old CA stays.
	if err := w.secrets.Delete(ctx, rotSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logged bytes.Buffer
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged.WriteString(prefix + " " + args + "\n")
	}, funcr.Options{})
	runCtx, cancel := context.WithCancel(klog.NewContext(ctx, logger))
	done := make(chan error, 1)
	go func() { done <- w.reloader.Start(runCtx) }()
	poll.Eventually(t, 5*time.Second, "the unusable Secret logged", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logged.String(), "The sidecar CA Secret is unusable") &&
			strings.Contains(logged.String(), rotNamespace+"/"+rotSecret) && strings.Contains(logged.String(), "not found"), logged.String()
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !w.reloader.Current().Cert.Equal(w.first.cert) {
		t.Error("a deleted Secret replaced the last good CA")
	}
}

// TestSignerSignsWithTheRenewedCA: once the reloader read the renewed CA, the signer signs the
// next sidecar request with it.
func TestSignerSignsWithTheRenewedCA(t *testing.T) {
	w := newReloaderWorld(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	requester := "system:serviceaccount:" + pluginNamespace + ":" + pluginSA
	signer, err := sidecarsigner.New(sidecarsigner.Options{Client: w.cs, CAs: w.reloader, ServerName: serverName, Requesters: []string{requester}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = signer.Start(ctx) }()
	renewed := newTestCA(t, "volume-healer sidecar CA", w.clock.Now(), w.clock.Now().Add(90*24*time.Hour))
	setSecret(t, w.secrets, renewed.data)
	if _, err := w.reloader.Reload(ctx); err != nil {
		t.Fatal(err)
	}

	const node = "node-a"
	if _, err := w.cs.CoreV1().Pods(pluginNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin-a", Namespace: pluginNamespace, UID: types.UID("uid-a")},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dnsName := healerv1alpha1.SidecarDNSName(node, serverName)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: healerv1alpha1.SidecarCommonNamePrefix + node}, DNSNames: []string{dnsName}}, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.cs.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "sidecar-node-a"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: healerv1alpha1.SidecarSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
			Username:   requester,
			Extra: map[string]certificatesv1.ExtraValue{
				"authentication.kubernetes.io/pod-name": {"plugin-a"},
				"authentication.kubernetes.io/pod-uid":  {"uid-a"},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var issued *x509.Certificate
	poll.Eventually(t, 20*time.Second, "the request signed", func() (bool, string) {
		csr, err := w.cs.CertificatesV1().CertificateSigningRequests().Get(ctx, "sidecar-node-a", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		block, _ := pem.Decode(csr.Status.Certificate)
		if block == nil {
			return false, "no certificate yet"
		}
		issued, err = x509.ParseCertificate(block.Bytes)
		return err == nil, "certificate: " + errString(err)
	})
	pool := x509.NewCertPool()
	pool.AddCert(renewed.cert)
	if err := trusted(pool, issued, dnsName, w.clock.Now()); err != nil {
		t.Errorf("the certificate signed after the renewal is not the renewed CA's: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestMissingCASecretThatCannotBeCreatedNamesIt: with cert-manager issuing the CA, the controller
// may not create the Secret; before cert-manager wrote it, the error says which Secret and why.
func TestMissingCASecretThatCannotBeCreatedNamesIt(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("no create verb"))
	})
	_, err := sidecarsigner.LoadOrCreateCA(context.Background(), cs.CoreV1().Secrets(rotNamespace), rotSecret, time.Now())
	if err == nil || !strings.Contains(err.Error(), rotSecret) || !strings.Contains(err.Error(), "sidecarCA.certManager") {
		t.Fatalf("a missing CA Secret the controller may not create: %v; want an error naming it and cert-manager", err)
	}
}
