package sidecar_test

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
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// The integration tests share one control plane: starting kube-apiserver and etcd takes
// seconds, and every test works in objects of its own (a driver name, node name and namespace
// per fixture), so they do not see each other.
var (
	envOnce   sync.Once
	sharedEnv *harness.Cluster
	envErr    error
	fixtureN  atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedEnv != nil {
		if err := sharedEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop control plane:", err)
		}
	}
	os.Exit(code)
}

func controlPlane(t *testing.T) *controlplane.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: starts kube-apiserver and etcd; run without -short")
	}
	envOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sidecar-kubeconfig-")
		if err != nil {
			envErr = err
			return
		}
		sharedEnv, envErr = harness.StartCluster(context.Background(), harness.ClusterOptions{Dir: dir})
	})
	if envErr != nil {
		t.Fatalf("start control plane: %v", envErr)
	}
	return sharedEnv.Env
}

// The controller's ServiceAccount, allowed by default, and another one that is not.
const (
	controllerNamespace = "volume-healer"
	controllerSA        = "volume-healer"
	intruderSA          = "intruder"
)

// fixture is one node: a reference driver on a UNIX socket, the PVs of its volumes, and the
// sidecars started in front of it.
type fixture struct {
	t          *testing.T
	env        *controlplane.Env
	ctx        context.Context
	id         string
	driverName string
	nodeName   string
	namespace  string
	kubeletDir string
	stateDir   string
	endpoint   string
	certFile   string
	keyFile    string
	caFile     string
	caPool     *x509.CertPool

	drv      *simulated.Driver
	recorder *recorder
	stopDrv  func()

	// tokenReviews counts TokenReview requests of every sidecar of the fixture.
	tokenReviews atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := controlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	n := fixtureN.Add(1)
	f := &fixture{
		t:          t,
		env:        env,
		ctx:        ctx,
		id:         fmt.Sprintf("f%d", n),
		driverName: fmt.Sprintf("d%d.healer.example.com", n),
		nodeName:   fmt.Sprintf("node-%d", n),
		namespace:  fmt.Sprintf("csi-%d", n),
		kubeletDir: filepath.Join(t.TempDir(), "kubelet"),
		stateDir:   t.TempDir(),
		recorder:   &recorder{last: map[string]proto.Message{}},
	}
	sock, err := os.MkdirTemp("", "sc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })
	f.endpoint = "unix://" + filepath.Join(sock, "csi-addons.sock")
	f.writeCertificates()
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.namespace}})
	f.ensureServiceAccounts()
	return f
}

// stagingRoot is where kubelet (and so the reference driver) keeps CSI staging paths.
func (f *fixture) stagingRoot() string {
	return filepath.Join(f.kubeletDir, "plugins", "kubernetes.io", "csi")
}

// startDriver serves a reference driver with the given volumes on the fixture's socket. wrap,
// when set, replaces the driver's Healer service, to make it misbehave.
func (f *fixture) startDriver(opts simulated.Options, wrap func(healerv1alpha1.HealerServer) healerv1alpha1.HealerServer) *simulated.Driver {
	f.t.Helper()
	opts.StateDir = f.stateDir
	opts.DriverName = f.driverName
	opts.NodeID = f.nodeName
	opts.StagingRoot = f.stagingRoot()
	if opts.SeedVolumes == nil {
		opts.SeedVolumes = []string{"vol-1", "vol-2", "vol-3"}
	}
	d, err := simulated.New(opts)
	if err != nil {
		f.t.Fatalf("simulated.New: %v", err)
	}
	path := strings.TrimPrefix(f.endpoint, "unix://")
	srv, err := harness.ServeDriver(d, path, harness.DriverServerOptions{
		Interceptors: []grpc.UnaryServerInterceptor{f.recorder.intercept},
		Healer:       wrap,
	})
	if err != nil {
		f.t.Fatalf("serve the driver on %s: %v", path, err)
	}
	var once sync.Once
	f.stopDrv = func() { once.Do(func() { srv.Stop(0) }) }
	f.t.Cleanup(f.stopDrv)
	f.drv = d
	return d
}

