package sidecarsigner_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller/sidecarsigner"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.SuiteOptions{
		Name:       "sidecarsigner",
		Skip:       "integration test: starts kube-apiserver and etcd; run without -short",
		Lazy:       true,
		NoPrograms: true,
		Kept:       "the control plane's kubeconfig",
	}))
}

// The node plugins' namespace and ServiceAccount, allowed to ask, and another ServiceAccount of
// that namespace, not allowed, both with the RBAC the chart gives the node plugins.
const (
	pluginNamespace = "csi-plugins"
	pluginSA        = "node-plugin"
	otherSA         = "other-app"
	serverName      = "healer-sidecar"
	caSecret        = "volume-healer-sidecar-ca"
)

// world is the control plane with the signer running, as the controller runs it.
type world struct {
	t        *testing.T
	ctx      context.Context
	cs       kubernetes.Interface
	cfg      *rest.Config
	ca       *sidecarsigner.CA
	recorder *record.FakeRecorder
}

// start starts the signer with validity, allowing the node plugins' ServiceAccount, after
// creating the namespaces, ServiceAccounts and RBAC of the node plugins (once per run).
func start(t *testing.T, validity time.Duration) *world {
	t.Helper()
	return startAllowing(t, validity, "system:serviceaccount:"+pluginNamespace+":"+pluginSA)
}

// startAllowing starts the signer with validity, allowing requesters.
func startAllowing(t *testing.T, validity time.Duration, requesters ...string) *world {
	t.Helper()
	env := harness.Require(t).Env
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cs := env.Clientset
	for _, obj := range []struct {
		create func() error
	}{
		{func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pluginNamespace}}, metav1.CreateOptions{})
			return err
		}},
		{func() error {
			_, err := cs.CoreV1().ServiceAccounts(pluginNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: pluginSA}}, metav1.CreateOptions{})
			return err
		}},
		{func() error {
			_, err := cs.CoreV1().ServiceAccounts(pluginNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: otherSA}}, metav1.CreateOptions{})
			return err
		}},
		{func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "test-sidecar-csr"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
					Verbs: []string{"create", "get"}}},
			}, metav1.CreateOptions{})
			return err
		}},
		{func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "test-sidecar-csr"},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "test-sidecar-csr"},
				Subjects: []rbacv1.Subject{
					{Kind: "ServiceAccount", Namespace: pluginNamespace, Name: pluginSA},
					{Kind: "ServiceAccount", Namespace: pluginNamespace, Name: otherSA},
				},
			}, metav1.CreateOptions{})
			return err
		}},
	} {
		if err := obj.create(); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	secrets := cs.CoreV1().Secrets(harness.ControllerNamespace)
	ca, err := sidecarsigner.LoadOrCreateCA(ctx, secrets, caSecret, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, cs: cs, cfg: env.Config, ca: ca, recorder: record.NewFakeRecorder(100)}
	signer, err := sidecarsigner.New(sidecarsigner.Options{
		Client:     cs,
		CA:         ca,
		ServerName: serverName,
		Requesters: requesters,
		Validity:   validity,
		Recorder:   w.recorder,
	})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(klog.NewContext(ctx, klog.Background()))
	done := make(chan error, 1)
	go func() { done <- signer.Start(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("signer: %v", err)
		}
	})
	return w
}

