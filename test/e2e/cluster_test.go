package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/test/harness"
)

// policyLabel selects the policy ConfigMaps (the controller's default selector).
const policyLabel, policyLabelValue = annotations.PolicyLabel, annotations.PolicyLabelValue

// fixture is one test's corner of the cluster (see harness.Fixture), with a namespace for the
// controller's policy ConfigMaps, and the suite it runs in.
type fixture struct {
	*harness.Fixture
	t        *testing.T
	s        *harness.Suite
	policyNS string
}

// newFixture creates the driver's CSIDriver, the namespaces and the stage Secret. name must be a
// short DNS label: it prefixes every object of the test.
func newFixture(t *testing.T, name string) *fixture {
	t.Helper()
	s := harness.Require(t)
	f := &fixture{Fixture: harness.NewFixture(t, s.Env, harness.FixtureOptions{Name: name}), t: t, s: s, policyNS: name + "-policy"}
	f.Create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.policyNS}})
	return f
}

// volume is one test volume: its API objects and the reference driver's record of it.
type volume = harness.Volume

// startController starts a controller with the suite's test settings and the fixture's (its own
// Lease, its policy namespace, a short backoff), overridden by settings, and waits until it
// reports ready. It is stopped when the test ends; a failed test shows the end of its log, and a
// data race it reported fails the test.
func (f *fixture) startController(name string, settings map[string]string) *harness.TestController {
	f.t.Helper()
	all := map[string]string{
		"LEADER_ELECTION_LEASE_NAME": f.Name,
		"POLICY_NAMESPACE":           f.policyNS,
		"BACKOFF_MAX":                "2s",
	}
	maps.Copy(all, settings)
	return f.s.StartController(f.t, name, all)
}

// sweepsFinished waits until the current restart marker of every node is recorded as handled.
func (f *fixture) sweepsFinished(nodes []*node, timeout time.Duration) {
	f.t.Helper()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.name
	}
	f.SweepsFinished(names, timeout)
}

// setPolicy creates or replaces the policy ConfigMap name in the controller's policy namespace,
// with one module.
func (f *fixture) setPolicy(name, rego string) {
	f.t.Helper()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.policyNS, Name: name, Labels: map[string]string{policyLabel: policyLabelValue}},
		Data:       map[string]string{"policy.rego": rego},
	}
	_, err := f.Clientset.CoreV1().ConfigMaps(f.policyNS).Create(f.Ctx(), cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, _ := json.Marshal(map[string]any{"data": cm.Data})
		_, err = f.Clientset.CoreV1().ConfigMaps(f.policyNS).Patch(f.Ctx(), name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		f.t.Fatalf("write policy ConfigMap %s: %v", name, err)
	}
}

// policyStatus reads the controller's status annotation of a policy ConfigMap; ok is false while
// there is none.
func (f *fixture) policyStatus(name string) (st policy.PolicyStatus, ok bool, err error) {
	cm, err := f.Clientset.CoreV1().ConfigMaps(f.policyNS).Get(f.Ctx(), name, metav1.GetOptions{})
	if err != nil {
		return st, false, err
	}
	raw, ok := cm.Annotations[annotations.PolicyStatus]
	if !ok {
		return st, false, nil
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return st, false, fmt.Errorf("ConfigMap %s: annotation %s is not a policy status: %w: %s", name, annotations.PolicyStatus, err, raw)
	}
	return st, true, nil
}

// waitPolicyStatus waits until the status annotation of the policy ConfigMap name reports status
// and accept agrees, and returns it.
func (f *fixture) waitPolicyStatus(name, status string, accept func(policy.PolicyStatus) bool) policy.PolicyStatus {
	f.t.Helper()
	var st policy.PolicyStatus
	harness.Eventually(f.t, time.Minute, fmt.Sprintf("policy ConfigMap %s to be %s", name, status), func() (bool, string) {
		got, ok, err := f.policyStatus(name)
		if err != nil {
			return false, err.Error()
		}
		if !ok {
			return false, "no status yet"
		}
		st = got
		return st.Status == status && (accept == nil || accept(st)), fmt.Sprintf("%+v", st)
	})
	return st
}

// restartStatus is one restart as `healerctl status -o json` reports it.
type restartStatus struct {
	Driver, Node, State string
	NeedsHuman          bool
	LastSweep           *struct{ Reason, Message string }
	// Tier and ProbeSource are what the controller recorded from the sidecar's capabilities.
	Tier, ProbeSource string
}

// healerctlStatus runs `healerctl status -o json` with args against the suite's cluster and
// returns its exit code and the restart of node.
func (f *fixture) healerctlStatus(node string, args ...string) (int, restartStatus) {
	f.t.Helper()
	cmd := exec.Command(f.s.Bin.Healerctl, append([]string{"status", "-o", "json", "--kubeconfig", f.s.Kubeconfig, "--policy-namespace", f.policyNS}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := 0
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 1 {
			f.t.Fatalf("healerctl status: %v\n%s", err, stderr.String())
		}
		code = exit.ExitCode()
	}
	var st struct{ Restarts []restartStatus }
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
		f.t.Fatalf("healerctl status -o json: %v\n%s", err, stdout.String())
	}
	for _, r := range st.Restarts {
		if r.Driver == f.Driver && r.Node == node {
			return code, r
		}
	}
	f.t.Fatalf("healerctl status lists no restart of %s on %s: %+v", f.Driver, node, st.Restarts)
	return 0, restartStatus{}
}
