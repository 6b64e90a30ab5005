package sidecar_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/fixtures"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// The integration tests share one control plane, started by the first of them: starting
// kube-apiserver and etcd takes seconds, and every test works in objects of its own (a driver
// name, node name and namespace per fixture), so they do not see each other. The unit tests start
// nothing.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.SuiteOptions{
		Name:       "sidecar",
		Skip:       "integration test: starts kube-apiserver and etcd; run without -short",
		Lazy:       true,
		NoPrograms: true,
		Kept:       "the control plane's kubeconfig and the log of the sidecars and drivers of the tests",
	}))
}

// fixtureN numbers the fixtures of the run.
var fixtureN atomic.Int64

// The controller's ServiceAccount, allowed by default, which the cluster has, and another one,
// which is not.
const (
	controllerNamespace = harness.ControllerNamespace
	controllerSA        = harness.ControllerAccount
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
	recorder *harness.DriverCalls
	stopDrv  func()

	// tokenReviews counts TokenReview requests of every sidecar of the fixture.
	tokenReviews atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := harness.Require(t).Env
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
		recorder:   &harness.DriverCalls{},
	}
	sock, err := os.MkdirTemp("", "sc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })
	f.endpoint = "unix://" + filepath.Join(sock, "csi-addons.sock")
	f.writeCertificates()
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.namespace}})
	_, err = env.Clientset.CoreV1().ServiceAccounts(controllerNamespace).Create(f.ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: controllerNamespace, Name: intruderSA}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
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
		Interceptors: []grpc.UnaryServerInterceptor{f.recorder.Intercept},
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
	poll.Eventually(f.t, 20*time.Second, "sidecar ready", poll.True(r.s.Ready))
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
	if err := fixtures.Attach(f.ctx, f.env.Clientset, name, f.driverName, pvName, node); err != nil || pv.Spec.CSI == nil {
		return err
	}
	return fixtures.ReportAttached(f.ctx, f.env.Clientset, node, f.driverName, pv.Spec.CSI.VolumeHandle)
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

// writeCertificates makes a CA of the fixture's and, signed by it, a certificate for 127.0.0.1,
// ::1 and localhost, to serve and, in the client certificate test, to be a client with.
func (f *fixture) writeCertificates() {
	f.t.Helper()
	ca, err := harness.NewCA("volume-healer test CA")
	if err != nil {
		f.t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueFor(harness.Identity{
		Name:     "healer-sidecar",
		DNSNames: []string{"localhost"},
		IPs:      []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		Server:   true,
		Client:   true,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	dir := f.t.TempDir()
	f.certFile = filepath.Join(dir, "tls.crt")
	f.keyFile = filepath.Join(dir, "tls.key")
	f.caFile = filepath.Join(dir, "ca.crt")
	for file, data := range map[string][]byte{f.certFile: certPEM, f.keyFile: keyPEM, f.caFile: ca.CertPEM} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			f.t.Fatal(err)
		}
	}
	f.caPool = x509.NewCertPool()
	f.caPool.AppendCertsFromPEM(ca.CertPEM)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
