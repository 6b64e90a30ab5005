// Package controlplane gives tests a real kube-apiserver and etcd, started through controller-runtime's
// envtest, with the CSIAddonsNode CRD installed from the kubernetes-csi-addons module.
//
// The binaries come from hack/control-plane.sh, which builds kube-apiserver from the Go module proxy
// and installs etcd from Debian's package on first use and caches both under .cache/ (git ignored).
// KUBEBUILDER_ASSETS, when set, names a folder that already holds them and skips the script.
// VOLUME_HEALER_KUBE_VERSION (KubeVersionEnv) chooses another release than the script's default:
// make test-oldest runs a part of the suites against the oldest supported one.
//
// The suites reach it through test/harness, which adds the controller's identity and everything
// else a suite needs on top of it.
//
// It must not import the project's product packages: it starts the API server the others use.
package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// csiAddonsModule is the module whose CRD manifests define CSIAddonsNode.
const csiAddonsModule = "github.com/csi-addons/kubernetes-csi-addons"

// csiAddonsNodeCRD is the CRD file inside that module.
const csiAddonsNodeCRD = "config/crd/bases/csiaddons.openshift.io_csiaddonsnodes.yaml"

// watchDrainFlag bounds how long a stopping kube-apiserver waits for its watches to end. Without
// it the apiserver keeps serving open watches after SIGTERM until its one-minute shutdown timeout,
// so that StopAPIServer would take a minute whenever a client watches, and the clients' watches
// would not break when the apiserver is told to stop.
const watchDrainFlag, watchDrainDefault = "shutdown-watch-termination-grace-period", "2s"

// Env is a started control plane.
type Env struct {
	// Config reaches the apiserver as an administrator.
	Config *rest.Config
	// Clientset is a typed client for built-in resources.
	Clientset kubernetes.Interface
	// Client is a controller-runtime client whose scheme knows the built-in types and CSIAddonsNode.
	Client client.Client
	// Scheme holds the built-in types and the csiaddons.openshift.io/v1alpha1 types.
	Scheme *runtime.Scheme
	// Kubeconfig is the path of a kubeconfig file for Config, for processes and for people.
	Kubeconfig string

	env      *envtest.Environment
	certDir  string
	stopOnce sync.Once
	stopErr  error

	// apiMu serializes stopping and starting the apiserver; apiDown is true between
	// StopAPIServer and StartAPIServer.
	apiMu   sync.Mutex
	apiDown bool
}

// Options tune a control plane. The zero value is ready to use.
type Options struct {
	// APIServerArgs are extra kube-apiserver flags, as name=value pairs without the leading "--".
	// Default: none besides shutdown-watch-termination-grace-period=2s (see watchDrainFlag).
	APIServerArgs map[string]string
	// KubeconfigDir is where the kubeconfig file is written. Default: a new temporary folder.
	KubeconfigDir string
	// EtcdArgs are extra etcd flags, as name=value pairs without the leading "--". Default: none
	// (envtest's own: no fsync, etcd's 2 GiB backend quota).
	EtcdArgs map[string]string
}

// Start starts a control plane for tb and stops it when tb ends. It fails tb if the control plane
// cannot start.
func Start(tb testing.TB) *Env {
	tb.Helper()
	env, err := New(Options{KubeconfigDir: tb.TempDir()})
	if err != nil {
		tb.Fatalf("start control plane: %v", err)
	}
	tb.Cleanup(func() {
		if err := env.Stop(); err != nil {
			tb.Errorf("stop control plane: %v", err)
		}
	})
	return env
}

