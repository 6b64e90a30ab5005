package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

const statusDriver = "rbd.csi.ceph.com"

// statusCluster writes onto a real apiserver what the sidecars and the controller write: restart
// markers, handled markers, sweep Events, volume status annotations and policy statuses, each
// through the code that writes it in the product.
type statusCluster struct {
	t   *testing.T
	env *controlplane.Env
}

func (c statusCluster) create(obj client.Object) {
	c.t.Helper()
	if err := c.env.Client.Create(c.t.Context(), obj); err != nil {
		c.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// restart creates the CSIAddonsNode of node whose sidecar started at `at`, and records it as
// swept when handled, as the controller does once the restart sweep ends, with its Event.
func (c statusCluster) restart(node string, at time.Time, handled bool) {
	c.t.Helper()
	n := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi-rbd", Name: node + "-rbd",
			Annotations: map[string]string{annotations.HealerRestart: annotations.HealerRestartValue(at, "pod-"+node)}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: statusDriver, NodeID: node, EndPoint: "pod://" + node + ":9070"}},
	}
	c.create(n)
	if !handled {
		return
	}
	sweep := scheduler.Sweep{Trigger: scheduler.TriggerRestart, Driver: statusDriver, Node: node,
		Source: types.NamespacedName{Namespace: n.Namespace, Name: n.Name}, Marker: trigger.RestartMarker(n)}
	if err := trigger.RecordHandled(c.t.Context(), c.env.Client, sweep, nil); err != nil {
		c.t.Fatal(err)
	}
	c.create(&corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: n.Namespace, Name: n.Name + ".finished"},
		InvolvedObject: corev1.ObjectReference{Kind: "CSIAddonsNode", APIVersion: "csiaddons.openshift.io/v1alpha1", Namespace: n.Namespace, Name: n.Name},
		Reason:         healer.ReasonRestartSweepFinished, Type: corev1.EventTypeNormal, LastTimestamp: metav1.NewTime(at.Add(time.Minute)),
		Message: "Restart sweep of " + statusDriver + " on node " + node + " finished: 8 volumes: 8 probed, 7 healed, 1 left alone",
	})
}

// tier records on node's CSIAddonsNode the tier the controller recorded from its sidecar's
// capabilities, in the controller's format (healer.DriverTier under annotations.DriverTier).
func (c statusCluster) tier(node string, t healer.DriverTier) {
	c.t.Helper()
	raw, err := json.Marshal(t)
	if err != nil {
		c.t.Fatal(err)
	}
	n := &csiaddonsv1alpha1.CSIAddonsNode{}
	n.Namespace, n.Name = "csi-rbd", node+"-rbd"
	patch := annotations.MergePatch(map[string]string{annotations.DriverTier: string(raw)})
	if err := c.env.Client.Patch(c.t.Context(), n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		c.t.Fatal(err)
	}
}

// sweepResult records on node's CSIAddonsNode what its last restart sweep did, in the
// controller's format (healer.RestartSweepResult under annotations.RestartSweep).
func (c statusCluster) sweepResult(node string, r healer.RestartSweepResult) {
	c.t.Helper()
	raw, err := json.Marshal(r)
	if err != nil {
		c.t.Fatal(err)
	}
	n := &csiaddonsv1alpha1.CSIAddonsNode{}
	n.Namespace, n.Name = "csi-rbd", node+"-rbd"
	patch := annotations.MergePatch(map[string]string{annotations.RestartSweep: string(raw)})
	if err := c.env.Client.Patch(c.t.Context(), n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		c.t.Fatal(err)
	}
}

// lineWith returns the line of out that contains every one of parts, or "".
func lineWith(out string, parts ...string) string {
	for _, line := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return line
		}
	}
	return ""
}

