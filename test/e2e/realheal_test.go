package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestRealHeal is the project's promise on real mounts: the reference driver runs as a real CSI
// node plugin whose volumes are FUSE mounts served by mounter processes in the plugin's process
// group, staged and published by a kubelet stand-in at kubelet's paths, and used by workloads in
// mount namespaces of their own. Killing the plugin's process group (what a container restart
// does) leaves every mount answering ENOTCONN; the restart sweep finds and repairs them, and the
// workload with HostToContainer propagation gets its I/O back without a restart, while the one
// with None is reported as needing a restart. Then one mounter is killed, one mount turns
// read-only, one mounter freezes and one volume loses its data: a manual sweep repairs the first
// three and leaves the lost one alone. Every check is made on the mounts themselves, through the
// publish targets.
func TestRealHeal(t *testing.T) {
	harness.RequireRealMounts(t)
	f := newFixture(t, "real")
	class := f.StorageClass("real-fuse", "fuse", nil)
	nodeName := "real-node-1"
	n := f.StartRealNode(harness.RealNodeOptions{Node: nodeName, Kube: f.s.Env.Config, DriverBinary: f.s.Bin.Driver, StatTimeout: time.Second})
	ctx := f.Ctx()

	vols := f.NewVolumes(nodeName, n.Control(), class, "fuse", "v", 7)
	f.ProvisionAll(n, vols)
	targets := make([]string, len(vols))
	for i, v := range vols {
		var err error
		if targets[i], err = n.Mount(ctx, v, fmt.Sprintf("pod-%d", i)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(targets[i], "marker"), []byte(v.PV), 0o644); err != nil {
			t.Fatalf("write through the publish target of %s: %v", v.PV, err)
		}
	}
	// The sidecar computes staging paths itself: they must be where kubelet staged the volumes.
	for _, v := range vols {
		want := n.StagingPath(v)
		if got := healerv1alpha1.StagingTargetPath(filepath.Join(n.Kubelet().Root(), "plugins", "kubernetes.io", "csi"), f.Driver, v.Handle); got != want {
			t.Fatalf("the sidecar's staging path of %s is %s, kubelet staged it at %s", v.PV, got, want)
		}
	}
	following, err := n.StartWorkload(ctx, "follows", targets[0], corev1.MountPropagationHostToContainer)
	if err != nil {
		t.Fatal(err)
	}
	private, err := n.StartWorkload(ctx, "private", targets[1], corev1.MountPropagationNone)
	if err != nil {
		t.Fatal(err)
	}

	f.startController("real", nil)
	f.SweepFinished(nodeName, time.Minute)
	for i := range vols {
		mustUse(t, targets[i])
	}

	// (a) The node plugin's container dies: the driver and every mounter with it.
	killedAt := time.Now()
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	for i, v := range vols {
		if err := useTarget(targets[i]); !errors.Is(err, syscall.ENOTCONN) {
			t.Fatalf("%s after the plugin died: %v, want ENOTCONN (the mount must really be dead)", v.PV, err)
		}
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.SweepFinished(nodeName, 2*time.Minute)
	for i := range vols {
		mustUse(t, targets[i])
	}
	ok, err := following.WaitOK(ctx, killedAt)
	if err != nil {
		t.Fatalf("the HostToContainer workload did not get its I/O back: %v", err)
	}
	t.Logf("HostToContainer workload: plugin killed -> first good write %s", ok.Time.Sub(killedAt).Round(time.Millisecond))
	if res := private.Results(); len(res) == 0 || res[len(res)-1].OK {
		t.Errorf("the workload with propagation None reads again; it cannot see a mount made after it started")
	}
	f.WaitPVCEvent(vols[1], healer.ReasonVolumePodsMustRestart)
	f.WaitPVCEvent(vols[0], healer.ReasonVolumeHealed)
	if evs, _ := f.PVCEvents(vols[0], healer.ReasonVolumePodsMustRestart); len(evs) > 0 {
		t.Errorf("%s: asked for a pod restart although its pod sees the repaired mount: %s", vols[0].PV, evs[0].Message)
	}

	// (b)-(d) and data loss, found by a manual sweep of the node.
	broken := map[*volume]control.Condition{vols[2]: control.Gone, vols[3]: control.ReadOnly, vols[4]: control.Hung, vols[5]: control.Lost}
	for v, c := range broken {
		v.SetCondition(t, c, 0)
	}
	if err := useTarget(targets[2]); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("%s with its mounter killed: %v, want ENOTCONN", vols[2].PV, err)
	}
	if err := useTarget(targets[3]); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("%s remounted read-only: %v, want EROFS", vols[3].PV, err)
	}
	if err := useTarget(targets[4]); !errors.Is(err, errHung) {
		t.Fatalf("%s with its mounter frozen: %v, want a hang", vols[4].PV, err)
	}
	brokenAt := time.Now()
	requestNodeSweep(t, f, nodeName, "after-faults")
	for _, i := range []int{2, 3, 4} {
		harness.Eventually(t, time.Minute, vols[i].PV+" to be usable again", func() (bool, string) {
			err := useTarget(targets[i])
			return err == nil, fmt.Sprint(err)
		})
	}
	f.WaitPVCEvent(vols[5], healer.ReasonVolumeDataLoss)
	calls, err := n.Control().Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if c.RPC == "HealVolume" && c.VolumeID == vols[5].Handle && c.Start.After(brokenAt) {
			t.Errorf("the lost volume %s was healed at %s; data loss must be left to a human", vols[5].PV, c.Start)
		}
	}
	mustUse(t, targets[6])
}

// errHung is what useTarget returns when the mount does not answer.
var errHung = errors.New("no answer within 2s")

// useTarget writes, syncs and reads back a file through a publish target, as a workload does,
// and gives up (errHung) on a mount that does not answer.
func useTarget(target string) error {
	done := make(chan error, 1)
	go func() {
		file := filepath.Join(target, "e2e-probe")
		want := []byte(time.Now().String())
		err := func() error {
			f, err := os.OpenFile(file, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			_, werr := f.Write(want)
			serr := f.Sync()
			if err := errors.Join(werr, serr, f.Close()); err != nil {
				return err
			}
			got, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if string(got) != string(want) {
				return fmt.Errorf("read back %q, wrote %q", got, want)
			}
			return nil
		}()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Second):
		return errHung
	}
}

// mustUse fails the test unless the volume at target works, with the marker written at its start.
func mustUse(t *testing.T, target string) {
	t.Helper()
	if err := useTarget(target); err != nil {
		t.Fatalf("I/O through %s: %v", target, err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "marker")); err != nil || !strings.HasPrefix(string(b), "pvc-") {
		t.Fatalf("the data written at the start is not at %s: %q, %v", target, b, err)
	}
}

// requestNodeSweep asks for a manual sweep of every volume of the node, as `healerctl sweep`
// does, and waits until it is handled.
func requestNodeSweep(t *testing.T, f *fixture, node, request string) {
	t.Helper()
	key := f.AddonsNodeKey(node)
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.Client.Get(f.Ctx(), key, &n); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(n.DeepCopy())
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[annotations.SweepRequest] = request
	if err := f.Client.Patch(f.Ctx(), &n, patch); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 2*time.Minute, "the manual sweep of node "+node, func() (bool, string) {
		var got csiaddonsv1alpha1.CSIAddonsNode
		if err := f.Client.Get(f.Ctx(), key, &got); err != nil {
			return false, err.Error()
		}
		handled := got.Annotations[annotations.SweepHandled]
		return handled == request, fmt.Sprintf("handled %q", handled)
	})
}
