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
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestRealRecycleOfAStockDriver is the remedy ladder's recycle on real mounts: the reference
// driver in its real mode, seen by the sidecar as a stock driver that serves no Healer service
// (tier "none": the sidecar probes its volumes itself from kubelet's records), is killed with its
// FUSE mounters and started again. Its restart sweep finds the volume dead, nothing can heal it,
// and the built-in policy recycles it: the pods on that node that use the claim are evicted
// (the namespace opted in), not the claim's pod on another node nor the node's pod of another
// claim; the claim gets VolumeRecycling and EvictedForRecycle, the recycle metric counts it, and
// the restart stays pending while the volume is dead. The test then does what kubelet and the
// ReplicaSet would: unpublishes and unstages the volume, and a replacement pod stages and
// publishes it again through the driver's own NodeStage and NodePublish; the next try of the
// restart sweep finds the volume healthy (VolumeRecycled) and records the restart.
func TestRealRecycleOfAStockDriver(t *testing.T) {
	harness.RequireRealMounts(t)
	f := newFixture(t, "realrc")
	class := f.StorageClass("realrc-fuse", "fuse", nil)
	nodeName := "realrc-node"
	n := f.StartRealNode(harness.RealNodeOptions{Node: nodeName, Kube: f.s.Env.Config, DriverBinary: f.s.Bin.Driver,
		StatTimeout: time.Second, Stock: true, SidecarBinary: f.s.Bin.Sidecar})
	ctx := f.Ctx()
	vols := f.NewVolumes(nodeName, n.Control(), class, "fuse", "v", 1)
	v := vols[0]
	f.ProvisionAll(n, vols)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, annotations.EvictPodsLabel)
	if _, err := f.Clientset.CoreV1().Namespaces().Patch(ctx, f.AppNS, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// Two pods on the node use the claim; what kubelet made of them is two publishes of the
	// volume. A pod of the claim on another node and a pod of another claim on this node must
	// stay.
	var targets []string
	for _, uid := range []string{"pod-a", "pod-b"} {
		target, err := n.Mount(ctx, v, uid)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, target)
	}
	if err := os.WriteFile(filepath.Join(targets[0], "marker"), []byte(v.PV), 0o644); err != nil {
		t.Fatal(err)
	}
	podA := runningPod(t, f, "realrc-a", nodeName, v.PVC)
	podB := runningPod(t, f, "realrc-b", nodeName, v.PVC)
	farPod := runningPod(t, f, "realrc-far", "realrc-node2", v.PVC)
	otherClaim := runningPod(t, f, "realrc-other", nodeName, "realrc-other-claim")

	c := f.startController("realrc", map[string]string{"REMEDIATION_ENABLED": "true", "REMEDIATION_REPROBE_AFTER": "1s"})
	f.SweepFinished(nodeName, time.Minute)

	// The node plugin dies with its mounters and comes back: nothing remounts the volume.
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	marker := f.SweepPending(nodeName, 2*time.Minute)
	f.WaitPVCEvent(v, evict.ReasonVolumeRecycling)
	evs, _ := f.PVCEvents(v, evict.ReasonVolumeRecycling)
	if msg := evs[0].Message; !strings.Contains(msg, "realrc-a") || !strings.Contains(msg, "realrc-b") || strings.Contains(msg, "realrc-far") || strings.Contains(msg, "realrc-other") {
		t.Errorf("%s Event %q; want it to name realrc-a and realrc-b only", evict.ReasonVolumeRecycling, msg)
	}
	terminating := func(p *corev1.Pod) bool {
		got, err := f.Clientset.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return got.DeletionTimestamp != nil
	}
	harness.Eventually(t, harness.EventWait, "the pods of the claim on the node evicted", func() (bool, string) {
		return terminating(podA) && terminating(podB), fmt.Sprintf("a %t, b %t", terminating(podA), terminating(podB))
	})
	for _, p := range []*corev1.Pod{farPod, otherClaim} {
		if terminating(p) {
			t.Errorf("pod %s was evicted; it does not use the dead volume on node %s", p.Name, nodeName)
		}
	}
	f.WaitPVCEvent(v, evict.ReasonEvictedForRecycle)
	if got := c.Metric("volume_healer_recycles_total", map[string]string{"result": "started"}); got < 1 {
		t.Errorf("volume_healer_recycles_total{result=started} = %v, want 1", got)
	}
	if got := c.Metric("volume_healer_evictions_total", map[string]string{"result": "evicted"}); got != 2 {
		t.Errorf("volume_healer_evictions_total{result=evicted} = %v, want 2", got)
	}
	if st, ok := f.PVCStatus(v); !ok || st.Result != healer.StatusRecycling || st.Recycle == nil {
		t.Errorf("PVC status %+v (%t); want recycling with its progress", st, ok)
	}
	// The volume is still dead: the restart stays pending.
	time.Sleep(2 * time.Second)
	if obj := f.AddonsNode(nodeName); obj.Annotations[annotations.HandledMarker] == marker {
		t.Fatalf("restart %q recorded as handled while its volume is being recycled", marker)
	}

	// What kubelet and the ReplicaSet do next: the evicted pods' publishes go, then the staging;
	// a replacement pod makes kubelet stage and publish the volume again.
	for _, uid := range []string{"pod-a", "pod-b"} {
		if err := n.Unpublish(ctx, v, uid); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Unstage(ctx, v); err != nil {
		t.Fatal(err)
	}
	newTarget, err := n.Mount(ctx, v, "pod-new")
	if err != nil {
		t.Fatal(err)
	}
	runningPod(t, f, "realrc-new", nodeName, v.PVC)
	mustUse(t, newTarget)

	harness.Eventually(t, 2*time.Minute, "the restart recorded once the volume probes healthy", func() (bool, string) {
		obj := f.AddonsNode(nodeName)
		handled := obj.Annotations[annotations.HandledMarker]
		return handled == trigger.RestartMarker(obj), fmt.Sprintf("handled %q, marker %q", handled, trigger.RestartMarker(obj))
	})
	f.WaitPVCEvent(v, healer.ReasonVolumeRecycled)
	if got := c.Metric("volume_healer_recycles_total", map[string]string{"result": "recycled"}); got != 1 {
		t.Errorf("volume_healer_recycles_total{result=recycled} = %v, want 1", got)
	}
	if terminating(farPod) || terminating(otherClaim) {
		t.Error("a pod that does not use the dead volume on the node was evicted")
	}
}
