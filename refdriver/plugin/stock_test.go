package plugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csi-addons/spec/lib/go/identity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/volume-healer/volume-healer/api/healer/sanity"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
)

// stockMounters are the mounters the stock mode is tested with: the reference driver's own and
// rclone's, a FUSE daemon nobody here wrote.
var stockMounters = []string{"refdriver", "rclone"}

// newStockEnv is a node whose plugin runs in stock mode with mounter.
func newStockEnv(t *testing.T, mounter string, more ...string) *env {
	t.Helper()
	if mounter == "rclone" {
		requireRclone(t)
	}
	e := newEnv(t)
	e.args = append([]string{"--mode", "stock", "--mounter", mounter}, more...)
	return e
}

// publishFor publishes v for another pod, as kubelet does for a replacement pod while the
// volume is still staged: NodePublishVolume only.
func (p *proc) publishFor(e *env, v *volume, pod string) (string, error) {
	target := e.targetPath(pod, filepath.Base(filepath.Dir(v.staging)))
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		p.t.Fatal(err)
	}
	_, err := p.node.NodePublishVolume(ctx(p.t), &csi.NodePublishVolumeRequest{
		VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: target, VolumeCapability: mountCapability, VolumeContext: v.context,
	})
	return target, err
}

// mountLayers counts the mounts stacked at path.
func mountLayers(t *testing.T, path string) int {
	t.Helper()
	n := 0
	for _, mp := range mountPoints(t, path) {
		if mp == path {
			n++
		}
	}
	return n
}

// fsTypeAt returns the filesystem type of the top-most mount at path.
func fsTypeAt(t *testing.T, path string) string {
	t.Helper()
	infos, err := driverkit.ReadMountTable("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if m := driverkit.TopMount(infos, path); m != nil {
		return m.FSType
	}
	return ""
}

// TestStockServesNoHealer: a stock plugin answers the CSI-Addons Identity without the Healer
// protocol in its manifest, and UNIMPLEMENTED to every Healer call, as a driver that knows
// nothing of volume-healer; the healer sanity run says so in those words.
func TestStockServesNoHealer(t *testing.T) {
	e := newStockEnv(t, "refdriver")
	p := e.start()
	conn, err := grpc.NewClient(p.addonsEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	id, err := identity.NewIdentityClient(conn).GetIdentity(ctx(t), &identity.GetIdentityRequest{})
	if err != nil {
		t.Fatalf("CSI-Addons GetIdentity: %v", err)
	}
	if id.GetName() != "healer.example.com" || id.GetManifest()[healerv1alpha1.IdentityManifestKey] != "" {
		t.Errorf("GetIdentity = %v; want the driver's name and no %s in the manifest", id, healerv1alpha1.IdentityManifestKey)
	}
	if _, err := p.healer.GetHealerCapabilities(ctx(t), &healerv1alpha1.GetHealerCapabilitiesRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("GetHealerCapabilities: %v, want UNIMPLEMENTED", err)
	}
	v := p.createStagePublish(e, "pvc-nohealer")
	if _, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id}); status.Code(err) != codes.Unimplemented {
		t.Errorf("ProbeVolume: %v, want UNIMPLEMENTED", err)
	}

	var out strings.Builder
	report, err := sanity.Run(ctx(t), sanity.Options{Endpoint: p.addonsEndpoint, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	res, ok := report.Result(sanity.CheckCapabilities)
	if !ok || res.Outcome != sanity.Skip || report.Tier != sanity.TierNone || !strings.Contains(res.Detail, "serves no Healer service") || !strings.Contains(res.Detail, "tier none") {
		t.Errorf("sanity against a stock driver:\n%s\nwant %s skipped saying the driver serves no Healer service (tier none)", out.String(), sanity.CheckCapabilities)
	}
	p.teardown(v)
	e.expectNothingLeft()
}

// TestStockNodePublishRestoresTheStagingMount plays what happens to a stock driver on a real
// node: its container dies with the mounters, the volume stays staged in kubelet's eyes, and a
// replacement pod gets only NodePublishVolume. That call must mount the volume again at the
// staging path, so that the new pod reads the data written before and can write; the old pod's
// target stays dead (a stock driver does not repair it) until kubelet publishes there again,
// which replaces the dead mount rather than stacking on it.
func TestStockNodePublishRestoresTheStagingMount(t *testing.T) {
	for _, mounter := range stockMounters {
		t.Run(mounter, func(t *testing.T) {
			e := newStockEnv(t, mounter)
			p := e.start()
			v := p.createStagePublish(e, "pvc-"+mounter)
			if got := fsTypeAt(t, v.staging); got != "fuse."+mounter {
				t.Fatalf("the staging mount has type %q, want fuse.%s", got, mounter)
			}
			if err := writeRead(v.target, "before", "written before the kill"); err != nil {
				t.Fatalf("write through the publish target: %v", err)
			}
			p.killGroup()
			if _, err := os.ReadFile(filepath.Join(v.target, "before")); !deadMount(err) {
				t.Fatalf("reading through the target after the group kill: %v, want ENOTCONN or ECONNABORTED", err)
			}

			p = e.start()
			target, err := p.publishFor(e, v, "pod-replacement")
			if err != nil {
				t.Fatalf("NodePublishVolume for a replacement pod over the dead staging mount: %v", err)
			}
			got, err := os.ReadFile(filepath.Join(target, "before"))
			if err != nil || string(got) != "written before the kill" {
				t.Fatalf("the replacement pod reads %q, %v; want the data written before the kill", got, err)
			}
			if err := writeRead(target, "after", "written by the replacement pod"); err != nil {
				t.Fatalf("the replacement pod cannot write: %v", err)
			}
			if got, err := os.ReadFile(filepath.Join(e.stateDir, "volumes", v.id, "after")); err != nil || string(got) != "written by the replacement pod" {
				t.Fatalf("the replacement pod's write is not in the volume's backing folder: %q, %v", got, err)
			}
			if _, err := os.ReadFile(filepath.Join(v.target, "before")); !deadMount(err) {
				t.Errorf("the old pod's target after the replacement's publish: %v; a stock driver leaves it dead", err)
			}

			// Publishing at the old target again replaces its dead mount.
			if _, err := p.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{
				VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: mountCapability, VolumeContext: v.context,
			}); err != nil {
				t.Fatalf("NodePublishVolume at the dead target: %v", err)
			}
			if got, err := os.ReadFile(filepath.Join(v.target, "after")); err != nil || string(got) != "written by the replacement pod" {
				t.Fatalf("the old target after its publish reads %q, %v", got, err)
			}
			if n := mountLayers(t, v.target); n != 1 {
				t.Errorf("%d mounts at the old target after its publish, want 1: the dead one is replaced, not stacked on", n)
			}

			if _, err := p.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: target}); err != nil {
				t.Errorf("NodeUnpublishVolume(%s): %v", target, err)
			}
			p.teardown(v)
			e.expectNothingLeft()
		})
	}
}

