package integration

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
	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/fixtures"
)

// holdFinalizer keeps a deleted VolumeAttachment in the API with its deletionTimestamp set, as the
// external-attacher's finalizer does while it detaches.
const holdFinalizer = "integration.volume-healer.test/hold"

// fixture is one test's corner of the cluster: a CSI driver of its own, a namespace for the node
// plugins (CSIAddonsNodes, the stage Secret) and one for the applications (PVCs).
type fixture struct {
	t        *testing.T
	s        *suite
	name     string
	driver   string
	pluginNS string
	appNS    string
	cs       kubernetes.Interface
	c        client.Client
	classes  []string
}

// newFixture creates the driver's CSIDriver, the namespaces and the stage Secret. name must be a
// short DNS label: it prefixes every object of the test.
func newFixture(t *testing.T, name string) *fixture {
	t.Helper()
	s := requireSuite(t)
	// The apiserver takes thousands of requests while a test sets up; client-go's default of 5 per
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
		cs:       cs,
		c:        s.env.Client,
	}
	attach := true
	for _, ns := range []string{f.pluginNS, f.appNS} {
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
// CSIAddonsNodes (restart sweeps) and the StorageClasses (periodic schedules). Plugins and
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

// volume is one test volume: its API objects and the reference driver's record of it.
type volume struct {
	pv, pvc, handle, class string
	// mounter is what the driver stages the volume with: "rbd-nbd" can be healed, "krbd" cannot.
	mounter string
	node    *plugin
}

// ceph is the volume as the shared fixtures describe it.
func (v *volume) ceph() fixtures.CephVolume {
	return fixtures.CephVolume{PV: v.pv, PVC: v.pvc, Handle: v.handle, StorageClass: v.class, Node: v.node.node, Mounter: v.mounter}
}

func (v *volume) spec() driver.VolumeSpec {
	return driver.VolumeSpec{ID: v.handle, Mounter: v.mounter, VolumeContext: v.ceph().Attributes()}
}

// newVolumes describes n volumes of class on node p, named <fixture>-<tag>-<i>. mounter is the
// driver's: "rbd-nbd" or "krbd".
func (f *fixture) newVolumes(p *plugin, class, mounter, tag string, n int) []*volume {
	out := make([]*volume, 0, n)
	for i := range n {
		id := fmt.Sprintf("%s-%s-%04d", f.name, tag, i)
		out = append(out, &volume{
			pv: "pvc-" + id, pvc: "data-" + id, class: class, mounter: mounter, node: p,
			handle: "0001-0009-rook-ceph-0000000000000002-" + id,
		})
	}
	p.volumes = append(p.volumes, out...)
	return out
}

// createObjects creates each volume's PV (Bound), PVC and VolumeAttachment (attached), as
// provisioning, binding and attaching leave them. boundClaims also marks the PVCs Bound; the
// controller does not need it, and the 1,000-volume test saves the requests.
func (f *fixture) createObjects(vols []*volume, boundClaims bool) {
	f.t.Helper()
	objs := make([]fixtures.CephVolume, len(vols))
	for i, v := range vols {
		objs[i] = v.ceph()
	}
	if err := f.ceph().CreateVolumes(f.ctx(), objs, boundClaims, 12); err != nil {
		f.t.Fatal(err)
	}
}

// detach starts deleting the volume's VolumeAttachment and keeps it in the API with a finalizer,
// as the external-attacher does while the volume detaches.
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
}

