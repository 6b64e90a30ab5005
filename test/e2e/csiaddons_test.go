package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/harness"
)

// The node plugin pods of these tests run as ceph-csi's RBD DaemonSet runs them with csi-addons:
// the driver, the healer sidecar and the real csi-addons sidecar, both sidecars on the driver's
// CSI-Addons socket.
const (
	// addonsDaemonSet owns the node plugin pods; the csi-addons sidecar names its CSIAddonsNode
	// after it.
	addonsDaemonSet = "csi-rbdplugin"
	// addonsAccount is the pods' ServiceAccount.
	addonsAccount = "csi-rbdplugin"
	// lostDriver is what the csi-addons sidecar leaves in its termination log when it exits
	// because its connection to the driver broke.
	lostDriver = "Lost connection to CSI driver, exiting"
)

// addonsDeployment creates what the csi-addons sidecar reads around its pod: the DaemonSet that
// owns the node plugin pods (it reads the pod's owner to name its CSIAddonsNode and to own it),
// and the pods' ServiceAccount, bound to cluster-admin like the test's own credentials (a driver's
// deployment grants the sidecar a narrower role). No controller runs the DaemonSet: the tests
// create its pods and run their containers.
func (f *fixture) addonsDeployment() *appsv1.DaemonSet {
	f.t.Helper()
	f.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.PluginNS, Name: addonsAccount}})
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: f.Name + "-" + addonsAccount},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.PluginNS, Name: addonsAccount}},
	}
	f.Create(binding)
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.Client.Delete(ctx, binding); err != nil {
			f.t.Errorf("clean up ClusterRoleBinding %s: %v", binding.Name, err)
		}
	})
	labels := map[string]string{"app": addonsDaemonSet}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.PluginNS, Name: addonsDaemonSet},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       addonsPodSpec(""),
			},
		},
	}
	f.Create(ds)
	return ds
}

// addonsPodSpec is the node plugin pod's spec on node.
func addonsPodSpec(node string) corev1.PodSpec {
	return corev1.PodSpec{
		NodeName:           node,
		ServiceAccountName: addonsAccount,
		Containers: []corev1.Container{
			{Name: "csi-rbdplugin", Image: "quay.io/cephcsi/cephcsi:canary"},
			{Name: "healer-sidecar", Image: "volume-healer/healer-sidecar:v0.1.0"},
			{Name: "csi-addons", Image: "quay.io/csiaddons/k8s-sidecar:v0.14.0"},
		},
	}
}

// addonsPlugin is a node plugin pod with the real csi-addons sidecar: a node (the reference driver
// and the healer sidecar, sharing the pod's UID) and the csi-addons sidecar run as a container of
// the pod, on the driver's socket. Its Pod object exists, bound to the node and owned by the
// DaemonSet; replacing the pod creates a new one, with a new UID.
type addonsPlugin struct {
	*node
	ds   *appsv1.DaemonSet
	bins harness.CSIAddonsBinaries
	// pod is the current Pod object; pods counts those created.
	pod  *corev1.Pod
	pods int
	// addons is the current csi-addons sidecar, serving the csi-addons controller on addonsAddr;
	// addonsStarts counts its starts.
	addons       *harness.Container
	addonsAddr   string
	addonsStarts int
}

// newAddonsPlugin creates the Node and the node plugin's first Pod object; nothing runs yet.
func (f *fixture) newAddonsPlugin(ds *appsv1.DaemonSet, name string, bins harness.CSIAddonsBinaries) *addonsPlugin {
	f.t.Helper()
	p := &addonsPlugin{node: f.newNode(name), ds: ds, bins: bins}
	p.node.pod = func() string { return string(p.pod.UID) }
	// Registered after the node's clean-up, so it runs before it: the csi-addons sidecar stops
	// before the driver it talks to.
	f.t.Cleanup(func() {
		if err := p.stopAddons(); err != nil {
			f.t.Errorf("stop the csi-addons sidecar on %s: %v", name, err)
		}
	})
	p.createPod()
	return p
}

// addonsNodeName is the CSIAddonsNode the csi-addons sidecar of this plugin owns:
// <node>-<namespace>-<owner kind>-<owner name>.
func (p *addonsPlugin) addonsNodeName() string {
	return fmt.Sprintf("%s-%s-daemonset-%s", p.name, p.ds.Namespace, p.ds.Name)
}

