package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/cmd/healer-sidecar/sidecar"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/fixtures"
)

// holdFinalizer keeps a deleted VolumeAttachment in the API with its deletionTimestamp set, as the
// external-attacher's finalizer does while it detaches.
const holdFinalizer = "e2e.volume-healer.test/hold"

// policyLabel selects the policy ConfigMaps (the controller's default selector).
const policyLabel, policyLabelValue = annotations.PolicyLabel, annotations.PolicyLabelValue

// fixture is one test's corner of the cluster: a CSI driver of its own, a namespace for the node
// plugins (CSIAddonsNodes, the stage Secret), one for the applications (PVCs) and one for the
// controller's policy ConfigMaps.
type fixture struct {
	t        *testing.T
	s        *suite
	name     string
	driver   string
	pluginNS string
	appNS    string
	policyNS string
	cs       kubernetes.Interface
	c        client.Client
	classes  []string
}

// newFixture creates the driver's CSIDriver, the namespaces and the stage Secret. name must be a
// short DNS label: it prefixes every object of the test.
func newFixture(t *testing.T, name string) *fixture {
	t.Helper()
	s := requireSuite(t)
	// The apiserver takes hundreds of requests while a test sets up; client-go's default of 5 per
	// second would make that minutes.
	cfg := rest.CopyConfig(s.env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{
		t: t, s: s, name: name,
		driver:   name + ".rbd.csi.ceph.com",
		pluginNS: name + "-csi",
		appNS:    name + "-apps",
		policyNS: name + "-policy",
		cs:       cs,
		c:        s.env.Client,
	}
	attach := true
	for _, ns := range []string{f.pluginNS, f.appNS, f.policyNS} {
		f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	f.create(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: f.driver}, Spec: storagev1.CSIDriverSpec{AttachRequired: &attach}})
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.pluginNS, Name: fixtures.StageSecret},
		StringData: map[string]string{"userID": "csi-rbd-node", "userKey": "AQD0cG9vbGtleQ=="},
	})
	t.Cleanup(f.cleanUp)
	return f
}

func (f *fixture) ctx() context.Context { return f.t.Context() }

func (f *fixture) create(obj client.Object) {
	f.t.Helper()
	if err := f.c.Create(f.ctx(), obj); err != nil {
		f.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// cleanUp removes what would make later tests' controllers act on this test's leftovers: the
// CSIAddonsNodes (restart sweeps) and the StorageClasses (periodic schedules). Node plugins and
// controllers have stopped by then: cleanups run last-registered first.
func (f *fixture) cleanUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.c.DeleteAllOf(ctx, &csiaddonsv1alpha1.CSIAddonsNode{}, client.InNamespace(f.pluginNS)); err != nil {
		f.t.Errorf("clean up CSIAddonsNodes: %v", err)
	}
	for _, sc := range f.classes {
		if err := f.cs.StorageV1().StorageClasses().Delete(ctx, sc, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			f.t.Errorf("clean up StorageClass %s: %v", sc, err)
		}
	}
}

// storageClass creates a Ceph RBD StorageClass of the fixture's driver; mounter "" is krbd.
func (f *fixture) storageClass(name, mounter string, annotations map[string]string) string {
	f.t.Helper()
	f.create(f.ceph().StorageClass(name, mounter, annotations))
	f.classes = append(f.classes, name)
	return name
}

// ceph is the fixture's cluster as the shared fixtures build it.
func (f *fixture) ceph() fixtures.CephCluster {
	return fixtures.CephCluster{Client: f.cs, Driver: f.driver, PluginNamespace: f.pluginNS, AppNamespace: f.appNS}
}

func nodeObject(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
}

// createObjects creates each volume's PV (Bound), PVC (Bound) and VolumeAttachment (attached), as
// provisioning, binding and attaching leave them.
func (f *fixture) createObjects(vols []*volume) {
	f.t.Helper()
	objs := make([]fixtures.CephVolume, len(vols))
	for i, v := range vols {
		objs[i] = v.ceph()
	}
	if err := f.ceph().CreateVolumes(f.ctx(), objs, true, 8); err != nil {
		f.t.Fatal(err)
	}
}

// detach starts deleting the volume's VolumeAttachment and keeps it in the API with a finalizer,
// as the external-attacher does while the volume detaches. From then on no call may reach the
// volume.
func (f *fixture) detach(v *volume) {
	f.t.Helper()
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.ceph().Release(ctx, v.ceph())
	})
	if err := f.ceph().Detach(f.ctx(), v.ceph(), holdFinalizer); err != nil {
		f.t.Fatal(err)
	}
	v.detachedAt = time.Now()
}