// TestStockNodeStageRepairsTheStagingMount: NodeStageVolume of a volume whose mounter died
// (the staging path answers ENOTCONN) or froze detaches the broken mount and mounts the volume
// again, as ceph-csi's NodeStageVolume does for a corrupted ceph-fuse mount.
func TestStockNodeStageRepairsTheStagingMount(t *testing.T) {
	for _, mounter := range stockMounters {
		for _, fault := range []sanity.Fault{sanity.Gone, sanity.Hung} {
			t.Run(mounter+"/"+string(fault), func(t *testing.T) {
				e := newStockEnv(t, mounter)
				p := e.start()
				v := p.createStagePublish(e, "pvc-stage")
				if err := writeRead(v.staging, "f", "staged data"); err != nil {
					t.Fatal(err)
				}
				old := p.status(v.id).MounterPID
				if err := p.control.SetFault(ctx(t), v.id, fault, 0); err != nil {
					t.Fatalf("make the volume %s: %v", fault, err)
				}
				if fault == sanity.Gone {
					if _, err := os.ReadFile(filepath.Join(v.staging, "f")); !deadMount(err) {
						t.Fatalf("reading the staging path of a volume whose mounter died: %v, want ENOTCONN", err)
					}
				}
				if _, err := p.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{
					VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: mountCapability, VolumeContext: v.context,
				}); err != nil {
					t.Fatalf("NodeStageVolume over the broken staging mount: %v", err)
				}
				if got, err := os.ReadFile(filepath.Join(v.staging, "f")); err != nil || string(got) != "staged data" {
					t.Fatalf("the staging path after NodeStageVolume reads %q, %v", got, err)
				}
				// The pod's target still shows the broken mount: a stock NodeStageVolume
				// leaves publish targets alone.
				vs := p.status(v.id)
				if vs.MounterPID == old || !vs.MounterRunning {
					t.Errorf("after NodeStageVolume the control reports %+v; want a new running mounter (the old one was %d)", vs, old)
				}
				for _, f := range vs.Findings {
					if f.Path != v.target {
						t.Errorf("after NodeStageVolume: %+v; want no finding but about the pod's target %s", f, v.target)
					}
				}
				if n := mountLayers(t, v.staging); n != 1 {
					t.Errorf("%d mounts at the staging path, want 1: the broken one is detached", n)
				}
				p.teardown(v)
				e.expectNothingLeft()
			})
		}
	}
}