// annotateClass sets one annotation on a StorageClass.
func (f *fixture) annotateClass(name, key, value string) {
	f.t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if _, err := f.cs.StorageV1().StorageClasses().Patch(f.ctx(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		f.t.Fatalf("annotate StorageClass %s: %v", name, err)
	}
}

// events returns the Events with reason on the object kind/name in namespace ns, and their total
// count (the recorder folds repeats of one Event into its count).
func (f *fixture) events(ns, kind, name, reason string) ([]corev1.Event, int) {
	f.t.Helper()
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
	list, err := f.cs.CoreV1().Events(ns).List(f.ctx(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		f.t.Fatalf("list Events: %v", err)
	}
	n := 0
	for _, ev := range list.Items {
		n += int(max(ev.Count, 1))
	}
	return list.Items, n
}

// pvcEvents returns the Events with reason on the volume's PVC.
func (f *fixture) pvcEvents(v *volume, reason string) ([]corev1.Event, int) {
	return f.events(f.appNS, "PersistentVolumeClaim", v.pvc, reason)
}

// pvcStatus reads the controller's status annotation from the volume's PVC.
func (f *fixture) pvcStatus(v *volume) (healer.VolumeStatus, bool) {
	f.t.Helper()
	pvc, err := f.cs.CoreV1().PersistentVolumeClaims(f.appNS).Get(f.ctx(), v.pvc, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("get PVC %s: %v", v.pvc, err)
	}
	raw, ok := pvc.Annotations[annotations.VolumeStatus]
	if !ok {
		return healer.VolumeStatus{}, false
	}
	var st healer.VolumeStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		f.t.Fatalf("PVC %s: annotation %s is not a volume status: %v: %s", v.pvc, annotations.VolumeStatus, err, raw)
	}
	return st, true
}

// addonsNode reads the plugin's CSIAddonsNode.
func (f *fixture) addonsNode(p *plugin) *csiaddonsv1alpha1.CSIAddonsNode {
	f.t.Helper()
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.c.Get(f.ctx(), p.addonsNodeKey(), &n); err != nil {
		f.t.Fatalf("get CSIAddonsNode of %s: %v", p.node, err)
	}
	return &n
}

// sweepFinished waits until the plugin's current restart marker is recorded as handled, which the
// controller does once the restart sweep has dealt with every volume, and returns the marker.
func (f *fixture) sweepFinished(p *plugin, timeout time.Duration) string {
	f.t.Helper()
	var marker string
	eventually(f.t, timeout, "the restart sweep of "+p.node+" to finish", func() (bool, string) {
		n := f.addonsNode(p)
		marker = trigger.RestartMarker(n)
		handled := n.Annotations[annotations.HandledMarker]
		return handled == marker, fmt.Sprintf("marker %q, handled %q", marker, handled)
	})
	return marker
}

// sweepMessages returns the messages of the RestartSweepFinished Events on the plugin's
// CSIAddonsNode and their total count.
func (f *fixture) sweepMessages(p *plugin) ([]string, int) {
	evs, n := f.events(f.pluginNS, "CSIAddonsNode", p.addonsNodeKey().Name, healer.ReasonRestartSweepFinished)
	msgs := make([]string, 0, len(evs))
	for _, ev := range evs {
		msgs = append(msgs, ev.Message)
	}
	return msgs, n
}

// eventWait bounds the wait for an Event: the controller's recorder sends Events in the background,
// so one may land after the sweep that caused it has been recorded as handled.
const eventWait = 15 * time.Second

// waitSweepMessage waits until some RestartSweepFinished Event's message on the plugin's
// CSIAddonsNode holds every part.
func (f *fixture) waitSweepMessage(p *plugin, parts ...string) {
	f.t.Helper()
	eventually(f.t, eventWait, fmt.Sprintf("a RestartSweepFinished Event saying %q", parts), func() (bool, string) {
		msgs, _ := f.sweepMessages(p)
		return slices.ContainsFunc(msgs, func(m string) bool {
			return !slices.ContainsFunc(parts, func(part string) bool { return !strings.Contains(m, part) })
		}), fmt.Sprintf("%q", msgs)
	})
}

// waitPVCEvent waits until the volume's PVC has an Event with reason.
func (f *fixture) waitPVCEvent(v *volume, reason string) {
	f.t.Helper()
	eventually(f.t, eventWait, fmt.Sprintf("a %s Event on PVC %s", reason, v.pvc), func() (bool, string) {
		_, n := f.pvcEvents(v, reason)
		return n > 0, "none yet"
	})
}

// condition returns the driver's condition of the volume.
func (v *volume) condition(t *testing.T) driver.Condition {
	t.Helper()
	got, err := v.node.drv().Volume(v.handle)
	if err != nil {
		t.Fatalf("volume %s: %v", v.pv, err)
	}
	return got.Condition
}

// setCondition breaks (or restores) a volume in the driver; it works on a stopped plugin too, as
// the driver keeps its volumes on disk.
func (v *volume) setCondition(t *testing.T, c driver.Condition, hang time.Duration) {
	t.Helper()
	if _, err := v.node.drv().SetCondition(v.handle, c, hang); err != nil {
		t.Fatalf("set %s %s: %v", v.pv, c, err)
	}
}

// eventually polls cond until it holds, and fails the test with cond's last description after
// timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last seen: %s)", timeout, what, state)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("test ended while waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