// createPod creates a new Pod object of the DaemonSet on the node, as the DaemonSet controller and
// the scheduler would.
func (p *addonsPlugin) createPod() {
	p.f.t.Helper()
	p.pods++
	controller := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.ds.Namespace,
			Name:      fmt.Sprintf("%s-%s-%d", p.ds.Name, p.name, p.pods),
			Labels:    p.ds.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "DaemonSet", Name: p.ds.Name, UID: p.ds.UID, Controller: &controller,
			}},
		},
		Spec: addonsPodSpec(p.name),
	}
	p.f.Create(pod)
	p.pod = pod
}

// start starts the pod's containers: the driver, the csi-addons sidecar, then the healer sidecar,
// told to register on the csi-addons sidecar's CSIAddonsNode as docs/sidecar.md asks. It returns
// once both sidecars have registered.
func (p *addonsPlugin) start() {
	p.f.t.Helper()
	p.startDriver()
	p.startAddons()
	p.sidecarArgs = []string{"--csiaddonsnode-name", p.addonsNodeName()}
	p.f.UseAddonsNode(p.name, p.addonsNodeName())
	p.startSidecar(true)
}

// replace stops every container of the pod and starts them again in a new pod, as a DaemonSet
// rollout or a deleted pod does: the healer sidecar writes a restart marker with the new pod UID.
func (p *addonsPlugin) replace() {
	p.f.t.Helper()
	if err := p.stopAddons(); err != nil {
		p.f.t.Fatal(err)
	}
	if err := p.stop(); err != nil {
		p.f.t.Fatal(err)
	}
	if err := p.f.Client.Delete(p.f.Ctx(), p.pod); err != nil {
		p.f.t.Fatalf("delete Pod %s: %v", p.pod.Name, err)
	}
	p.createPod()
	p.start()
}

