package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

var (
	perfReport  = flag.String("perf-report", "", "write the figures of TestAPIRequestsPerRestartSweep as Markdown to this file")
	perfVolumes = flag.Int("perf-volumes", 1000, "volumes on the restarted node in TestAPIRequestsPerRestartSweep")
)

// controllerNamespace and controllerAccount are the controller's ServiceAccount, the identity that
// the sidecars allow by default.
const (
	controllerNamespace = "volume-healer"
	controllerAccount   = "volume-healer"
)

// auditPolicy records every request once it has been answered, without bodies: enough to tell
// which client made which request, which apiserver_request_total cannot.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// suite is what every test shares. Tests work in objects of their own (driver name, node names,
// namespaces, StorageClasses), so one control plane serves them all; they run one after the other,
// because each starts its own controller process and every controller sees the whole cluster.
type suite struct {
	env *controlplane.Env
	dir string
	// controllerBin is the controller binary built for this run.
	controllerBin string
	// tokenFile holds a token of the controller's ServiceAccount, for the sidecars' TokenReview.
	tokenFile string
	// auditLog is the apiserver's audit log (JSON lines).
	auditLog string
	// keep leaves dir in place after the run.
	keep bool
}

var shared *suite

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test skips itself under -short; nothing to start.
		os.Exit(m.Run())
	}
	s, err := setUpSuite()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: set up:", err)
		if s != nil {
			s.tearDown()
		}
		os.Exit(1)
	}
	shared = s
	code := m.Run()
	if code != 0 {
		// The folder holds what explains a failure: the apiserver's audit log and the sidecars' logs.
		fmt.Fprintf(os.Stderr, "integration: keeping %s (audit.log, sidecars.log, the controllers' logs)\n", s.dir)
		s.keep = true
	}
	s.tearDown()
	os.Exit(code)
}

func setUpSuite() (*suite, error) {
	dir, err := os.MkdirTemp("", "volume-healer-integration-")
	if err != nil {
		return nil, err
	}
	s := &suite{dir: dir, auditLog: filepath.Join(dir, "audit.log"), controllerBin: filepath.Join(dir, "volume-healer")}
	// The sidecars and drivers run in this process and log through klog: to a file, so that a
	// failure's output shows the tests' own messages.
	logFile, err := os.Create(filepath.Join(dir, "sidecars.log"))
	if err != nil {
		return s, err
	}
	klog.LogToStderr(false)
	klog.SetOutput(logFile)
	policyFile := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policyFile, []byte(auditPolicy), 0o600); err != nil {
		return s, err
	}

	// The build and the control plane start take about as long as each other: overlap them.
	built := make(chan error, 1)
	go func() { built <- buildController(s.controllerBin) }()

	env, err := controlplane.New(controlplane.Options{
		KubeconfigDir: dir,
		APIServerArgs: map[string]string{
			"audit-policy-file": policyFile,
			"audit-log-path":    s.auditLog,
			"audit-log-format":  "json",
		},
	})
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
	s.tokenFile = filepath.Join(dir, "controller-token")
	return s, controlplane.WriteServiceAccountToken(ctx, cs, controllerNamespace, controllerAccount, time.Hour, s.tokenFile)
}

// buildController builds the controller binary without the race detector: it runs as its own
// process, and the race detector's cost would slow every sweep the tests time.
func buildController(out string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", out, "./cmd/volume-healer")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the controller: %w\n%s", err, b)
	}
	return nil
}

func (s *suite) tearDown() {
	if s.env != nil {
		if err := s.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: stop control plane:", err)
		}
	}
	if s.keep {
		_ = os.Remove(s.controllerBin)
		return
	}
	_ = os.RemoveAll(s.dir)
}

// requireSuite returns the shared suite, or skips the test under -short.
func requireSuite(t *testing.T) *suite {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: starts kube-apiserver, etcd and the controller; run without -short")
	}
	if shared == nil {
		t.Fatal("the integration suite was not set up")
	}
	return shared
}