// addonsNodeKey names the CSIAddonsNode the node's sidecar registers.
func (f *fixture) addonsNodeKey(n *node) types.NamespacedName {
	return types.NamespacedName{Namespace: f.pluginNS, Name: sidecar.DefaultCSIAddonsNodeName(n.name, f.driver)}
}

// addonsNode reads the node's CSIAddonsNode.
func (f *fixture) addonsNode(n *node) (*csiaddonsv1alpha1.CSIAddonsNode, error) {
	var obj csiaddonsv1alpha1.CSIAddonsNode
	if err := f.c.Get(f.ctx(), f.addonsNodeKey(n), &obj); err != nil {
		return nil, err
	}
	return &obj, nil
}

// sweepFinished waits until the node's current restart marker is recorded as handled, which the
// controller does once the restart sweep has dealt with every volume.
func (f *fixture) sweepFinished(n *node, timeout time.Duration) {
	f.t.Helper()
	f.sweepsFinished([]*node{n}, timeout)
}

// sweepsFinished waits until the current restart marker of every node is recorded as handled. It
// lists the CSIAddonsNodes once per poll rather than reading each.
func (f *fixture) sweepsFinished(nodes []*node, timeout time.Duration) {
	f.t.Helper()
	want := map[string]bool{}
	for _, n := range nodes {
		want[f.addonsNodeKey(n).Name] = true
	}
	eventually(f.t, timeout, fmt.Sprintf("the restart sweeps of %d nodes to finish", len(nodes)), func() (bool, string) {
		var list csiaddonsv1alpha1.CSIAddonsNodeList
		if err := f.c.List(f.ctx(), &list, client.InNamespace(f.pluginNS)); err != nil {
			return false, err.Error()
		}
		var pending []string
		seen := 0
		for _, obj := range list.Items {
			if !want[obj.Name] {
				continue
			}
			seen++
			marker := trigger.RestartMarker(&obj)
			if handled := obj.Annotations[annotations.HandledMarker]; handled != marker {
				pending = append(pending, fmt.Sprintf("%s (marker %q, handled %q)", obj.Name, marker, handled))
			}
		}
		if seen < len(want) {
			return false, fmt.Sprintf("%d of %d CSIAddonsNodes exist", seen, len(want))
		}
		slices.Sort(pending)
		return len(pending) == 0, fmt.Sprintf("%d pending: %s", len(pending), strings.Join(pending[:min(len(pending), 5)], ", "))
	})
}

// sweepEvents returns the messages of the RestartSweepFinished Events on the node's CSIAddonsNode.
func (f *fixture) sweepEvents(n *node) []string {
	f.t.Helper()
	sel := fields.Set{"involvedObject.kind": "CSIAddonsNode", "involvedObject.name": f.addonsNodeKey(n).Name, "reason": "RestartSweepFinished"}.AsSelector().String()
	list, err := f.cs.CoreV1().Events(f.pluginNS).List(f.ctx(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		f.t.Fatalf("list Events: %v", err)
	}
	var out []string
	for _, ev := range list.Items {
		out = append(out, ev.Message)
	}
	return out
}

// setPolicy creates or replaces the policy ConfigMap name in the controller's policy namespace,
// with one module.
func (f *fixture) setPolicy(name, rego string) {
	f.t.Helper()
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.policyNS, Name: name, Labels: map[string]string{policyLabel: policyLabelValue}},
		Data:       map[string]string{"policy.rego": rego},
	}
	_, err := f.cs.CoreV1().ConfigMaps(f.policyNS).Create(f.ctx(), cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, _ := json.Marshal(map[string]any{"data": cm.Data})
		_, err = f.cs.CoreV1().ConfigMaps(f.policyNS).Patch(f.ctx(), name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		f.t.Fatalf("write policy ConfigMap %s: %v", name, err)
	}
}

// policyStatus reads the controller's status annotation of a policy ConfigMap; ok is false while
// there is none.
func (f *fixture) policyStatus(name string) (st policy.PolicyStatus, ok bool, err error) {
	cm, err := f.cs.CoreV1().ConfigMaps(f.policyNS).Get(f.ctx(), name, metav1.GetOptions{})
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
	eventually(f.t, time.Minute, fmt.Sprintf("policy ConfigMap %s to be %s", name, status), func() (bool, string) {
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

// eventually polls cond until it holds, and fails the test with cond's last description after
// timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := waitFor(t.Context(), timeout, what, cond); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds, and returns an error with cond's last description after
// timeout or when ctx ends. It may run in any goroutine.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s (last seen: %s)", timeout, what, state)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting for %s: %w (last seen: %s)", what, ctx.Err(), state)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