// TestStockStartUpCleanUpEmptiesThePublishTargets: with --unmount-dead-targets-on-start, the
// restarted plugin detaches the dead mounts of the targets it published before the kill. The
// pod's target is then an empty folder on the node's disk where kubelet still has the volume
// published: a write lands on the node's disk, not in the volume.
func TestStockStartUpCleanUpEmptiesThePublishTargets(t *testing.T) {
	e := newStockEnv(t, "refdriver", "--unmount-dead-targets-on-start")
	p := e.start()
	v := p.createStagePublish(e, "pvc-cleanup")
	if err := writeRead(v.target, "before", "in the volume"); err != nil {
		t.Fatal(err)
	}
	p.killGroup()
	p = e.start()
	if n := mountLayers(t, v.target); n != 0 {
		t.Fatalf("%d mounts left at the publish target after the start-up clean-up, want none", n)
	}
	entries, err := os.ReadDir(v.target)
	if err != nil || len(entries) != 0 {
		t.Fatalf("the publish target after the clean-up: %v, %v; want an empty folder", entries, err)
	}
	if err := writeRead(v.target, "misplaced", "lands on the node's disk"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.stateDir, "volumes", v.id, "misplaced")); err == nil {
		t.Fatal("a write into the emptied target reached the volume")
	}
	if _, err := os.ReadFile(filepath.Join(v.staging, "before")); !deadMount(err) {
		t.Errorf("the staging path after the clean-up: %v; the clean-up leaves it dead", err)
	}
	if err := os.Remove(filepath.Join(v.target, "misplaced")); err != nil {
		t.Fatal(err)
	}
	p.teardown(v)
	e.expectNothingLeft()
}

// TestRcloneMounterHealed: the Healer driver with rclone as the mounter heals a volume whose
// rclone died with the plugin, as with its own mounter.
func TestRcloneMounterHealed(t *testing.T) {
	requireRclone(t)
	e := newEnv(t)
	e.args = []string{"--mounter", "rclone"}
	p := e.start()
	v := p.createStagePublish(e, "pvc-rclone-heal")
	if err := writeRead(v.target, "before", "written before the kill"); err != nil {
		t.Fatal(err)
	}
	p.killGroup()
	p = e.start()
	expectProbe(t, p, v, csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountDisconnected, true)
	heal, err := p.healer.HealVolume(ctx(t), &healerv1alpha1.HealVolumeRequest{VolumeId: v.id})
	if err != nil || len(heal.GetHealthStatuses()) > 0 {
		t.Fatalf("HealVolume: %v, %v", heal.GetHealthStatuses(), err)
	}
	if got, err := os.ReadFile(filepath.Join(v.target, "before")); err != nil || string(got) != "written before the kill" {
		t.Fatalf("the target after the heal reads %q, %v", got, err)
	}
	if got := fsTypeAt(t, v.target); got != "fuse.rclone" {
		t.Errorf("the target after the heal shows %q, want fuse.rclone", got)
	}
	p.teardown(v)
	e.expectNothingLeft()
}

// TestRcloneMounterStopsCleanly: NodeUnstageVolume asks rclone to unmount (SIGTERM), and it
// does so itself, as its log says, leaving nothing mounted and no process behind.
func TestRcloneMounterStopsCleanly(t *testing.T) {
	requireRclone(t)
	e := newEnv(t)
	e.args = []string{"--mounter", "rclone"}
	p := e.start()
	v := p.createStagePublish(e, "pvc-rclone-stop")
	pid := p.status(v.id).MounterPID
	p.teardown(v)
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("rclone (PID %d) still runs after NodeUnstageVolume", pid)
	}
	// rclone logs this line when it unmounted on SIGTERM; killed, it says nothing.
	if b, _ := os.ReadFile(e.logPath()); !strings.Contains(string(b), v.staging+": Unmounted rclone mount") {
		t.Errorf("rclone did not unmount %s itself on SIGTERM; the plugin's log:\n%s", v.staging, b)
	}
	e.expectNothingLeft()
}