// stopDriver stops the driver; its socket file goes with its listener.
func (f *fixture) stopDriver() {
	f.stopDrv()
	if _, err := os.Stat(strings.TrimPrefix(f.endpoint, "unix://")); !errors.Is(err, os.ErrNotExist) {
		f.t.Fatalf("driver socket still there after stop: %v", err)
	}
}

// running is a started sidecar and a NodeHealer client connected to it over TLS.
type running struct {
	s      *sidecar.Sidecar
	conn   *grpc.ClientConn
	client healerv1alpha1.NodeHealerClient
	stop   func() error
}

func (f *fixture) startSidecar(mutate func(*sidecar.Options)) *running {
	f.t.Helper()
	cfg := rest.CopyConfig(f.env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/tokenreviews") {
				f.tokenReviews.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	opts := sidecar.Options{
		KubeConfig:      cfg,
		NodeName:        f.nodeName,
		Namespace:       f.namespace,
		PodUID:          "uid-" + f.id,
		DriverEndpoint:  f.endpoint,
		ListenAddress:   "127.0.0.1:0",
		MetricsAddress:  "127.0.0.1:0",
		TLSCertFile:     f.certFile,
		TLSKeyFile:      f.keyFile,
		KubeletDir:      f.kubeletDir,
		DriverTimeout:   5 * time.Second,
		ShutdownTimeout: 5 * time.Second,
	}
	if mutate != nil {
		mutate(&opts)
	}
	s, err := harness.StartSidecar(context.Background(), opts)
	if err != nil {
		f.t.Fatalf("sidecar.New: %v", err)
	}
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() { stopErr = s.Stop(30 * time.Second) })
		return stopErr
	}
	f.t.Cleanup(func() {
		if err := stop(); err != nil {
			f.t.Errorf("stop sidecar: %v", err)
		}
	})

	creds := credentials.NewTLS(&tls.Config{RootCAs: f.caPool, MinVersion: tls.VersionTLS12})
	conn, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = conn.Close() })
	return &running{s: s.Sidecar, conn: conn, client: healerv1alpha1.NewNodeHealerClient(conn), stop: stop}
}

// waitReady waits until the sidecar knows the driver.
func (f *fixture) waitReady(r *running) {
	f.t.Helper()
	f.eventually("sidecar ready", 20*time.Second, r.s.Ready)
}

func (f *fixture) eventually(what string, within time.Duration, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out after %s waiting for: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// token returns a ServiceAccount token from the TokenRequest API, for audiences; with none, for
// the fixture's node's sidecars, as the controller requests it.
func (f *fixture) token(sa string, audiences ...string) string {
	f.t.Helper()
	if len(audiences) == 0 {
		audiences = []string{healerv1alpha1.NodeTokenAudience(healerv1alpha1.DefaultTokenAudience, f.nodeName)}
	}
	tr, err := f.env.Clientset.CoreV1().ServiceAccounts(controllerNamespace).CreateToken(f.ctx, sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("CreateToken %s: %v", sa, err)
	}
	return tr.Status.Token
}

// as returns a context whose calls carry token.
func (f *fixture) as(token string) context.Context {
	return metadata.AppendToOutgoingContext(f.ctx, "authorization", "Bearer "+token)
}

func (f *fixture) ensureServiceAccounts() {
	f.t.Helper()
	objs := []any{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: controllerNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: controllerNamespace, Name: controllerSA}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: controllerNamespace, Name: intruderSA}},
	}
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Namespace:
			_, err = f.env.Clientset.CoreV1().Namespaces().Create(f.ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = f.env.Clientset.CoreV1().ServiceAccounts(o.Namespace).Create(f.ctx, o, metav1.CreateOptions{})
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			f.t.Fatal(err)
		}
	}
}