// podClient returns a client of the ServiceAccount sa with a token bound to a new pod of it on
// node, as the kubelet mounts it into a node plugin pod; bound false gives a token bound to
// nothing.
func (w *world) podClient(sa, node string, bound bool) kubernetes.Interface {
	w.t.Helper()
	if _, err := w.cs.CoreV1().Nodes().Create(w.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatal(err)
	}
	req := &authenticationv1.TokenRequest{}
	if bound {
		pod, err := w.cs.CoreV1().Pods(pluginNamespace).Create(w.ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: sa + "-"},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: new(bool),
				Containers: []corev1.Container{{Name: "healer-sidecar", Image: "healer-sidecar"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			w.t.Fatal(err)
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := w.cs.CoreV1().ServiceAccounts(pluginNamespace).CreateToken(w.ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(w.cfg)
	cfg.BearerToken = tok.Status.Token
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	return cs
}

// certificates returns the sidecar's certificate keeper for node, asking with cs.
func (w *world) certificates(cs kubernetes.Interface, node string) *sidecar.ServingCertificates {
	w.t.Helper()
	c, err := sidecar.NewServingCertificates(sidecar.CertificateRequestOptions{
		Requests:   cs.CertificatesV1().CertificateSigningRequests(),
		NodeName:   node,
		ServerName: serverName,
		Dir:        w.t.TempDir(),
		Wait:       30 * time.Second,
		Poll:       100 * time.Millisecond,
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

// event waits for an Event of the signer that holds every one of parts.
func (w *world) event(parts ...string) string {
	w.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-w.recorder.Events:
			if containsAll(e, parts...) {
				return e
			}
		case <-deadline:
			w.t.Fatalf("no Event of the signer with %q", parts)
			return ""
		}
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// served dials addr as the controller does, trusting the CA alone and asking for node's name,
// and returns the certificate the sidecar served.
func served(t *testing.T, addr string, ca *sidecarsigner.CA, node string) (*x509.Certificate, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool(), ServerName: healerv1alpha1.SidecarDNSName(node, serverName), MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// controllerTokens gives the controller's token for each node's sidecars.
type controllerTokens struct{ cs kubernetes.Interface }

func (c controllerTokens) Token(ctx context.Context, node string) (string, error) {
	tok, err := c.cs.CoreV1().ServiceAccounts(harness.ControllerNamespace).CreateToken(ctx, harness.ControllerAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, node)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tok.Status.Token, nil
}

// TestSidecarServesItsRequestedCertificateAcrossRenewals: the sidecar of node A gets its serving
// certificate by a CertificateSigningRequest, the controller's client verifies it against the
// signer's CA and node A's name, and with certificates valid for 9 seconds the sidecar renews
// its certificate twice and serves each new one without a restart, calls still answered.
func TestSidecarServesItsRequestedCertificateAcrossRenewals(t *testing.T) {
	w := start(t, 9*time.Second)
	node := "node-a-serve"
	certs := w.certificates(w.podClient(pluginSA, node, true), node)
	if err := certs.Ensure(w.ctx); err != nil {
		t.Fatalf("the sidecar of %s asked for its certificate: %v", node, err)
	}
	w.event(sidecarsigner.ReasonSigned, node)

	// The sidecar, in front of a driver, serving the requested certificate.
	driverName := "csr.healer.example.com"
	sock, err := os.MkdirTemp("", "csr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })
	d, err := simulated.New(simulated.Options{StateDir: t.TempDir(), Identity: control.Identity{DriverName: driverName, NodeID: node}, StagingRoot: t.TempDir(), SeedVolumes: []string{"vol-1"}})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := harness.ServeDriver(d, filepath.Join(sock, "csi-addons.sock"), harness.DriverServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop(0) })
	sc, err := harness.StartSidecar(w.ctx, sidecar.Options{
		KubeConfig:      w.cfg,
		NodeName:        node,
		Namespace:       pluginNamespace,
		DriverEndpoint:  "unix://" + filepath.Join(sock, "csi-addons.sock"),
		ListenAddress:   "127.0.0.1:0",
		MetricsAddress:  "0",
		TLSCertFile:     certs.CertFile(),
		TLSKeyFile:      certs.KeyFile(),
		TLSServerName:   serverName,
		KubeletDir:      t.TempDir(),
		ShutdownTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sc.Stop(30 * time.Second); err != nil {
			t.Errorf("stop the sidecar: %v", err)
		}
	})
	rctx, stopRenewals := context.WithCancel(w.ctx)
	renewed := make(chan error, 1)
	go func() { renewed <- certs.Run(rctx) }()
	t.Cleanup(func() {
		stopRenewals()
		<-renewed
	})

	// The controller's client: the signer's CA, each node's sidecar proving its node's name.
	client := probe.New(probe.Options{
		TLS:            &tls.Config{RootCAs: w.ca.Pool(), MinVersion: tls.VersionTLS12},
		NodeServerName: func(n string) string { return healerv1alpha1.SidecarDNSName(n, serverName) },
		Tokens:         controllerTokens{w.cs},
	})
	t.Cleanup(client.Close)
	target := probe.Target{Driver: driverName, Node: node, Endpoint: sc.Addr().String()}
	capabilities := func() error {
		caps, err := client.Capabilities(w.ctx, target)
		if err == nil && caps.Driver != driverName {
			err = fmt.Errorf("capabilities of driver %q", caps.Driver)
		}
		return err
	}
	poll.Eventually(t, 20*time.Second, "the controller's client calls the sidecar over verified TLS", func() (bool, string) {
		err := capabilities()
		return err == nil, fmt.Sprint(err)
	})

	first, err := served(t, sc.Addr().String(), w.ca, node)
	if err != nil {
		t.Fatalf("TLS to the sidecar of %s: %v", node, err)
	}
	if first.Subject.CommonName != healerv1alpha1.SidecarCommonName(node) || first.NotAfter.Sub(first.NotBefore) > 10*time.Second {
		t.Fatalf("served certificate %q valid %s to %s; want %q valid about 9s", first.Subject.CommonName, first.NotBefore, first.NotAfter, healerv1alpha1.SidecarCommonName(node))
	}
	// Another node's name is refused by the controller's client: the certificate is node A's.
	if _, err := served(t, sc.Addr().String(), w.ca, "node-b-serve"); err == nil {
		t.Fatal("the certificate of node A was accepted for node B's name")
	}

	seen := first
	for renewal := 1; renewal <= 2; renewal++ {
		poll.Eventually(t, 25*time.Second, fmt.Sprintf("renewal %d served", renewal), func() (bool, string) {
			cert, err := served(t, sc.Addr().String(), w.ca, node)
			if err != nil {
				return false, err.Error()
			}
			if cert.SerialNumber.Cmp(seen.SerialNumber) == 0 {
				return false, "still the certificate valid until " + cert.NotAfter.String()
			}
			if !cert.NotAfter.After(seen.NotAfter) {
				return false, "a certificate no newer than the last"
			}
			seen = cert
			return true, ""
		})
		if err := capabilities(); err != nil {
			t.Fatalf("after renewal %d, the controller's call: %v", renewal, err)
		}
	}
	select {
	case <-sc.Done():
		t.Fatalf("the sidecar stopped during the renewals: %v", sc.Err())
	default:
	}
}

// TestRequestForAnotherNodeIsDenied: the sidecar of node A, asking for node B's names, is denied,
// and the condition and the Event say why; a request naming node A plus a name of node B is too.
func TestRequestForAnotherNodeIsDenied(t *testing.T) {
	w := start(t, time.Hour)
	nodeA, nodeB := "node-a-deny", "node-b-deny"
	cs := w.podClient(pluginSA, nodeA, true)

	err := w.certificates(cs, nodeB).Obtain(w.ctx)
	if !errors.Is(err, sidecar.ErrCertificateRefused) || !containsAll(err.Error(), "Denied", nodeA, nodeB) {
		t.Fatalf("node A's sidecar asking for node B: %v; want a denial naming both nodes", err)
	}
	w.event(sidecarsigner.ReasonDenied, nodeA, nodeB)

	// Node A's common name with a second name, node B's: the names must be node A's alone.
	name := create(t, w.ctx, cs, healerv1alpha1.SidecarCommonName(nodeA), healerv1alpha1.SidecarDNSName(nodeA, serverName), healerv1alpha1.SidecarDNSName(nodeB, serverName))
	denied := waitDenied(t, w.ctx, w.cs, name)
	if !containsAll(denied.Message, healerv1alpha1.SidecarDNSName(nodeA, serverName)+" alone", healerv1alpha1.SidecarDNSName(nodeB, serverName)) {
		t.Errorf("denial of extra names: %q", denied.Message)
	}
	if got, _ := w.cs.CertificatesV1().CertificateSigningRequests().Get(w.ctx, name, metav1.GetOptions{}); len(got.Status.Certificate) > 0 {
		t.Errorf("denied request %s holds a certificate", name)
	}
}

// TestRequestOfAnotherIdentityIsDenied: a pod of another ServiceAccount on node A, and the node
// plugins' ServiceAccount with a token bound to no pod, are denied, each with its reason.
func TestRequestOfAnotherIdentityIsDenied(t *testing.T) {
	w := start(t, time.Hour)
	node := "node-a-identity"

	err := w.certificates(w.podClient(otherSA, node, true), node).Obtain(w.ctx)
	if !errors.Is(err, sidecar.ErrCertificateRefused) || !containsAll(err.Error(), otherSA, "is not a node plugin's ServiceAccount") {
		t.Fatalf("another ServiceAccount's pod asking for node %s: %v; want a denial naming the requester", node, err)
	}
	w.event(sidecarsigner.ReasonDenied, otherSA)

	err = w.certificates(w.podClient(pluginSA, node, false), node).Obtain(w.ctx)
	if !errors.Is(err, sidecar.ErrCertificateRefused) || !containsAll(err.Error(), "token bound to its pod") {
		t.Fatalf("a token bound to no pod: %v; want a denial saying so", err)
	}
}

// TestSignerAllowingNoRequesterDeniesAll: a signer started before the operator named the node
// plugins' ServiceAccounts denies the sidecar's request and says what to set.
func TestSignerAllowingNoRequesterDeniesAll(t *testing.T) {
	w := startAllowing(t, time.Hour)
	node := "node-a-none"
	err := w.certificates(w.podClient(pluginSA, node, true), node).Obtain(w.ctx)
	if !errors.Is(err, sidecar.ErrCertificateRefused) || !containsAll(err.Error(), "sidecar.tls.signer.requesters is empty") {
		t.Fatalf("a request to a signer allowing no one: %v; want a denial naming sidecar.tls.signer.requesters", err)
	}
}

// TestCAIsCreatedOnceAndKept: the first start creates the CA Secret; later starts read it; a
// Secret that holds no CA is an error naming it, and is left alone.
func TestCAIsCreatedOnceAndKept(t *testing.T) {
	env := harness.Require(t).Env
	ctx := context.Background()
	secrets := env.Clientset.CoreV1().Secrets(harness.ControllerNamespace)
	first, err := sidecarsigner.LoadOrCreateCA(ctx, secrets, "ca-kept", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	again, err := sidecarsigner.LoadOrCreateCA(ctx, secrets, "ca-kept", time.Now())
	if err != nil || !again.Cert.Equal(first.Cert) {
		t.Fatalf("second start: %v, same CA %v", err, err == nil && again.Cert.Equal(first.Cert))
	}
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ca-broken"}, Data: map[string][]byte{"tls.crt": []byte("x")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = sidecarsigner.LoadOrCreateCA(ctx, secrets, "ca-broken", time.Now())
	if !errors.Is(err, sidecarsigner.ErrInvalidCA) || !strings.Contains(err.Error(), harness.ControllerNamespace+"/ca-broken") {
		t.Fatalf("broken CA Secret: %v; want ErrInvalidCA naming it", err)
	}
}

// create makes a request with cs for cn and dnsNames, and returns its name.
func create(t *testing.T, ctx context.Context, cs kubernetes.Interface, cn string, dnsNames ...string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}, DNSNames: dnsNames}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := cs.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			SignerName: healerv1alpha1.SidecarSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return csr.Name
}

// waitDenied waits for the Denied condition of the request name.
func waitDenied(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string) certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	var denied certificatesv1.CertificateSigningRequestCondition
	poll.Eventually(t, 10*time.Second, "request "+name+" denied", func() (bool, string) {
		csr, err := cs.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateDenied {
				denied = c
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %v", csr.Status.Conditions)
	})
	return denied
}