// volume creates a bound PV and PVC whose status annotation is st, as the healer writes it.
func (c statusCluster) volume(name string, st *healer.VolumeStatus) {
	c.t.Helper()
	pv := persistentVolume(name)
	c.create(pv)
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:  pv.Name,
		},
	}
	if st != nil {
		raw, err := json.Marshal(st)
		if err != nil {
			c.t.Fatal(err)
		}
		pvc.Annotations = map[string]string{annotations.VolumeStatus: string(raw)}
	}
	c.create(pvc)
}

// persistentVolume is the 1Gi PV pv-<name> of statusDriver, with the volume handle name.
func persistentVolume(name string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: statusDriver, VolumeHandle: name}},
		},
	}
}

// policyConfigMap creates a policy ConfigMap whose status, as the controller writes it, is st.
func (c statusCluster) policyConfigMap(name string, st policy.PolicyStatus) {
	c.t.Helper()
	raw, err := json.Marshal(st)
	if err != nil {
		c.t.Fatal(err)
	}
	c.create(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: policy.DefaultPolicyNamespace, Name: name,
			Labels:      map[string]string{annotations.PolicyLabel: annotations.PolicyLabelValue},
			Annotations: map[string]string{annotations.PolicyStatus: string(raw)}},
		Data: map[string]string{"site.rego": "package volumehealer\n"},
	})
}

// status runs healerctl status with args and returns its output and exit code.
func status(t *testing.T, kubeconfig string, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	cmd := newRootCommand("healerctl")
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"status", "--kubeconfig", kubeconfig}, args...))
	err := cmd.ExecuteContext(context.Background())
	var exit *exitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.code
	default:
		t.Fatalf("healerctl status %s: %v\n%s", strings.Join(args, " "), err, out.String())
		return "", 1
	}
}

func decodeStatus(t *testing.T, out string) Status {
	t.Helper()
	var s Status
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("status -o json is not a status: %v\n%s", err, out)
	}
	return s
}

func mustContain(t *testing.T, out string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(out, p) {
			t.Errorf("output lacks %q:\n%s", p, out)
		}
	}
}