func (f *fixture) create(obj any) {
	f.t.Helper()
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		_, err = f.env.Clientset.CoreV1().Namespaces().Create(f.ctx, o, metav1.CreateOptions{})
	case *corev1.PersistentVolume:
		// As the attach/detach controller and the external-attacher leave it: attached to the
		// fixture's node, unless the test says where (attachedTo).
		node, attach := f.nodeName, true
		if n, ok := o.Annotations[attachedTo]; ok {
			node, attach = n, n != ""
		}
		if _, err = f.env.Clientset.CoreV1().PersistentVolumes().Create(f.ctx, o, metav1.CreateOptions{}); err == nil && attach {
			err = f.attach(o, node)
		}
	case *corev1.Secret:
		_, err = f.env.Clientset.CoreV1().Secrets(o.Namespace).Create(f.ctx, o, metav1.CreateOptions{})
	default:
		f.t.Fatalf("create: unsupported %T", obj)
	}
	if err != nil {
		f.t.Fatalf("create %T: %v", obj, err)
	}
}

// attachedTo, on a PV given to create, names the node its VolumeAttachment is for; empty: none.
// Without it the PV is attached to the fixture's node.
const attachedTo = "test.volume-healer.io/attached-to"

// attach creates an attached VolumeAttachment of the fixture's driver for pv to node, named as the
// attach/detach controller names it.
func (f *fixture) attach(pv *corev1.PersistentVolume, node string) error {
	pvName, name := pv.Name, "va-"+pv.Name+"-"+node
	if pv.Spec.CSI != nil {
		name = healerv1alpha1.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, f.driverName, node)
	}
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: f.driverName, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
	}
	vas := f.env.Clientset.StorageV1().VolumeAttachments()
	va, err := vas.Create(f.ctx, va, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	va.Status.Attached = true
	_, err = vas.UpdateStatus(f.ctx, va, metav1.UpdateOptions{})
	return err
}

// pvName names a PV of the fixture.
func (f *fixture) pvName(suffix string) string { return f.id + "-" + suffix }

// pv returns a filesystem CSI PV of the fixture's driver for volume handle.
func (f *fixture) pv(suffix, handle string, mutate ...func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	fs := corev1.PersistentVolumeFilesystem
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: f.pvName(suffix)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    &fs,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			MountOptions:                  []string{"discard"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:           f.driverName,
				VolumeHandle:     handle,
				FSType:           "ext4",
				VolumeAttributes: map[string]string{"mounter": "rbd-nbd", "pool": "replicapool"},
			}},
		},
	}
	for _, m := range mutate {
		m(pv)
	}
	return pv
}

// writeCertificates makes a test CA and a serving certificate for 127.0.0.1 and ::1 signed by
// it.
func (f *fixture) writeCertificates() {
	f.t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "volume-healer test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		f.t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		f.t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "healer-sidecar"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Serving and, in the client certificate test, client certificate.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		f.t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		f.t.Fatal(err)
	}
	dir := f.t.TempDir()
	f.certFile = filepath.Join(dir, "tls.crt")
	f.keyFile = filepath.Join(dir, "tls.key")
	if err := os.WriteFile(f.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(f.keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		f.t.Fatal(err)
	}
	f.caFile = filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(f.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		f.t.Fatal(err)
	}
	f.caPool = x509.NewCertPool()
	f.caPool.AddCert(ca)
}

// recorder keeps the last request of each driver RPC, as the driver received it.
type recorder struct {
	mu   sync.Mutex
	last map[string]proto.Message
}

func (r *recorder) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if m, ok := req.(proto.Message); ok {
		r.mu.Lock()
		r.last[info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]] = proto.Clone(m)
		r.mu.Unlock()
	}
	return handler(ctx, req)
}

func (r *recorder) probe() *healerv1alpha1.ProbeVolumeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, _ := r.last["ProbeVolume"].(*healerv1alpha1.ProbeVolumeRequest)
	return m
}

func (r *recorder) heal() *healerv1alpha1.HealVolumeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, _ := r.last["HealVolume"].(*healerv1alpha1.HealVolumeRequest)
	return m
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