// New starts a control plane. The caller must call Stop.
func New(opts Options) (*Env, error) {
	// envtest and the controller-runtime clients log through controller-runtime's logger; route it
	// to klog, like the rest of the project, before anything logs.
	loggerOnce.Do(func() { ctrllog.SetLogger(klog.Background()) })
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	crd, err := CSIAddonsNodeCRDPath()
	if err != nil {
		return nil, err
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths:              []string{crd},
			ErrorIfPathMissing: true,
			Scheme:             scheme,
		},
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	apiServer := te.ControlPlane.GetAPIServer()
	// A certificate folder of our own, rather than one envtest creates and deletes when the
	// apiserver stops, lets StartAPIServer bring the apiserver back with the same serving
	// certificate and service account keys: clients and tokens from before keep working.
	certDir, err := os.MkdirTemp("", "volume-healer-apiserver-")
	if err != nil {
		return nil, err
	}
	apiServer.CertDir = certDir
	args := apiServer.Configure()
	args.Set(watchDrainFlag, watchDrainDefault)
	for name, value := range opts.APIServerArgs {
		args.Set(name, value)
	}
	// The binaries by path: envtest would take KUBEBUILDER_ASSETS over BinaryAssetsDirectory, and
	// with KubeVersionEnv the assets are another release's.
	apiServer.Path = filepath.Join(assets, "kube-apiserver")
	te.ControlPlane.Etcd = &envtest.Etcd{Path: filepath.Join(assets, "etcd")}
	if len(opts.EtcdArgs) > 0 {
		etcdArgs := te.ControlPlane.Etcd.Configure()
		for name, value := range opts.EtcdArgs {
			etcdArgs.Set(name, value)
		}
	}
	cfg, err := te.Start()
	if err != nil {
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("envtest with assets %s: %w", assets, err)
	}
	e := &Env{Config: cfg, Scheme: scheme, env: te, certDir: certDir}
	if err := e.finish(opts); err != nil {
		_ = te.Stop()
		_ = os.RemoveAll(certDir)
		return nil, err
	}
	return e, nil
}

func (e *Env) finish(opts Options) error {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	e.Clientset = cs
	c, err := client.New(e.Config, client.Options{Scheme: e.Scheme})
	if err != nil {
		return fmt.Errorf("controller-runtime client: %w", err)
	}
	e.Client = c
	dir := opts.KubeconfigDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "volume-healer-kubeconfig-"); err != nil {
			return err
		}
	}
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: "volume-healer-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("render kubeconfig: %w", err)
	}
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kc, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// Stop stops kube-apiserver, waits for it to exit, then stops etcd. It is safe to call twice.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		e.apiMu.Lock()
		defer e.apiMu.Unlock()
		e.stopErr = e.env.Stop()
		if err := os.RemoveAll(e.certDir); err != nil {
			e.stopErr = errors.Join(e.stopErr, err)
		}
	})
	return e.stopErr
}

// StopAPIServer stops kube-apiserver with SIGTERM, as a rolling restart of the control plane
// does, and returns once its process has exited and its port accepts no connections: an
// apiserver keeps serving for a while after SIGTERM, and a new one cannot take the port before
// it is gone. etcd keeps running, and with it every object. Clients see their requests fail and
// their watches end until StartAPIServer. Stopping a stopped apiserver does nothing.
func (e *Env) StopAPIServer() error {
	e.apiMu.Lock()
	defer e.apiMu.Unlock()
	if e.apiDown {
		return nil
	}
	apiServer := e.env.ControlPlane.GetAPIServer()
	// Stop signals the process and waits for it to exit; only when it does not exit within the
	// stop timeout does it kill it, without waiting. The port check below covers that case too.
	stopErr := apiServer.Stop()
	e.apiDown = true
	addr := apiServer.SecureServing.HostPort()
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return stopErr
		}
		_ = conn.Close()
		if time.Now().After(deadline) {
			return errors.Join(stopErr, fmt.Errorf("stop kube-apiserver: %s still accepts connections a minute after it was told to stop", addr))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the same address, with the
// same serving certificate, client CA and service account keys, against the same etcd: every
// client configuration, kubeconfig file and token issued before works again. It returns once the
// apiserver reports healthy. Starting a running apiserver does nothing.
func (e *Env) StartAPIServer() error {
	e.apiMu.Lock()
	defer e.apiMu.Unlock()
	if !e.apiDown {
		return nil
	}
	if err := e.env.ControlPlane.GetAPIServer().Start(); err != nil {
		return fmt.Errorf("start kube-apiserver again: %w", err)
	}
	e.apiDown = false
	return nil
}

// EtcdURL is the address of the apiserver's etcd (plain HTTP on loopback), for a harness that
// writes objects as the apiserver stores them, faster than the apiserver takes them.
func (e *Env) EtcdURL() string { return e.env.ControlPlane.Etcd.URL.String() }

// APIServerURL is the address clients use to reach the apiserver.
func (e *Env) APIServerURL() string { return e.Config.Host }

// Ready waits until the apiserver answers /readyz or ctx ends.
func (e *Env) Ready(ctx context.Context) error {
	for {
		body, err := e.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apiserver not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// NewScheme returns a scheme with the built-in types and csiaddons.openshift.io/v1alpha1.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := csiaddonsv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

var (
	loggerOnce sync.Once
	assetsOnce sync.Once
	assetsDir  string
	assetsErr  error
)

// KubeVersionEnv names the environment variable that chooses the Kubernetes release whose
// kube-apiserver the tests run against, as hack/control-plane.sh's KUBE_VERSION (v1.30.14): make
// test-oldest sets it to the oldest supported release. It wins over KUBEBUILDER_ASSETS.
const KubeVersionEnv = "VOLUME_HEALER_KUBE_VERSION"

// Assets returns the folder holding kube-apiserver and etcd: what hack/control-plane.sh prints for
// the release of KubeVersionEnv when it is set, else KUBEBUILDER_ASSETS when set, otherwise what
// hack/control-plane.sh prints for its default release (it builds or installs what is missing,
// once per machine).
func Assets() (string, error) {
	assetsOnce.Do(func() {
		kubeVersion := os.Getenv(KubeVersionEnv)
		if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" && kubeVersion == "" {
			assetsDir = dir
			return
		}
		root, err := RepoRoot()
		if err != nil {
			assetsErr = err
			return
		}
		var out, errOut bytes.Buffer
		cmd := exec.Command("bash", filepath.Join(root, "hack", "control-plane.sh"))
		if kubeVersion != "" {
			cmd.Env = append(os.Environ(), "KUBE_VERSION="+kubeVersion)
		}
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			assetsErr = fmt.Errorf("hack/control-plane.sh: %w\n%s", err, errOut.String())
			return
		}
		assetsDir = strings.TrimSpace(out.String())
	})
	if assetsErr != nil {
		return "", assetsErr
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assetsDir, bin)); err != nil {
			return "", fmt.Errorf("control plane assets in %s: %w (run hack/control-plane.sh)", assetsDir, err)
		}
	}
	return assetsDir, nil
}

