package harness

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/fixtures"
)

// HoldFinalizer keeps a deleted VolumeAttachment in the API with its deletionTimestamp set, as the
// external-attacher's finalizer does while it detaches.
const HoldFinalizer = "harness.volume-healer.test/hold"

// EventWait bounds the wait for an Event: the controller's recorder sends Events in the
// background, so one may land after the sweep that caused it has been recorded as handled.
const EventWait = 15 * time.Second

// FixtureOptions name a fixture's objects.
type FixtureOptions struct {
	// Name prefixes every object of the fixture; a short DNS label. Required.
	Name string
	// Driver is the CSI driver's name. Default: <Name>.rbd.csi.ceph.com.
	Driver string
	// PluginNamespace holds the node plugins' CSIAddonsNodes and the stage Secret; AppNamespace
	// the claims. Default: <Name>-csi and <Name>-apps.
	PluginNamespace, AppNamespace string
}

// Fixture is one test's corner of the cluster: a CSI driver of its own with its CSIDriver, a
// namespace for the node plugins (CSIAddonsNodes, the stage Secret) and one for the applications
// (PVCs), StorageClasses, Nodes and volumes. Its helpers fail the test on an error.
type Fixture struct {
	T TB
	// Name prefixes the fixture's objects.
	Name string
	// Driver is the CSI driver's name.
	Driver string
	// PluginNS and AppNS are the plugin and application namespaces.
	PluginNS, AppNS string
	// Clientset reaches the apiserver as its administrator, without client-side rate limit.
	Clientset kubernetes.Interface
	// Client is a controller-runtime client that knows CSIAddonsNode.
	Client client.Client

	classes []string

	mu sync.Mutex
	// addonsNodes names, by node, the CSIAddonsNode that a node's healer sidecar registers on when
	// it is not the default one (UseAddonsNode).
	addonsNodes map[string]string
}

// NewFixture creates the fixture's namespaces, CSIDriver and stage Secret in env. When the test
// ends it removes what would make later tests' controllers act on its leftovers: the
// CSIAddonsNodes (restart sweeps) and the StorageClasses (periodic schedules).
func NewFixture(t TB, env *controlplane.Env, o FixtureOptions) *Fixture {
	t.Helper()
	// The apiserver takes thousands of requests while a test sets up; client-go's default of 5 per
	// second would make that minutes.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	f := &Fixture{
		T: t, Name: o.Name,
		Driver:    cmp.Or(o.Driver, o.Name+".rbd.csi.ceph.com"),
		PluginNS:  cmp.Or(o.PluginNamespace, o.Name+"-csi"),
		AppNS:     cmp.Or(o.AppNamespace, o.Name+"-apps"),
		Clientset: cs,
		Client:    env.Client,
	}
	attach := true
	for _, ns := range []string{f.PluginNS, f.AppNS} {
		f.Create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	f.Create(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: f.Driver}, Spec: storagev1.CSIDriverSpec{AttachRequired: &attach}})
	f.Create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.PluginNS, Name: fixtures.StageSecret},
		StringData: map[string]string{"userID": "csi-rbd-node", "userKey": "AQD0cG9vbGtleQ=="},
	})
	t.Cleanup(f.cleanUp)
	return f
}

// Ctx is the test's context.
func (f *Fixture) Ctx() context.Context { return f.T.Context() }

