package realcluster

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/test/cluster"
)

// TestRealNode starts a real node (kubelet, containerd, runc; test/cluster), checks that it runs
// pods, installs volume-healer and the reference driver with their Helm charts (the node plugin
// with both the healer sidecar and the real csi-addons sidecar), and a second release of the
// reference driver as a driver that serves no Healer service (stock mode) with rclone as its FUSE
// mounter. It runs three workloads: on the Healer-mode driver a StatefulSet whose pod mounts its
// volume with HostToContainer propagation and sees the healed mount in place, and a Deployment
// whose pod (propagation None) cannot; on the stock driver a StatefulSet of two pods. It breaks
// the node plugins the ways they break in production: a rollout restart of the DaemonSet (what an
// upgrade does), a kill -9 of the driver container (kubelet restarts it), and a killed mounter.
// After each, the workloads' own writes and reads must come back:
//   - on the Healer-mode driver, the HostToContainer pod in place; the None pod evicted and
//     replaced while its sidecar has no access to the container runtime, and, once a helm upgrade
//     gave it the runtime's socket, restarted in place (same pod, one more container restart);
//   - on the stock driver, the sidecar's own probe finds the dead mounts (tier none), the policy
//     recycles each volume (its pods evicted), and the driver's NodeStage and NodePublish mount it
//     again for the replacement pods; the restart is recorded handled only once none is left on a
//     dead mount.
//
// Last, a third release of the reference driver runs its mounters in the mount supervisor
// (driverkit/supervisor): workloads that hold a file or a folder open on its volumes see no failed
// system call and lose no write across a rollout restart and a kill -9 of its node plugin, a kill
// -9 of a mounter and an upgrade of the supervisor, beside the same workloads on today's heal path.
//
// The suite logs the workloads' outage of each remedy side by side (docs/performance.md).
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
	e.InstallStock(t)
	e.WaitStockSwept(t, 2*time.Minute)
	e.OptInToPodRestarts()
	shared := e.StatefulSet("shared", corev1.MountPropagationHostToContainer, 1)
	private := e.Deployment("private", corev1.MountPropagationNone)
	stock := e.StockStatefulSet("stock", 2)
	begin := time.Now()
	shared.WaitWriting(t, time.Time{}, 3*time.Minute, nil)
	private.WaitWriting(t, time.Time{}, 3*time.Minute, nil)
	stock.WaitAllWriting(t, 3*time.Minute)
	t.Logf("the three workloads write and read their volumes, %s after they were created", time.Since(begin).Round(100*time.Millisecond))
	defer func() { t.Logf("the workloads' outage, first failed to first good try, by remedy:\n%s", e.Outages()) }()

	t.Run("rollout restart of the node plugin", func(t *testing.T) {
		e.Disrupt(t, shared, private, "rollout restart", func() { e.RolloutRestart(t) })
		// The new pod's csi-addons sidecar took the object over and the healer sidecar's
		// registration followed it: still one object, and its new restart swept.
		e.WaitOneCSIAddonsNode(t, 2*time.Minute)
	})
	t.Run("rollout restart of the stock node plugin", func(t *testing.T) {
		e.DisruptStock(t, stock, "stock rollout restart", func() { e.RolloutRestartStock(t) })
	})
	t.Run("kill -9 of the stock driver container", func(t *testing.T) {
		e.DisruptStock(t, stock, "stock kill -9 of the driver container", func() { e.KillStockDriverContainer(t) })
	})
	// The upgrade rolls the node plugin: a restart of its own, after which the None pod is back
	// by a container restart in place.
	t.Run("helm upgrade gives the sidecar the container runtime", func(t *testing.T) {
		e.Disrupt(t, shared, private, "helm upgrade giving the sidecar the container runtime", func() { e.EnableContainerRestart(t) })
		e.WaitOneCSIAddonsNode(t, 2*time.Minute)
		client := e.nodeHealer(t)
		caps, err := client.GetHealerCapabilities(t.Context(), &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
		if err != nil || !caps.GetContainerRestart() {
			t.Errorf("the sidecar's capabilities: container_restart=%t, %v; want true", caps.GetContainerRestart(), err)
		}
	})
	// The None pod's container was restarted a moment ago: kubelet starts it again after its
	// crash back-off.
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
	// A third release runs its mounters in the mount supervisor: the same disruptions, and an
	// upgrade of the supervisor, must fail no system call of workloads that hold a file or a
	// folder open, while today's heal path is measured beside it.
	t.Run("mounts kept across restarts", func(t *testing.T) { e.ProveKeptMounts(t) })
	// Last, as it leaves 100 more volumes on the node: the path from a rollout restart's new
	// driver container to the workloads' first good writes, part by part, at the chart's
	// defaults.
	t.Run("restart to writes with 100 volumes", func(t *testing.T) {
		many := e.ManyVolumes("many", manyPods, perPod)
		many.WaitAllVolumesWriting(t, manyPods, perPod, 5*time.Minute)
		e.MeasureRestartToIO(t, many, manyPods, perPod)
	})
}