// startAddons starts the csi-addons sidecar as a container of the current pod, serving the
// csi-addons controller on a new loopback port, and returns once it has created or updated its
// CSIAddonsNode and answers on that port (it registers first, then listens).
func (p *addonsPlugin) startAddons() {
	p.f.t.Helper()
	var before string
	if obj, err := p.getAddonsNode(); err == nil {
		before = obj.Annotations[annotations.CSIAddonsRestart]
	}
	// lastUpdatedAt has whole seconds: a second start within the second of the one before would
	// write the same value (kubelet's restart back-off never restarts a container that fast).
	if last, err := time.Parse(time.RFC3339, before); err == nil {
		if wait := time.Until(last.Add(time.Second)); wait > 0 {
			time.Sleep(wait)
		}
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		p.f.t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	p.addonsStarts++
	args := []string{
		"--node-id", p.name,
		"--csi-addons-address", p.endpoint(),
		"--controller-ip", host,
		"--controller-port", port,
		"--pod", p.pod.Name,
		"--namespace", p.pod.Namespace,
		"--pod-uid", string(p.pod.UID),
	}
	c, err := p.f.s.StartContainer(p.f.Ctx(), p.f.s.Procs, harness.ContainerOptions{
		Name:           "csi-addons sidecar on " + p.name,
		Runner:         p.bins.Runner,
		Binary:         p.bins.Sidecar,
		Args:           args,
		Namespace:      p.pod.Namespace,
		ServiceAccount: addonsAccount,
		Dir:            filepath.Join(p.sockDir, "csi-addons"),
		LogPath:        filepath.Join(p.logDir, fmt.Sprintf("%s-csi-addons-%d.log", p.name, p.addonsStarts)),
	})
	if err != nil {
		p.f.t.Fatal(err)
	}
	p.addons, p.addonsAddr = c, addr
	harness.Eventually(p.f.t, time.Minute, "the csi-addons sidecar on "+p.name+" to register", func() (bool, string) {
		if !c.Running() {
			p.f.t.Fatalf("the csi-addons sidecar on %s exited (%s):\n%s", p.name, c.ExitStatus(), c.LogTail(30))
		}
		obj, err := p.getAddonsNode()
		if err != nil {
			return false, err.Error()
		}
		pod, at := obj.Annotations[annotations.CSIAddonsPod], obj.Annotations[annotations.CSIAddonsRestart]
		return pod == string(p.pod.UID) && at != "" && at != before, fmt.Sprintf("createdByPodUID %q, lastUpdatedAt %q", pod, at)
	})
	harness.Eventually(p.f.t, 30*time.Second, "the csi-addons sidecar on "+p.name+" to answer GetIdentity", func() (bool, string) {
		if !c.Running() {
			p.f.t.Fatalf("the csi-addons sidecar on %s exited (%s):\n%s", p.name, c.ExitStatus(), c.LogTail(30))
		}
		id, err := p.callAddons(p.f.Ctx())
		if err != nil {
			return false, err.Error()
		}
		if id.GetName() != p.f.Driver {
			p.f.t.Fatalf("GetIdentity through the csi-addons sidecar on %s names driver %q, want %s", p.name, id.GetName(), p.f.Driver)
		}
		return true, ""
	})
}

// stopAddons stops the csi-addons sidecar with SIGTERM.
func (p *addonsPlugin) stopAddons() error {
	if p.addons == nil {
		return nil
	}
	return p.addons.Stop(processGrace)
}

func (p *addonsPlugin) getAddonsNode() (*csiaddonsv1alpha1.CSIAddonsNode, error) {
	var obj csiaddonsv1alpha1.CSIAddonsNode
	err := p.f.Client.Get(p.f.Ctx(), types.NamespacedName{Namespace: p.ds.Namespace, Name: p.addonsNodeName()}, &obj)
	return &obj, err
}

// callAddons calls Identity.GetIdentity on the csi-addons sidecar as the csi-addons controller
// does when it connects: over TLS to the sidecar's self-signed certificate, which the controller
// does not verify either, with a ServiceAccount token that the sidecar reviews. The sidecar relays
// the call to the driver.
func (p *addonsPlugin) callAddons(ctx context.Context) (*identity.GetIdentityResponse, error) {
	token, err := os.ReadFile(p.f.s.TokenFile)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(p.addonsAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+strings.TrimSpace(string(token)))
	return identity.NewIdentityClient(conn).GetIdentity(ctx, &identity.GetIdentityRequest{})
}

// TestCSIAddonsNodeDeleted deletes the CSIAddonsNode of a node plugin pod that runs the real
// csi-addons sidecar beside the healer sidecar. The csi-addons sidecar recreates it within a
// second, without the healer sidecar's annotations; the healer sidecar, which watches the object,
// puts its restart marker and endpoint back within seconds, so that the controller still reaches
// it. The recreated object records no handled restart and is swept once more, through the healer
// sidecar, without a failed call: the controller runs with the default restart.debounce (2s),
// which outlasts the moment the object names only the csi-addons sidecar. The pod replaced
// afterwards is swept and its broken volumes are healed.
func TestCSIAddonsNodeDeleted(t *testing.T) {
	f := newFixture(t, "addons-deleted")
	bins := f.s.CSIAddons(t)
	ds := f.addonsDeployment()
	nbd := f.StorageClass("addons-deleted-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 4, perDriver: 4, perNode: 2}
	p := f.newAddonsPlugin(ds, "addons-deleted-node-1", bins)
	gone := f.newVolumes(p.node, nbd, "rbd-nbd", "gone", 3)
	f.newVolumes(p.node, nbd, "rbd-nbd", "healthy", 2)
	f.CreateVolumes(p.volumes, true)
	p.start()
	f.startController("deleted", b.withSettings(map[string]string{"RESTART_DEBOUNCE": "2s"}))
	f.SweepFinished(p.name, time.Minute)

	before := f.AddonsNode(p.name)
	if owners := before.OwnerReferences; len(owners) != 1 || owners[0].UID != ds.UID {
		t.Errorf("CSIAddonsNode %s is owned by %v, want the DaemonSet %s", before.Name, owners, ds.Name)
	}
	deleted := time.Now()
	if err := f.Client.Delete(f.Ctx(), before); err != nil {
		t.Fatalf("delete CSIAddonsNode %s: %v", before.Name, err)
	}
	var recreated time.Duration
	harness.Eventually(t, 10*time.Second, "the csi-addons sidecar to recreate CSIAddonsNode "+before.Name, func() (bool, string) {
		obj, err := p.getAddonsNode()
		if err != nil {
			return false, err.Error()
		}
		recreated = time.Since(deleted)
		return obj.UID != before.UID && obj.Annotations[annotations.CSIAddonsPod] == string(p.pod.UID), fmt.Sprintf("UID %s, annotations %v", obj.UID, obj.Annotations)
	})
	if recreated > time.Second {
		t.Errorf("the csi-addons sidecar took %s to recreate CSIAddonsNode %s, want less than a second", recreated, before.Name)
	}
	harness.Eventually(t, 10*time.Second, "the healer sidecar to put its annotations back on CSIAddonsNode "+before.Name, func() (bool, string) {
		obj, err := p.getAddonsNode()
		if err != nil {
			return false, err.Error()
		}
		marker, endpoint := obj.Annotations[annotations.HealerRestart], obj.Annotations[annotations.Endpoint]
		return marker == before.Annotations[annotations.HealerRestart] && endpoint == before.Annotations[annotations.Endpoint],
			fmt.Sprintf("marker %q, endpoint %q", marker, endpoint)
	})
	t.Logf("the csi-addons sidecar recreated CSIAddonsNode %s %s after its deletion, the healer sidecar's annotations were back after %s",
		before.Name, recreated.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond))
	f.SweepFinished(p.name, time.Minute)
	harness.Eventually(t, harness.EventWait, "the RestartSweepFinished Event of the recreated CSIAddonsNode", func() (bool, string) {
		_, n := f.Events(f.PluginNS, "CSIAddonsNode", before.Name, healer.ReasonRestartSweepFinished)
		return n == 2, fmt.Sprintf("%d RestartSweepFinished Events", n)
	})
	if msgs, _ := f.SweepMessages(p.name); slices.ContainsFunc(msgs, func(m string) bool { return !strings.Contains(m, " 0 failed") }) {
		t.Errorf("a restart sweep had failed volumes: %q", msgs)
	}
	if evs, n := f.Events(f.PluginNS, "CSIAddonsNode", before.Name, healer.ReasonRestartSweepPending); n != 0 {
		t.Errorf("%d RestartSweepPending Events after the deletion, first %q: the sweep of the recreated object ran before the healer sidecar's annotations were back", n, evs[0].Message)
	}

	// The pod is replaced; the mounters died with the old one.
	for _, v := range gone {
		v.SetCondition(t, control.Gone, 0)
	}
	p.replace()
	f.SweepFinished(p.name, time.Minute)
	f.verify([]*node{p.node}, b, outcome{healed: gone})
	f.WaitSweepMessage(p.name, fmt.Sprintf("%d healed", len(gone)), "0 failed")
}

// TestHealerSidecarBeforeCSIAddonsSidecar starts the healer sidecar before the csi-addons sidecar,
// without --csiaddonsnode-name: the healer sidecar creates a CSIAddonsNode of its own, and the
// csi-addons sidecar then creates its own for the same driver and node. The healer sidecar,
// restarted in the same pod on a new port, registers on the csi-addons sidecar's object and takes
// its endpoint off its first one; the restart sweep reaches the new endpoint and heals, and its
// Events go to the object that carries the new restart marker.
func TestHealerSidecarBeforeCSIAddonsSidecar(t *testing.T) {
	f := newFixture(t, "addons-two")
	bins := f.s.CSIAddons(t)
	ds := f.addonsDeployment()
	nbd := f.StorageClass("addons-two-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 4, perDriver: 4, perNode: 2}
	p := f.newAddonsPlugin(ds, "addons-two-node-1", bins)
	gone := f.newVolumes(p.node, nbd, "rbd-nbd", "gone", 2)
	f.newVolumes(p.node, nbd, "rbd-nbd", "healthy", 2)
	f.CreateVolumes(p.volumes, true)

	p.startDriver()
	p.startSidecar(true)
	own := f.AddonsNodeKey(p.name).Name
	oldEndpoint := f.AddonsNode(p.name).Annotations[annotations.Endpoint]
	f.startController("two", b.settings())
	f.SweepFinished(p.name, time.Minute)

	p.startAddons()
	theirs := p.addonsNodeName()
	want := []string{own, theirs}
	slices.Sort(want)
	if names := f.addonsNodesOf(p.name); !slices.Equal(names, want) {
		t.Fatalf("CSIAddonsNodes of %s on %s: %v, want %s (the healer sidecar's) and %s (the csi-addons sidecar's)", f.Driver, p.name, names, own, theirs)
	}
	// The csi-addons sidecar's new object is a restart too. Its sweep reaches the healer sidecar
	// through the endpoint on the healer sidecar's object, which also gets its Events: the
	// controller reports on the object that names the sidecar it calls.
	f.UseAddonsNode(p.name, theirs)
	f.SweepFinished(p.name, time.Minute)
	const ownFinished = 2
	harness.Eventually(t, harness.EventWait, "the RestartSweepFinished Events of both sweeps on CSIAddonsNode "+own, func() (bool, string) {
		_, n := f.Events(f.PluginNS, "CSIAddonsNode", own, healer.ReasonRestartSweepFinished)
		return n == ownFinished, fmt.Sprint(n)
	})

	for _, v := range gone {
		v.SetCondition(t, control.Gone, 0)
	}
	if err := p.stopSidecar(); err != nil {
		t.Fatal(err)
	}
	p.startSidecar(true)
	obj := f.AddonsNode(p.name)
	newEndpoint := obj.Annotations[annotations.Endpoint]
	if newEndpoint == "" || newEndpoint == oldEndpoint {
		t.Errorf("CSIAddonsNode %s names the healer sidecar at %q after its restart; it listened at %q before and listens on a new port now", theirs, newEndpoint, oldEndpoint)
	}
	harness.Eventually(t, 10*time.Second, "the healer sidecar to take its endpoint off CSIAddonsNode "+own, func() (bool, string) {
		var first csiaddonsv1alpha1.CSIAddonsNode
		if err := f.Client.Get(f.Ctx(), types.NamespacedName{Namespace: f.PluginNS, Name: own}, &first); err != nil {
			return false, err.Error()
		}
		endpoint, ok := first.Annotations[annotations.Endpoint]
		return !ok, "endpoint " + endpoint
	})
	f.SweepFinished(p.name, time.Minute)
	f.verify([]*node{p.node}, b, outcome{healed: gone})
	f.WaitSweepMessage(p.name, fmt.Sprintf("%d healed", len(gone)), "0 failed")
	if _, n := f.Events(f.PluginNS, "CSIAddonsNode", own, healer.ReasonRestartSweepFinished); n != ownFinished {
		t.Errorf("CSIAddonsNode %s, which no longer names the healer sidecar, got %d more RestartSweepFinished Events", own, n-ownFinished)
	}
}

// addonsNodesOf lists the names of the CSIAddonsNodes of the fixture's driver on node, sorted.
func (f *fixture) addonsNodesOf(node string) []string {
	f.t.Helper()
	var list csiaddonsv1alpha1.CSIAddonsNodeList
	if err := f.Client.List(f.Ctx(), &list, client.InNamespace(f.PluginNS)); err != nil {
		f.t.Fatalf("list CSIAddonsNodes: %v", err)
	}
	var names []string
	for _, n := range list.Items {
		if n.Spec.Driver.Name == f.Driver && n.Spec.Driver.NodeID == node {
			names = append(names, n.Name)
		}
	}
	slices.Sort(names)
	return names
}

// TestDriverRestartUnderCSIAddonsSidecar restarts the driver container of a node plugin pod that
// runs the real csi-addons sidecar. The healer sidecar sees the driver come back on the socket and
// marks the restart, which is swept and healed. The csi-addons sidecar notices only at its next
// call to the driver, which the test makes as the csi-addons controller would: it exits, and is
// restarted in the same pod, changing lastUpdatedAt again. That restart of the csi-addons sidecar
// alone kills no mounter: by default it causes no sweep, with
// restart.sweepCSIAddonsSidecarRestarts it does.
func TestDriverRestartUnderCSIAddonsSidecar(t *testing.T) {
	tests := map[string]struct {
		name      string
		settings  map[string]string
		wantSweep bool
	}{
		"by default": {name: "addons-drv"},
		"with restart.sweepCSIAddonsSidecarRestarts": {
			name:      "addons-drv-sweep",
			settings:  map[string]string{"RESTART_SWEEP_CSIADDONS_SIDECAR_RESTARTS": "true"},
			wantSweep: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.name)
			bins := f.s.CSIAddons(t)
			ds := f.addonsDeployment()
			nbd := f.StorageClass(tc.name+"-rbd-nbd", "rbd-nbd", nil)
			b := budgets{global: 4, perDriver: 4, perNode: 2}
			p := f.newAddonsPlugin(ds, tc.name+"-node-1", bins)
			gone := f.newVolumes(p.node, nbd, "rbd-nbd", "gone", 2)
			f.newVolumes(p.node, nbd, "rbd-nbd", "healthy", 2)
			f.CreateVolumes(p.volumes, true)
			p.start()
			f.startController(tc.name, b.withSettings(tc.settings))
			// The object's first marker is the csi-addons sidecar's alone; the healer sidecar's
			// registration changes it again. Both must be swept before the volumes break, or
			// the second sweep heals them before the driver restart the test is about.
			harness.Eventually(t, 30*time.Second, "the healer sidecar on "+p.name+" to register", func() (bool, string) {
				return f.AddonsNode(p.name).Annotations[annotations.HealerRestart] != "", "no healer restart marker yet"
			})
			f.SweepFinished(p.name, time.Minute)

			// The driver container restarts; its mounters die with it.
			for _, v := range gone {
				v.SetCondition(t, control.Gone, 0)
			}
			marker := f.AddonsNode(p.name).Annotations[annotations.HealerRestart]
			if err := p.stopDriver(); err != nil {
				t.Fatal(err)
			}
			p.startDriver()
			var restarted string
			harness.Eventually(t, 30*time.Second, "the healer sidecar on "+p.name+" to mark the driver restart", func() (bool, string) {
				restarted = f.AddonsNode(p.name).Annotations[annotations.HealerRestart]
				return restarted != marker, "marker " + restarted
			})
			// SweepFinished waits for the marker the object carries when it looks: had the marker
			// of the driver restart been replaced by the one before it (already handled), the
			// wait would end at once, with no sweep of the restart.
			if swept := f.SweepFinished(p.name, time.Minute); !strings.Contains(swept, restarted) {
				t.Fatalf("restart marker %q recorded as handled; the driver restart was marked %q", swept, restarted)
			}
			f.verify([]*node{p.node}, b, outcome{healed: gone})
			f.WaitSweepMessage(p.name, fmt.Sprintf("%d healed", len(gone)), "0 failed")

			// The csi-addons sidecar learns of the driver restart only at its next call to the
			// driver, the first since the restart.
			if !p.addons.Running() {
				t.Errorf("the csi-addons sidecar on %s exited before a call reached it (%s)", p.name, p.addons.ExitStatus())
			}
			harness.Eventually(t, 30*time.Second, "the csi-addons sidecar on "+p.name+" to exit at its next call to the restarted driver", func() (bool, string) {
				if !p.addons.Running() {
					return true, ""
				}
				_, err := p.callAddons(f.Ctx())
				return false, fmt.Sprintf("running; GetIdentity: %v", err)
			})
			if status, msg := p.addons.ExitStatus(), p.addons.TerminationMessage(); status != "exit status 1" || msg != lostDriver {
				t.Errorf("the csi-addons sidecar ended with %q and termination message %q, want exit status 1 and %q", status, msg, lostDriver)
			}

			// The kubelet restarts the container in the same pod.
			calls := probeCalls(t, p.node)
			_, started := f.Events(f.PluginNS, "CSIAddonsNode", p.addonsNodeName(), healer.ReasonRestartSweepStarted)
			handled := f.AddonsNode(p.name).Annotations[annotations.HandledMarker]
			p.startAddons()
			if !tc.wantSweep {
				// Nothing to wait for: the sweep would start 0.3 s (the debounce) after the change.
				deadline := time.Now().Add(5 * time.Second)
				for time.Now().Before(deadline) {
					if n := probeCalls(t, p.node); n != calls {
						t.Fatalf("the driver served %d ProbeVolume calls after the csi-addons sidecar alone restarted", n-calls)
					}
					if _, n := f.Events(f.PluginNS, "CSIAddonsNode", p.addonsNodeName(), healer.ReasonRestartSweepStarted); n != started {
						t.Fatalf("%d RestartSweepStarted Events after the csi-addons sidecar alone restarted", n-started)
					}
					time.Sleep(harness.PollInterval)
				}
				obj := f.AddonsNode(p.name)
				if got := obj.Annotations[annotations.HandledMarker]; got != handled {
					t.Errorf("handled marker %q, want it unchanged at %q", got, handled)
				}
				if trigger.RestartMarker(obj) == handled {
					t.Errorf("restart marker %q unchanged by the csi-addons sidecar's restart", handled)
				}
				return
			}
			f.SweepFinished(p.name, time.Minute)
			if _, n := f.Events(f.PluginNS, "CSIAddonsNode", p.addonsNodeName(), healer.ReasonRestartSweepStarted); n != started+1 {
				t.Errorf("%d RestartSweepStarted Events after the csi-addons sidecar alone restarted, want 1", n-started)
			}
			if n := probeCalls(t, p.node); n-calls != len(p.volumes) {
				t.Errorf("the driver served %d ProbeVolume calls after the csi-addons sidecar alone restarted, want one per volume (%d)", n-calls, len(p.volumes))
			}
		})
	}
}

// probeCalls counts the ProbeVolume calls the node's drivers served.
func probeCalls(t *testing.T, n *node) int {
	t.Helper()
	calls, _, err := n.record()
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, c := range calls {
		if c.RPC == "ProbeVolume" {
			count++
		}
	}
	return count
}