// Create creates obj.
func (f *Fixture) Create(obj client.Object) {
	f.T.Helper()
	if err := f.Client.Create(f.Ctx(), obj); err != nil {
		f.T.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// cleanUp runs last of the test's cleanups (they run last-registered first): node plugins and
// controllers have stopped by then.
func (f *Fixture) cleanUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.Client.DeleteAllOf(ctx, &csiaddonsv1alpha1.CSIAddonsNode{}, client.InNamespace(f.PluginNS)); err != nil {
		f.T.Errorf("clean up CSIAddonsNodes: %v", err)
	}
	for _, sc := range f.classes {
		if err := f.Clientset.StorageV1().StorageClasses().Delete(ctx, sc, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			f.T.Errorf("clean up StorageClass %s: %v", sc, err)
		}
	}
}

// Ceph is the fixture's cluster as test/fixtures builds it.
func (f *Fixture) Ceph() fixtures.CephCluster {
	return fixtures.CephCluster{Client: f.Clientset, Driver: f.Driver, PluginNamespace: f.PluginNS, AppNamespace: f.AppNS}
}

// StorageClass creates a Ceph RBD StorageClass of the fixture's driver, and returns its name;
// mounter "" is krbd.
func (f *Fixture) StorageClass(name, mounter string, annotations map[string]string) string {
	f.T.Helper()
	f.Create(f.Ceph().StorageClass(name, mounter, annotations))
	f.classes = append(f.classes, name)
	return name
}

// AnnotateClass sets one annotation on a StorageClass.
func (f *Fixture) AnnotateClass(name, key, value string) {
	f.T.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if _, err := f.Clientset.StorageV1().StorageClasses().Patch(f.Ctx(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		f.T.Fatalf("annotate StorageClass %s: %v", name, err)
	}
}

// CreateNode creates the Node object of a simulated node.
func (f *Fixture) CreateNode(name string) {
	f.T.Helper()
	f.Create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}})
}

// NewVolumes describes n volumes of class on node, named <fixture>-<tag>-<i>, whose driver ctl
// reaches. mounter is the driver's: "rbd-nbd" or "krbd". They exist nowhere yet: see
// CreateVolumes, and the node plugin's AddVolumes.
func (f *Fixture) NewVolumes(node string, ctl DriverControl, class, mounter, tag string, n int) []*Volume {
	out := make([]*Volume, 0, n)
	for i := range n {
		id := fmt.Sprintf("%s-%s-%04d", f.Name, tag, i)
		out = append(out, &Volume{
			CephVolume: fixtures.CephVolume{
				PV: "pvc-" + id, PVC: "data-" + id, StorageClass: class, Node: node, Mounter: mounter,
				Handle: "0001-0009-rook-ceph-0000000000000002-" + id,
			},
			Control: ctl,
		})
	}
	return out
}

// CreateVolumes creates each volume's PV (Bound), PVC and VolumeAttachment (attached), as
// provisioning, binding and attaching leave them. boundClaims also marks the PVCs Bound; the
// controller does not need it, and a test of many volumes saves the requests.
func (f *Fixture) CreateVolumes(vols []*Volume, boundClaims bool) {
	f.T.Helper()
	objs := make([]fixtures.CephVolume, len(vols))
	for i, v := range vols {
		objs[i] = v.CephVolume
	}
	if err := f.Ceph().CreateVolumes(f.Ctx(), objs, boundClaims, 12); err != nil {
		f.T.Fatalf("%v", err)
	}
}

// Detach starts deleting the volume's VolumeAttachment and keeps it in the API with a finalizer,
// as the external-attacher does while the volume detaches; from then on no call may reach the
// volume. The finalizer goes when the test ends.
func (f *Fixture) Detach(v *Volume) {
	f.T.Helper()
	f.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.Ceph().Release(ctx, v.CephVolume)
	})
	if err := f.Ceph().Detach(f.Ctx(), v.CephVolume, HoldFinalizer); err != nil {
		f.T.Fatalf("%v", err)
	}
	v.DetachedAt = time.Now()
}

