package sidecar_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csi-addons/spec/lib/go/identity"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

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
