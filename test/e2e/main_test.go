package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

// controllerNamespace and controllerAccount are the controller's ServiceAccount: the identity the
// sidecars allow by default, and the namespace of the leader election Leases.
const (
	controllerNamespace = "volume-healer"
	controllerAccount   = "volume-healer"
)

// binaries are the programs built for the run.
type binaries struct {
	// controller is cmd/volume-healer, built with the race detector.
	controller string
	// sidecar is cmd/healer-sidecar.
	sidecar string
	// driver is cmd/refdriver.
	driver string
}

// suite is what every test shares: one control plane, the binaries, and the register of running
// processes. Tests run one after the other and each works in objects of its own (driver name,
// nodes, namespaces, StorageClasses), because each starts its own controller process and every
// controller sees the whole cluster.
type suite struct {
	env       *controlplane.Env
	dir       string
	bin       binaries
	tokenFile string
	procs     *processes

	tearDownOnce sync.Once
}

var (
	shared   *suite
	keepLogs = flag.Bool("keep-logs", false, "keep the run's folder, with the log of every process, after a successful run too")
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test skips itself under -short; nothing to start or build.
		os.Exit(m.Run())
	}
	s, err := setUpSuite()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: set up:", err)
		if s != nil {
			s.tearDown(true)
		}
		os.Exit(1)
	}
	shared = s
	s.guard()
	code := m.Run()
	s.tearDown(code != 0 || *keepLogs)
	os.Exit(code)
}

// guard stops every process of the run when the run is interrupted (SIGINT, SIGTERM) and shortly
// before the test binary's own timeout panics: the controllers, sidecars and drivers would die
// with the test binary anyway (see processes), but kube-apiserver and etcd would not.
func (s *suite) guard() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "e2e: %v: stopping every process of the run\n", sig)
		s.tearDown(true)
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if timeout, err := time.ParseDuration(f.Value.String()); err == nil && timeout > 0 {
			// The timeout's panic prints every goroutine, which tells where a test hung; it
			// comes a little later, with the processes already gone.
			margin := min(30*time.Second, timeout/10)
			time.AfterFunc(timeout-margin, func() {
				fmt.Fprintf(os.Stderr, "e2e: the test binary times out in %s: stopping every process of the run\n", margin)
				s.tearDown(true)
			})
		}
	}
}

func setUpSuite() (*suite, error) {
	dir, err := os.MkdirTemp("", "volume-healer-e2e-")
	if err != nil {
		return nil, err
	}
	s := &suite{
		dir:   dir,
		procs: newProcesses(),
		bin: binaries{
			controller: filepath.Join(dir, "bin", "volume-healer"),
			sidecar:    filepath.Join(dir, "bin", "healer-sidecar"),
			driver:     filepath.Join(dir, "bin", "refdriver"),
		},
	}
	// envtest and the clients log through klog; to a file, so that a failure's output shows the
	// tests' own messages.
	logFile, err := os.Create(filepath.Join(dir, "test-process.log"))
	if err != nil {
		return s, err
	}
	klog.LogToStderr(false)
	klog.SetOutput(logFile)

	// The builds and the control plane start take about as long as each other: overlap them.
	built := make(chan error, 1)
	go func() { built <- s.build() }()
	env, err := controlplane.New(controlplane.Options{KubeconfigDir: dir})
	if err != nil {
		<-built
		return s, fmt.Errorf("control plane: %w", err)
	}
	s.env = env
	if err := <-built; err != nil {
		return s, err
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := env.Ready(ctx); err != nil {
		return s, err
	}
	cs := env.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: controllerNamespace}}, metav1.CreateOptions{}); err != nil {
		return s, err
	}
	if _, err := cs.CoreV1().ServiceAccounts(controllerNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: controllerAccount}}, metav1.CreateOptions{}); err != nil {
		return s, err
	}
	// Long enough for the whole run: the sidecars review it with every uncached call.
	s.tokenFile = filepath.Join(dir, "controller-token")
	return s, controlplane.WriteServiceAccountToken(ctx, cs, controllerNamespace, controllerAccount, 4*time.Hour, s.tokenFile)
}

// build builds the three programs. Only the controller gets the race detector: it is the program
// under test, and the 100 sidecar and driver processes of the rollout test would not fit two
// cores with it.
func (s *suite) build() error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	steps := [][]string{
		{"build", "-race", "-o", s.bin.controller, "./cmd/volume-healer"},
		{"build", "-o", filepath.Dir(s.bin.sidecar) + "/", "./cmd/healer-sidecar", "./cmd/refdriver"},
	}
	for _, args := range steps {
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %v: %w\n%s", args, err, out)
		}
	}
	return nil
}

// tearDown kills every process still running, stops the control plane and removes the run's
// folder unless keep asks to keep it for its logs. It runs once, from whichever path comes first;
// a later call waits for the first to finish.
func (s *suite) tearDown(keep bool) {
	s.tearDownOnce.Do(func() {
		s.procs.killAll()
		if s.env != nil {
			if err := s.env.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: stop control plane:", err)
			}
		}
		if keep {
			fmt.Fprintf(os.Stderr, "e2e: keeping %s (the logs of every process)\n", s.dir)
			_ = os.RemoveAll(filepath.Join(s.dir, "bin"))
			return
		}
		_ = os.RemoveAll(s.dir)
	})
}

// requireSuite returns the shared suite, or skips the test under -short.
func requireSuite(t *testing.T) *suite {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: starts kube-apiserver, etcd, the controller, sidecars and drivers; run without -short")
	}
	if shared == nil {
		t.Fatal("the e2e suite was not set up")
	}
	return shared
}

// logDir returns the folder for the logs of t's processes, inside the run's folder, which
// outlives a failed run.
func (s *suite) logDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(s.dir, "logs", t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
