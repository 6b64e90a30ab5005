package sidecar_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csi-addons/spec/lib/go/identity"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// buildSidecar builds cmd/healer-sidecar into dir: the sidecar starts its own program again to
// stat a mount, and this test binary is not that program.
func buildSidecar(dir string) (string, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "healer-sidecar")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/healer-sidecar")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/healer-sidecar: %w\n%s", err, out)
	}
	return bin, nil
}

// serveIdentityOnly serves the reference driver's CSI-Addons Identity service alone on the
// fixture's socket: a driver that knows nothing of volume-healer.
func (f *fixture) serveIdentityOnly(d *simulated.Driver) {
	f.t.Helper()
	path := strings.TrimPrefix(f.endpoint, "unix://")
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		f.t.Fatal(err)
	}
	srv := grpc.NewServer()
	identity.RegisterIdentityServer(srv, d.IdentityServer())
	go func() { _ = srv.Serve(lis) }()
	f.t.Cleanup(srv.Stop)
}

// writeVolData writes a vol_data.json as kubelet does.
func writeVolData(t *testing.T, dir string, data map[string]string) {
	t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vol_data.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestProbeOfADriverWithoutHealer: the driver serves CSI-Addons Identity and nothing of the
// healer protocol; the sidecar says so in its capabilities, probes the volume itself from
// kubelet's records, the mount table and a stat, says it did, and lists the node's volumes from
// the same records.
func TestProbeOfADriverWithoutHealer(t *testing.T) {
	if os.Geteuid() != 0 {
		msg := "this test mounts a tmpfs and needs root"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	f := newFixture(t)
	opts := simulated.Options{StateDir: f.stateDir, StagingRoot: f.stagingRoot(), SeedVolumes: []string{}}
	opts.DriverName, opts.NodeID = f.driverName, f.nodeName
	d, err := simulated.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.serveIdentityOnly(d)
	bin, err := buildSidecar(t.TempDir())
	if err != nil {
		t.Fatalf("build the sidecar: %v", err)
	}

	// Volume 1 is staged and published for two pods; pod-b's target was unmounted behind
	// kubelet's back. No VolumeAttachment: a driver without an attach step.
	pv := f.pv("pv-1", "vol-1")
	f.create(pv)
	staging := healerv1alpha1.StagingTargetPath(f.stagingRoot(), f.driverName, "vol-1")
	writeVolData(t, filepath.Dir(staging), map[string]string{"driverName": f.driverName, "volumeHandle": "vol-1"})
	var targets []string
	for _, pod := range []string{"pod-a", "pod-b"} {
		dir := filepath.Join(f.kubeletDir, "pods", pod, "volumes", "kubernetes.io~csi", pv.Name)
		writeVolData(t, dir, map[string]string{"driverName": f.driverName, "volumeHandle": "vol-1", "specVolID": pv.Name, "volumeLifecycleMode": "Persistent"})
		targets = append(targets, filepath.Join(dir, "mount"))
	}
	for _, p := range append([]string{staging}, targets...) {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("sidecar-test", staging, "tmpfs", 0, "size=4m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(staging, unix.MNT_DETACH) })
	if err := unix.Mount(staging, targets[0], "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(targets[0], unix.MNT_DETACH) })

	sc := f.startSidecar(func(o *sidecar.Options) {
		o.StatCommand = []string{bin, nodeprobe.StatArg}
		o.StatTimeout = 5 * time.Second
	})
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	caps, err := sc.client.GetHealerCapabilities(ctx, &healerv1alpha1.NodeGetHealerCapabilitiesRequest{})
	if err != nil {
		t.Fatalf("capabilities of a driver without Healer: %v", err)
	}
	if caps.GetProbeSource() != healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR ||
		!healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_PROBE) ||
		!healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_LIST_VOLUMES) ||
		healerv1alpha1.HasRPC(caps.GetCapabilities(), healerv1alpha1.HealerCapability_RPC_HEAL) {
		t.Fatalf("capabilities = %v, probe source %v; want PROBE and LIST_VOLUMES by the sidecar, no HEAL", caps.GetCapabilities(), caps.GetProbeSource())
	}

	resp, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv.Name})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if resp.GetProbeSource() != healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR || resp.GetHealable() || resp.GetKept() || resp.GetVolumeId() != "vol-1" {
		t.Fatalf("probe answer %v: want probed by the sidecar, not healable, not kept, volume vol-1", resp)
	}
	h := resp.GetHealthStatuses()
	if len(h) != 1 || h[0].GetReason() != healerv1alpha1.ReasonPublishTargetNotMounted || !strings.Contains(h[0].GetMessage(), targets[1]) {
		t.Fatalf("health %v: want %s for %s alone (the staging tmpfs and pod-a's bind answer)", h, healerv1alpha1.ReasonPublishTargetNotMounted, targets[1])
	}

	// Once pod-b's target is mounted again, the volume is healthy: the stat of the mounts
	// went through the sidecar's own program.
	if err := unix.Mount(staging, targets[1], "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(targets[1], unix.MNT_DETACH) })
	resp, err = sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: pv.Name})
	if err != nil || len(resp.GetHealthStatuses()) != 0 {
		t.Fatalf("probe with every target mounted: %v, %v; want healthy", resp, err)
	}

	// A PV kubelet records nothing of on this node is not this sidecar's.
	f.create(f.pv("pv-2", "vol-2"))
	if _, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: f.pvName("pv-2")}); err == nil || !strings.Contains(err.Error(), "not on this node") {
		t.Fatalf("probe of a volume not on the node: %v, want FAILED_PRECONDITION", err)
	}

	list, err := sc.client.ListStagedVolumes(ctx, &healerv1alpha1.NodeListStagedVolumesRequest{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if e := list.GetEntries(); len(e) != 1 || e[0].GetVolumeId() != "vol-1" || e[0].GetPvName() != pv.Name || e[0].GetStagingTargetPath() != staging {
		t.Fatalf("list %v: want vol-1 of %s staged at %s", e, pv.Name, staging)
	}
}

// TestProbeOfABlockVolumeWithoutHealer: for a driver that serves no Healer service, the sidecar
// probes a raw block volume by reading its device where kubelet published it for a pod, through
// its own program, finds it healthy while the device reads and broken once its backend is gone,
// lists it from kubelet's volumeDevices records, and answers that it did not probe a block volume
// that no pod uses instead of calling it healthy.
func TestProbeOfABlockVolumeWithoutHealer(t *testing.T) {
	if os.Geteuid() != 0 {
		msg := "this test attaches a loop device and needs root"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	f := newFixture(t)
	opts := simulated.Options{StateDir: f.stateDir, StagingRoot: f.stagingRoot(), SeedVolumes: []string{}}
	opts.DriverName, opts.NodeID = f.driverName, f.nodeName
	d, err := simulated.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.serveIdentityOnly(d)
	bin, err := buildSidecar(t.TempDir())
	if err != nil {
		t.Fatalf("build the sidecar: %v", err)
	}
	block := corev1.PersistentVolumeBlock
	blockPV := func(pv *corev1.PersistentVolume) {
		pv.Spec.VolumeMode = &block
		// No VolumeAttachment: a driver without an attach step; kubelet's records place it.
		pv.Annotations = map[string]string{attachedTo: ""}
	}
	used, idle := f.pv("blk-1", "vol-1", blockPV), f.pv("blk-2", "vol-2", blockPV)
	f.create(used)
	f.create(idle)
	devices := filepath.Join(f.kubeletDir, "plugins", "kubernetes.io", "csi", "volumeDevices")
	for _, v := range []struct{ pv, handle string }{{used.Name, "vol-1"}, {idle.Name, "vol-2"}} {
		writeVolData(t, filepath.Join(devices, v.pv, "data"), map[string]string{"driverName": f.driverName, "volumeHandle": v.handle, "specVolID": v.pv})
		if err := os.MkdirAll(filepath.Join(devices, "staging", v.pv), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	// vol-1's device, where the driver's NodePublish put it for pod uid-a.
	target := filepath.Join(devices, "publish", used.Name, "uid-a")
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	dev := attachLoop(t)
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(target, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
		t.Fatal(err)
	}

	sc := f.startSidecar(func(o *sidecar.Options) {
		o.StatCommand = []string{bin, nodeprobe.StatArg}
		o.StatTimeout = 5 * time.Second
	})
	f.waitReady(sc)
	ctx := f.as(f.token(controllerSA))

	resp, err := sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: used.Name})
	if err != nil || len(resp.GetHealthStatuses()) != 0 || resp.GetProbeSource() != healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR {
		t.Fatalf("probe of a block volume whose device reads: %v, %v; want healthy, probed by the sidecar", resp, err)
	}
	list, err := sc.client.ListStagedVolumes(ctx, &healerv1alpha1.NodeListStagedVolumesRequest{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var listed []string
	for _, e := range list.GetEntries() {
		listed = append(listed, e.GetVolumeId()+"="+e.GetPvName()+"@"+e.GetStagingTargetPath())
	}
	if want := []string{"vol-1=" + used.Name + "@" + filepath.Join(devices, "staging", used.Name), "vol-2=" + idle.Name + "@" + filepath.Join(devices, "staging", idle.Name)}; !slices.Equal(listed, want) {
		t.Fatalf("list %q, want %q", listed, want)
	}

	_, err = sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: idle.Name})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "not probed") || !strings.Contains(err.Error(), "published for no pod") {
		t.Fatalf("probe of a block volume no pod uses: %v; want UNIMPLEMENTED saying it was not probed and why", err)
	}

	// The device loses its backend, as a block device whose daemon died does.
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d %s: %v: %s", dev, err, out)
	}
	resp, err = sc.client.ProbeVolume(ctx, &healerv1alpha1.NodeProbeVolumeRequest{PvName: used.Name})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	if h := resp.GetHealthStatuses(); len(h) != 1 || h[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE || !strings.Contains(h[0].GetMessage(), target) {
		t.Fatalf("probe of a block volume whose device lost its backend: %v; want INACCESSIBLE naming %s", h, target)
	}
}

// attachLoop attaches a loop device to a file of 1 MiB and returns it; it is detached when the
// test ends.
func attachLoop(t *testing.T) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "backing.img")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Skipf("cannot attach a loop device here: losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { detachLoop(t, dev, file) })
	return dev
}

// detachLoop detaches dev if it is still the loop device of file (a test may have detached it
// already), trying again for a while: udev may hold a new device open for a moment, and a
// device left attached stays until someone detaches it by hand.
func detachLoop(t *testing.T, dev, file string) {
	var out []byte
	for range 50 {
		backing, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
		if err != nil || strings.TrimSpace(string(backing)) != file {
			return
		}
		if out, err = exec.Command("losetup", "-d", dev).CombinedOutput(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("detach %s (losetup -d): %s", dev, out)
}