// TestStatus runs healerctl status against a real apiserver as the cluster changes: what an
// operator sees and the exit code a cron job or CI gate acts on.
func TestStatus(t *testing.T) {
	env := controlplane.Start(t)
	c := statusCluster{t: t, env: env}
	for _, ns := range []string{"csi-rbd", "shop", policy.DefaultPolicyNamespace} {
		c.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	now := time.Now()
	c.restart("node-1", now.Add(-2*time.Hour), true)
	c.restart("node-2", now.Add(-3*time.Minute), false)
	c.volume("healthy", nil)
	c.volume("healed", &healer.VolumeStatus{Result: healer.StatusHealed, Node: "node-1", Time: now.Add(-time.Hour)})

	t.Run("a swept restart, a recent pending one and a healed volume need nobody", func(t *testing.T) {
		out, code := status(t, env.Kubeconfig)
		if code != 0 {
			t.Errorf("exit code %d, want 0:\n%s", code, out)
		}
		mustContain(t, out,
			"NODE PLUGIN RESTARTS (2, 1 pending)",
			"node-1", "handled", "120m ago", "RestartSweepFinished", "7 healed",
			"node-2", "pending", "3m",
			"VOLUMES LEFT BROKEN (0; 1 healed since their last problem)",
			"POLICY (namespace volume-healer, in force): the built-in default policy",
			"Nothing needs a human.")
		if strings.Contains(out, "needs a human)") {
			t.Errorf("a restart pending for 3 minutes is marked as needing a human:\n%s", out)
		}
		if lineWith(out, "node-1", " unknown ", "handled") == "" || lineWith(out, "node-2", " unknown ", "pending") == "" {
			t.Errorf("the tier of nodes whose capabilities the controller has not recorded is not unknown:\n%s", out)
		}
	})

	t.Run("the tier each driver gets on each node", func(t *testing.T) {
		c.tier("node-1", healer.DriverTier{Tier: policy.TierHealer, ProbeSource: "driver"})
		c.tier("node-2", healer.DriverTier{Tier: policy.TierNone, ProbeSource: "sidecar"})
		out, _ := status(t, env.Kubeconfig)
		mustContain(t, out, "DRIVER            NODE    TIER    STATE", "none = the driver serves no Healer probe and the sidecar probes on the node")
		if lineWith(out, statusDriver, "node-1", " healer ", "handled") == "" {
			t.Errorf("node-1's line does not say tier healer:\n%s", out)
		}
		if lineWith(out, statusDriver, "node-2", " none ", "pending") == "" {
			t.Errorf("node-2's line does not say tier none:\n%s", out)
		}
		s := decodeStatus(t, must(status(t, env.Kubeconfig, "-o", "json")))
		if len(s.Restarts) != 2 || s.Restarts[0].Tier != "healer" || s.Restarts[0].ProbeSource != "driver" ||
			s.Restarts[1].Tier != "none" || s.Restarts[1].ProbeSource != "sidecar" {
			t.Errorf("restarts %+v, want node-1 healer (driver probes), node-2 none (sidecar probes)", s.Restarts)
		}
	})

	t.Run("kept beside healed", func(t *testing.T) {
		out, _ := status(t, env.Kubeconfig)
		mustContain(t, out, "STATE    HEALED  KEPT", "their last sweeps: 0 healed, 0 kept")
		// DRIVER NODE TIER STATE HEALED KEPT ...
		if f := strings.Fields(lineWith(out, statusDriver, "node-1")); len(f) < 6 || f[4] != "-" || f[5] != "-" {
			t.Errorf("node-1 has no recorded sweep result, yet its line shows counts:\n%s", out)
		}
		c.sweepResult("node-1", healer.RestartSweepResult{Marker: "m", Volumes: 8, Healed: 2, Kept: 5, Unhealthy: 1})
		out, _ = status(t, env.Kubeconfig)
		mustContain(t, out, "their last sweeps: 2 healed, 5 kept")
		if f := strings.Fields(lineWith(out, statusDriver, "node-1")); len(f) < 6 || f[3] != "handled" || f[4] != "2" || f[5] != "5" {
			t.Errorf("node-1's line does not show 2 healed and 5 kept:\n%s", out)
		}
		s := decodeStatus(t, must(status(t, env.Kubeconfig, "-o", "json")))
		if r := s.Restarts[0].LastSweepResult; r == nil || r.Healed != 2 || r.Kept != 5 || r.Volumes != 8 {
			t.Errorf("node-1's last sweep result %+v, want 8 volumes, 2 healed, 5 kept", r)
		}
		if s.Restarts[1].LastSweepResult != nil {
			t.Errorf("node-2's last sweep result %+v, want none recorded", s.Restarts[1].LastSweepResult)
		}
	})

	t.Run("a restart pending beyond the threshold needs a human", func(t *testing.T) {
		out, code := status(t, env.Kubeconfig, "--pending-threshold", "1m", "-o", "json")
		if code != exitNeedsHuman {
			t.Errorf("exit code %d, want %d", code, exitNeedsHuman)
		}
		s := decodeStatus(t, out)
		if len(s.Restarts) != 2 {
			t.Fatalf("restarts %+v, want node-1 and node-2", s.Restarts)
		}
		one, two := s.Restarts[0], s.Restarts[1]
		if one.Node != "node-1" || one.State != RestartHandled || one.NeedsHuman || one.Marker != one.HandledMarker {
			t.Errorf("node-1: %+v, want handled", one)
		}
		if two.Node != "node-2" || two.State != RestartPending || !two.NeedsHuman || two.HandledMarker != "" ||
			two.RestartedAt == nil || now.Sub(*two.RestartedAt) < 3*time.Minute-time.Second {
			t.Errorf("node-2: %+v, want pending since 3 minutes, needing a human", two)
		}
		if len(s.Problems) != 1 || !strings.Contains(s.Problems[0], "node-2") || !strings.Contains(s.Problems[0], "is the controller running") {
			t.Errorf("problems %q, want node-2's restart not swept and no sweep Event", s.Problems)
		}
	})

	c.volume("lost", &healer.VolumeStatus{Result: healer.StatusUnhealthy, Node: "node-1", Time: now.Add(-10 * time.Minute),
		Health: []probe.Health{{Status: string(policy.HealthDataLoss), Reason: "DataLost", Message: "the image's objects are gone"}}})
	c.volume("stuck", &healer.VolumeStatus{Result: healer.StatusHealFailed, Node: "node-1", Time: now.Add(-5 * time.Minute),
		Message: "volume still unhealthy after heal: INACCESSIBLE MountGone"})

	t.Run("data loss and a failed heal need a human", func(t *testing.T) {
		out, code := status(t, env.Kubeconfig)
		if code != exitNeedsHuman {
			t.Errorf("exit code %d, want %d:\n%s", code, exitNeedsHuman, out)
		}
		mustContain(t, out,
			"VOLUMES LEFT BROKEN (2; 1 healed since their last problem)",
			"shop/lost", "DATA_LOSS", "restore its data from a snapshot or replica",
			"shop/stuck", "heal-failed", "still unhealthy after heal",
			"NEEDS A HUMAN (2)")

		js, _ := status(t, env.Kubeconfig, "-o", "json")
		s := decodeStatus(t, js)
		if len(s.Volumes) != 2 {
			t.Fatalf("volumes %+v, want lost and stuck", s.Volumes)
		}
		lost := s.Volumes[0]
		if lost.PVC != "shop/lost" || !lost.DataLoss || lost.PV != "pv-lost" || lost.Driver != statusDriver || lost.Status.Node != "node-1" {
			t.Errorf("volume %+v, want shop/lost with DATA_LOSS on node-1", lost)
		}
		if s.Volumes[1].PVC != "shop/stuck" || s.Volumes[1].DataLoss || s.Volumes[1].Status.Result != healer.StatusHealFailed {
			t.Errorf("volume %+v, want shop/stuck whose heal failed", s.Volumes[1])
		}

		ym, code := status(t, env.Kubeconfig, "-o", "yaml")
		var fromYAML Status
		if err := yaml.Unmarshal([]byte(ym), &fromYAML); err != nil || code != exitNeedsHuman {
			t.Fatalf("-o yaml: exit %d, %v:\n%s", code, err, ym)
		}
		if len(fromYAML.Volumes) != 2 || len(fromYAML.Problems) != len(s.Problems) {
			t.Errorf("-o yaml says %+v, -o json %+v", fromYAML, s)
		}
	})

	t.Run("a rejected policy is not in force", func(t *testing.T) {
		c.policyConfigMap("site-policy", policy.PolicyStatus{Status: policy.StatusRejected, Reason: "compile",
			Error: "volume-healer/site-policy/site.rego:3: rego_type_error: undefined function"})
		lastGood := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: policy.DefaultPolicyNamespace, Name: policy.DefaultLastGoodName,
			Annotations: map[string]string{annotations.PolicyLastGoodRevision: "4f2a"}}}
		c.create(lastGood)
		s := decodeStatus(t, must(status(t, env.Kubeconfig, "-o", "json")))
		p := s.Policy
		if p.InForce || !strings.Contains(p.Serving, "last good revision 4f2a") || len(p.ConfigMaps) != 1 ||
			p.ConfigMaps[0].Status == nil || p.ConfigMaps[0].Status.Status != policy.StatusRejected {
			t.Errorf("policy %+v, want the rejected ConfigMap and the last good revision serving", p)
		}
		if !containsLine(s.Problems, "volume-healer/site-policy is rejected (compile)") {
			t.Errorf("problems %q, want the rejected policy", s.Problems)
		}
	})

	c.volume("moving", &healer.VolumeStatus{Result: healer.StatusRecycling, Node: "node-2", Time: now.Add(-time.Minute),
		Recycle: &healer.RecycleStatus{Since: now.Add(-2 * time.Minute), Finding: "MountGone", Evicted: 2}})
	c.volume("held", &healer.VolumeStatus{Result: healer.StatusRecycling, Node: "node-2", Time: now.Add(-time.Minute),
		Recycle: &healer.RecycleStatus{Since: now.Add(-10 * time.Minute), Finding: "PublishTargetNotMounted", Evicted: 1, Blocked: 1}})

	t.Run("recycling volumes show their progress; a held one needs a human", func(t *testing.T) {
		out, _ := status(t, env.Kubeconfig)
		mustContain(t, out, "VOLUMES BEING RECYCLED (2)",
			"shop/moving", "MountGone", "2 evicted, 0 waiting, 0 blocked, 0 left alone",
			"shop/held", "PublishTargetNotMounted", "1 evicted, 0 waiting, 1 blocked, 0 left alone")
		s := decodeStatus(t, must(status(t, env.Kubeconfig, "-o", "json")))
		if len(s.Recycling) != 2 || s.Recycling[0].PVC != "shop/held" || s.Recycling[1].Status.Recycle.Evicted != 2 {
			t.Errorf("recycling %+v, want shop/held and shop/moving with their progress", s.Recycling)
		}
		if !containsLine(s.Problems, "PVC shop/held on node node-2: recycle held") || containsLine(s.Problems, "shop/moving") {
			t.Errorf("problems %q, want the held recycle only", s.Problems)
		}
		for _, v := range s.Volumes {
			if v.Status.Result == healer.StatusRecycling {
				t.Errorf("a recycling volume is listed as left broken: %+v", v)
			}
		}
	})

	t.Run("kubectl healer status", func(t *testing.T) {
		kubectlPlugin(t, env.Kubeconfig)
	})

	t.Run("bad flags", func(t *testing.T) {
		cmd := newRootCommand("healerctl")
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetArgs([]string{"status", "--kubeconfig", env.Kubeconfig, "-o", "wide"})
		if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "want table, json or yaml") {
			t.Errorf("-o wide: %v", err)
		}
		cmd = newRootCommand("healerctl")
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetArgs([]string{"status", "--kubeconfig", filepath.Join(t.TempDir(), "missing")})
		if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
			t.Errorf("a missing kubeconfig: %v", err)
		}
	})
}