// Events returns the Events with reason on the object kind/name in namespace ns, and their total
// count (the recorder folds repeats of one Event into its count).
func (f *Fixture) Events(ns, kind, name, reason string) ([]corev1.Event, int) {
	f.T.Helper()
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
	list, err := f.Clientset.CoreV1().Events(ns).List(f.Ctx(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		f.T.Fatalf("list Events: %v", err)
	}
	n := 0
	for _, ev := range list.Items {
		n += int(max(ev.Count, 1))
	}
	return list.Items, n
}

// PVCEvents returns the Events with reason on the volume's PVC.
func (f *Fixture) PVCEvents(v *Volume, reason string) ([]corev1.Event, int) {
	return f.Events(f.AppNS, "PersistentVolumeClaim", v.PVC, reason)
}

// WaitPVCEvent waits until the volume's PVC has an Event with reason.
func (f *Fixture) WaitPVCEvent(v *Volume, reason string) {
	f.T.Helper()
	Eventually(f.T, EventWait, fmt.Sprintf("a %s Event on PVC %s", reason, v.PVC), func() (bool, string) {
		_, n := f.PVCEvents(v, reason)
		return n > 0, "none yet"
	})
}

// PVCStatus reads the controller's status annotation from the volume's PVC.
func (f *Fixture) PVCStatus(v *Volume) (healer.VolumeStatus, bool) {
	f.T.Helper()
	pvc, err := f.Clientset.CoreV1().PersistentVolumeClaims(f.AppNS).Get(f.Ctx(), v.PVC, metav1.GetOptions{})
	if err != nil {
		f.T.Fatalf("get PVC %s: %v", v.PVC, err)
	}
	raw, ok := pvc.Annotations[annotations.VolumeStatus]
	if !ok {
		return healer.VolumeStatus{}, false
	}
	var st healer.VolumeStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		f.T.Fatalf("PVC %s: annotation %s is not a volume status: %v: %s", v.PVC, annotations.VolumeStatus, err, raw)
	}
	return st, true
}

// AddonsNodeKey names the CSIAddonsNode that the sidecar of node registers: the one UseAddonsNode
// set, else the one the sidecar creates when it finds none.
func (f *Fixture) AddonsNodeKey(node string) types.NamespacedName {
	f.mu.Lock()
	name, ok := f.addonsNodes[node]
	f.mu.Unlock()
	if !ok {
		name = sidecar.DefaultCSIAddonsNodeName(node, f.Driver)
	}
	return types.NamespacedName{Namespace: f.PluginNS, Name: name}
}

// UseAddonsNode says that the healer sidecar of node registers on the CSIAddonsNode name (one a
// csi-addons sidecar created, say): AddonsNodeKey and every helper that reads the node's restart
// sweeps look at that object from now on.
func (f *Fixture) UseAddonsNode(node, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addonsNodes == nil {
		f.addonsNodes = map[string]string{}
	}
	f.addonsNodes[node] = name
}

// AddonsNode reads the CSIAddonsNode of node.
func (f *Fixture) AddonsNode(node string) *csiaddonsv1alpha1.CSIAddonsNode {
	f.T.Helper()
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.Client.Get(f.Ctx(), f.AddonsNodeKey(node), &n); err != nil {
		f.T.Fatalf("get CSIAddonsNode of %s: %v", node, err)
	}
	return &n
}

// SweepFinished waits until the current restart marker of node is recorded as handled, which the
// controller does once the restart sweep has dealt with every volume, and returns the marker.
func (f *Fixture) SweepFinished(node string, timeout time.Duration) string {
	f.T.Helper()
	return f.SweepsFinished([]string{node}, timeout)[node]
}

