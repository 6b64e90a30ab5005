package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestRealHealEvictsPodOnDeadMount is remediation on real mounts: a workload whose volume mount
// has propagation None is broken by a node plugin restart; the restart sweep repairs the volume
// on the node, the driver reports that the running pod still sees the dead mount, and the
// controller (remediation on, the namespace opted in) evicts the pod by policy. The test then
// does what the ReplicaSet and kubelet would: stops the evicted pod's workload and starts its
// replacement on a new publish of the volume, which reads the data written before the restart
// and writes again.
func TestRealHealEvictsPodOnDeadMount(t *testing.T) {
	harness.RequireRealMounts(t)
	f := newFixture(t, "realev")
	class := f.StorageClass("realev-fuse", "fuse", nil)
	nodeName := "realev-node"
	n := f.StartRealNode(harness.RealNodeOptions{Node: nodeName, Kube: f.s.Env.Config, DriverBinary: f.s.Bin.Driver, StatTimeout: time.Second})
	ctx := f.Ctx()
	vols := f.NewVolumes(nodeName, n.Control(), class, "fuse", "v", 1)
	v := vols[0]
	f.ProvisionAll(n, vols)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, annotations.EvictPodsLabel)
	if _, err := f.Clientset.CoreV1().Namespaces().Patch(ctx, f.AppNS, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// The pod: its API object (a ReplicaSet's, running on the node) and what kubelet made of it.
	target, err := n.Mount(ctx, v, "pod-old")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "marker"), []byte(v.PV), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := runningPod(t, f, "realev-app-old", nodeName, v.PVC)
	private, err := n.StartWorkload(ctx, "old", target, corev1.MountPropagationNone)
	if err != nil {
		t.Fatal(err)
	}

	f.startController("realev", map[string]string{"REMEDIATION_ENABLED": "true"})
	f.SweepFinished(nodeName, time.Minute)

	// The node plugin's container dies and comes back: the restart sweep heals the volume.
	killedAt := time.Now()
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.SweepFinished(nodeName, 2*time.Minute)
	mustUse(t, target)
	f.WaitPVCEvent(v, healer.ReasonVolumePodsMustRestart)
	if _, err := private.WaitFailure(ctx, killedAt); err != nil {
		t.Fatalf("the workload with propagation None did not fail after the restart: %v", err)
	}

	harness.Eventually(t, harness.EventWait, "the pod on the dead mount evicted", func() (bool, string) {
		got, err := f.Clientset.CoreV1().Pods(f.AppNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return got.DeletionTimestamp != nil, "not terminating"
	})
	// The controller's recorder posts the Event after the eviction, on its own goroutine: the pod
	// may be seen terminating first.
	harness.Eventually(t, harness.EventWait, "the evicted pod's "+evict.ReasonEvictedForStaleMount+" Event", func() (bool, string) {
		evs, _ := f.Events(f.AppNS, "Pod", pod.Name, evict.ReasonEvictedForStaleMount)
		if len(evs) == 0 {
			return false, "none yet"
		}
		return strings.Contains(evs[0].Message, "heal of volume "+v.PV), fmt.Sprintf("it does not name the heal of %s: %s", v.PV, evs[0].Message)
	})
	if n, _ := f.Events(f.AppNS, "Pod", pod.Name, evict.ReasonEvictionBlocked); len(n) > 0 {
		t.Errorf("the eviction was blocked: %s", n[0].Message)
	}

	// What the ReplicaSet and kubelet do next: the old containers stop, a new pod starts on a new
	// publish of the volume.
	if err := private.Stop(); err != nil {
		t.Logf("old workload: %v", err)
	}
	replacementAt := time.Now()
	newTarget, err := n.Mount(ctx, v, "pod-new")
	if err != nil {
		t.Fatal(err)
	}
	runningPod(t, f, "realev-app-new", nodeName, v.PVC)
	replacement, err := n.StartWorkload(ctx, "new", newTarget, corev1.MountPropagationNone)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replacement.WaitOK(ctx, replacementAt); err != nil {
		t.Fatalf("the replacement pod cannot use the healed volume: %v", err)
	}
	mustUse(t, newTarget)
	if b, err := os.ReadFile(filepath.Join(newTarget, "marker")); err != nil || string(b) != v.PV {
		t.Errorf("the replacement does not see the data written before the restart: %q, %v", b, err)
	}
	// The replacement was created after the heal: it is never evicted for it.
	time.Sleep(2 * time.Second)
	if evs, _ := f.Events(f.AppNS, "Pod", "realev-app-new", evict.ReasonEvictedForStaleMount); len(evs) > 0 {
		t.Errorf("the replacement was evicted: %s", evs[0].Message)
	}
}

// runningPod creates a running pod of a ReplicaSet on node that mounts claim, as the scheduler
// and kubelet would have.
func runningPod(t *testing.T, f *fixture, name, node, claim string) *corev1.Pod {
	t.Helper()
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.AppNS, Name: name, Labels: map[string]string{"app": "realev"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "realev-app", UID: "realev-app-rs", Controller: &yes}}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "app", Image: "app", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
	f.Create(p)
	p.Status.Phase = corev1.PodRunning
	if _, err := f.Clientset.CoreV1().Pods(f.AppNS).UpdateStatus(f.Ctx(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("mark pod %s running: %v", name, err)
	}
	return p
}