func must(out string, _ int) string { return out }

func containsLine(lines []string, part string) bool {
	for _, l := range lines {
		if strings.Contains(l, part) {
			return true
		}
	}
	return false
}

// kubectlPlugin runs `kubectl healer status` with healerctl installed as kubectl-healer on the
// PATH, as docs/operations.md says: kubectl finds the plugin, passes it the flags, and its exit
// code comes through. kubectl is on the CI machine; elsewhere, without one, only the plugin's
// own name is checked.
func kubectlPlugin(t *testing.T, kubeconfig string) {
	bin, err := harness.Build(harness.BuildOptions{Healerctl: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	plugin := filepath.Join(dir, pluginName)
	if err := os.Symlink(bin.Healerctl, plugin); err != nil {
		t.Fatal(err)
	}
	help, err := exec.Command(plugin, "status", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s status --help: %v\n%s", pluginName, err, help)
	}
	mustContain(t, string(help), "kubectl healer status [flags]")

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("kubectl is not on the PATH of the CI machine: %v", err)
		}
		t.Logf("kubectl healer status not run: no kubectl on this machine's PATH")
		return
	}
	cmd := exec.Command(kubectl, "healer", "status", "--kubeconfig", kubeconfig, "-o", "json")
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitNeedsHuman {
		t.Fatalf("kubectl healer status: %v, want exit code %d\n%s%s", err, exitNeedsHuman, stdout.String(), stderr.String())
	}
	s := decodeStatus(t, stdout.String())
	if len(s.Restarts) != 2 || len(s.Volumes) != 2 {
		t.Errorf("kubectl healer status -o json: %+v", s)
	}
	mustContain(t, stderr.String(), "things need a human")
}