// SweepsFinished waits until the current restart marker of every node is recorded as handled, and
// returns the markers by node. It lists the CSIAddonsNodes once per poll rather than reading each.
func (f *Fixture) SweepsFinished(nodes []string, timeout time.Duration) map[string]string {
	f.T.Helper()
	nodeOf := map[string]string{}
	for _, n := range nodes {
		nodeOf[f.AddonsNodeKey(n).Name] = n
	}
	markers := map[string]string{}
	Eventually(f.T, timeout, fmt.Sprintf("the restart sweeps of %d nodes to finish", len(nodes)), func() (bool, string) {
		var list csiaddonsv1alpha1.CSIAddonsNodeList
		if err := f.Client.List(f.Ctx(), &list, client.InNamespace(f.PluginNS)); err != nil {
			return false, err.Error()
		}
		var pending []string
		clear(markers)
		for _, obj := range list.Items {
			node, ok := nodeOf[obj.Name]
			if !ok {
				continue
			}
			marker := trigger.RestartMarker(&obj)
			markers[node] = marker
			if handled := obj.Annotations[annotations.HandledMarker]; handled != marker {
				pending = append(pending, fmt.Sprintf("%s (marker %q, handled %q)", obj.Name, marker, handled))
			}
		}
		if len(markers) < len(nodeOf) {
			return false, fmt.Sprintf("%d of %d CSIAddonsNodes exist", len(markers), len(nodeOf))
		}
		slices.Sort(pending)
		return len(pending) == 0, fmt.Sprintf("%d pending: %s", len(pending), strings.Join(pending[:min(len(pending), 5)], ", "))
	})
	return markers
}

// SweepPending waits until the restart sweep of node's current marker says it is pending (a
// RestartSweepPending Event: it could not reach every volume and is tried again), checks that the
// marker is not recorded as handled, and returns the marker.
func (f *Fixture) SweepPending(node string, timeout time.Duration) string {
	f.T.Helper()
	name := f.AddonsNodeKey(node).Name
	Eventually(f.T, timeout, fmt.Sprintf("a %s Event on CSIAddonsNode %s", healer.ReasonRestartSweepPending, name), func() (bool, string) {
		_, n := f.Events(f.PluginNS, "CSIAddonsNode", name, healer.ReasonRestartSweepPending)
		return n > 0, "none yet"
	})
	obj := f.AddonsNode(node)
	marker := trigger.RestartMarker(obj)
	if handled := obj.Annotations[annotations.HandledMarker]; handled == marker {
		f.T.Fatalf("CSIAddonsNode %s: restart %q recorded as handled while its sweep is pending", name, marker)
	}
	return marker
}

// SweepMessages returns the messages of the RestartSweepFinished Events on the CSIAddonsNode of
// node, and their total count.
func (f *Fixture) SweepMessages(node string) ([]string, int) {
	f.T.Helper()
	evs, n := f.Events(f.PluginNS, "CSIAddonsNode", f.AddonsNodeKey(node).Name, healer.ReasonRestartSweepFinished)
	msgs := make([]string, 0, len(evs))
	for _, ev := range evs {
		msgs = append(msgs, ev.Message)
	}
	return msgs, n
}

// WaitSweepMessage waits until the message of some RestartSweepFinished Event on the
// CSIAddonsNode of node holds every part.
func (f *Fixture) WaitSweepMessage(node string, parts ...string) {
	f.T.Helper()
	Eventually(f.T, EventWait, fmt.Sprintf("a RestartSweepFinished Event saying %q", parts), func() (bool, string) {
		msgs, _ := f.SweepMessages(node)
		return slices.ContainsFunc(msgs, func(m string) bool {
			return !slices.ContainsFunc(parts, func(part string) bool { return !strings.Contains(m, part) })
		}), fmt.Sprintf("%q", msgs)
	})
}

// RestartsPending lists the CSIAddonsNodes in namespace (every namespace when "") whose current
// restart marker is not recorded as handled yet, and counts the CSIAddonsNodes it saw.
func RestartsPending(ctx context.Context, c client.Client, namespace string) (pending []string, seen int, err error) {
	var list csiaddonsv1alpha1.CSIAddonsNodeList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, 0, err
	}
	for i := range list.Items {
		n := &list.Items[i]
		if n.Annotations[annotations.HandledMarker] != trigger.RestartMarker(n) {
			pending = append(pending, n.Name)
		}
	}
	return pending, len(list.Items), nil
}
