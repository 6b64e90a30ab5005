package realcluster

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/test/cluster"
)

// TestRealNode starts a real node (kubelet, containerd, runc; test/cluster), checks that it runs
// pods, installs volume-healer and the reference driver with their Helm charts (the node plugin
// with both the healer sidecar and the real csi-addons sidecar), runs two
// workloads on the driver's FUSE volumes, and breaks the node plugin three ways: a rollout restart of its DaemonSet (what an
// upgrade does), a kill -9 of its driver container (kubelet restarts it), and a killed mounter.
// After each, the workloads' own writes and reads must come back: the StatefulSet's pod mounts
// its volume with HostToContainer propagation and sees the healed mount; the Deployment's pod
// (propagation None) cannot, so the policy evicts it and its replacement writes. The suite
// reports how long each disruption cost the workloads.
//
// One node serves every step: starting it costs about a minute, and only one node can run on a
// machine at a time (kubelet's root is /var/lib/kubelet).
func TestRealNode(t *testing.T) {
	c, assets := cluster.StartForTest(t)
	if !t.Run("runs pods", func(t *testing.T) { RunsPods(t, c, assets) }) {
		t.FailNow()
	}
	e := Install(t, c, assets)
	// The csi-addons sidecar runs beside the healer sidecar: both keep one CSIAddonsNode, and the
	// controller sweeps the node plugin's start from it.
	e.WaitOneCSIAddonsNode(t, 2*time.Minute)
	e.OptInToPodRestarts()
	shared := e.StatefulSet("shared", corev1.MountPropagationHostToContainer, 1)
	private := e.Deployment("private", corev1.MountPropagationNone)
	begin := time.Now()
	shared.WaitWriting(t, time.Time{}, 3*time.Minute, nil)
	private.WaitWriting(t, time.Time{}, 3*time.Minute, nil)
	t.Logf("both workloads write and read their volumes, %s after they were created", time.Since(begin).Round(100*time.Millisecond))

	t.Run("rollout restart of the node plugin", func(t *testing.T) {
		e.Disrupt(t, shared, private, "rollout restart", func() { e.RolloutRestart(t) })
		// The new pod's csi-addons sidecar took the object over and the healer sidecar's
		// registration followed it: still one object, and its new restart swept.
		e.WaitOneCSIAddonsNode(t, 2*time.Minute)
	})
	t.Run("driver container killed", func(t *testing.T) {
		e.Disrupt(t, shared, private, "kill -9 of the driver container", func() {
			e.KillDriverContainer(t)
		})
	})
	// A mounter that dies alone restarts nothing: the StorageClass's periodic sweep (every 10s
	// here, by its schedule annotation) finds the dead mount.
	t.Run("mounter killed", func(t *testing.T) {
		e.Disrupt(t, shared, nil, "kill -9 of the shared volume's mounter", func() {
			e.KillMounter(t, shared)
		})
	})
}