// CSIAddonsNodeCRDPath returns the CSIAddonsNode CRD manifest shipped in the kubernetes-csi-addons
// module that go.mod pins.
func CSIAddonsNodeCRDPath() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", csiAddonsModule)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("locate module %s: %w: %s", csiAddonsModule, err, ee.Stderr)
		}
		return "", fmt.Errorf("locate module %s: %w", csiAddonsModule, err)
	}
	path := filepath.Join(strings.TrimSpace(string(out)), csiAddonsNodeCRD)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("CSIAddonsNode CRD: %w", err)
	}
	return path, nil
}

// RepoRoot returns the folder holding this module's go.mod, searched upwards from the working
// directory (go test runs each package in its own folder).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.HasPrefix(data, []byte("module github.com/volume-healer/volume-healer\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("volume-healer module root not found above the working directory")
		}
		dir = parent
	}
}

// WriteServiceAccountToken requests a token of the ServiceAccount namespace/name, valid for ttl,
// and writes it to path, readable by its owner only. The controller, run as a process outside
// the cluster, authenticates to the sidecars with it, as its pod would with a projected token.
func WriteServiceAccountToken(ctx context.Context, cs kubernetes.Interface, namespace, name string, ttl time.Duration, path string) error {
	seconds := int64(ttl / time.Second)
	tok, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of the ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return os.WriteFile(path, []byte(tok.Status.Token), 0o600)
}

// Minor returns the minor version of the running kube-apiserver: 30 for v1.30.14. The suites run
// against v1.37 (make test) and the oldest supported release (make test-oldest).
func (e *Env) Minor() (int, error) {
	info, err := e.Clientset.Discovery().ServerVersion()
	if err != nil {
		return 0, fmt.Errorf("kube-apiserver version: %w", err)
	}
	v, err := utilversion.ParseGeneric(info.GitVersion)
	if err != nil || v.Major() != 1 {
		return 0, fmt.Errorf("kube-apiserver reports version %q, not a Kubernetes 1.x release", info.GitVersion)
	}
	return int(v.Minor()), nil
}

// RequireMinor skips tb, saying so, when the kube-apiserver is older than Kubernetes 1.minor;
// needs names what of that release the test needs. A test that cannot pass on the oldest
// supported release skips there by this check, never silently.
func (e *Env) RequireMinor(tb testing.TB, minor int, needs string) {
	tb.Helper()
	got, err := e.Minor()
	if err != nil {
		tb.Fatal(err)
	}
	if got < minor {
		tb.Skipf("kube-apiserver is Kubernetes 1.%d: the test needs %s (Kubernetes 1.%d and later)", got, needs, minor)
	}
}
