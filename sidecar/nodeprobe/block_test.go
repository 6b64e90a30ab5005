package nodeprobe_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// blockRoot is kubelet's folder of raw block volumes (pkg/volume/csi of kubelet v1.37), spelt out
// here apart from the package's own constants.
func (k *kubeletDir) blockRoot() string {
	return filepath.Join(k.dir, "plugins", "kubernetes.io", "csi", "volumeDevices")
}

// blockRecord writes the record kubelet keeps of a raw block volume while it is on the node.
func (k *kubeletDir) blockRecord(driver, handle, pv string) {
	k.t.Helper()
	k.write(filepath.Join(k.blockRoot(), pv, "data", "vol_data.json"), volData(k.t, map[string]string{
		"specVolID": pv, "volumeHandle": handle, "driverName": driver, "nodeName": "node-1", "attachmentID": "csi-0123",
	}))
}

// blockStage makes the staging folder kubelet gives NodeStageVolume for a raw block volume.
func (k *kubeletDir) blockStage(pv string) string {
	k.t.Helper()
	dir := filepath.Join(k.blockRoot(), "staging", pv)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		k.t.Fatal(err)
	}
	return dir
}

// blockPublish makes the publish target of a raw block volume for a pod as a regular file (the
// driver puts the device there) and returns it.
func (k *kubeletDir) blockPublish(pv, pod string) string {
	k.t.Helper()
	target := filepath.Join(k.blockRoot(), "publish", pv, pod)
	k.write(target, []byte{})
	return target
}

func TestRecordsFindBlock(t *testing.T) {
	tests := map[string]struct {
		setup   func(k *kubeletDir)
		staged  bool
		pods    []string
		wantErr error
		errText string
	}{
		"staged and published for two pods": {
			setup: func(k *kubeletDir) {
				k.blockRecord(testDriver, "vol-1", "pv-1")
				k.blockStage("pv-1")
				k.blockPublish("pv-1", "pod-b")
				k.blockPublish("pv-1", "pod-a")
				k.blockRecord(testDriver, "vol-2", "pv-2")
				k.blockPublish("pv-2", "pod-c")
			},
			staged: true, pods: []string{"pod-a", "pod-b"},
		},
		"published without staging (a driver without STAGE_UNSTAGE_VOLUME)": {
			setup: func(k *kubeletDir) {
				k.blockRecord(testDriver, "vol-1", "pv-1")
				k.blockPublish("pv-1", "pod-a")
			},
			pods: []string{"pod-a"},
		},
		"a filesystem volume's records are not a block volume's": {
			setup: func(k *kubeletDir) {
				k.stage(testDriver, "vol-1", "pv-1")
				k.publish("pod-a", testDriver, "vol-1", "pv-1")
			},
			wantErr: nodeprobe.ErrNotOnNode, errText: filepath.Join("volumeDevices", "pv-1", "data", "vol_data.json"),
		},
		"the record names another driver": {
			setup: func(k *kubeletDir) {
				k.blockRecord("other.csi.example.com", "vol-1", "pv-1")
				k.blockPublish("pv-1", "pod-a")
			},
			wantErr: nodeprobe.ErrBadRecord, errText: `names driver "other.csi.example.com"`,
		},
		"published, its record missing": {
			setup:   func(k *kubeletDir) { k.blockPublish("pv-1", "pod-a") },
			wantErr: nodeprobe.ErrBadRecord, errText: filepath.Join("pv-1", "data", "vol_data.json") + " is missing",
		},
		"a corrupt record": {
			setup: func(k *kubeletDir) {
				k.write(filepath.Join(k.blockRoot(), "pv-1", "data", "vol_data.json"), []byte("{not json"))
			},
			wantErr: nodeprobe.ErrBadRecord, errText: "is not kubelet's volume data",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			k := newKubeletDir(t)
			tc.setup(k)
			v, err := nodeprobe.Records{KubeletDir: k.dir}.FindBlock(testDriver, "vol-1", "pv-1")
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("FindBlock: %v, want %v with %q", err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("FindBlock: %v", err)
			}
			var want []string
			for _, pod := range tc.pods {
				want = append(want, filepath.Join(k.blockRoot(), "publish", "pv-1", pod))
			}
			if wantStaging := filepath.Join(k.blockRoot(), "staging", "pv-1"); (v.StagingPath == wantStaging) != tc.staged || (!tc.staged && v.StagingPath != "") {
				t.Errorf("staging path %q, want staged %t at %s", v.StagingPath, tc.staged, wantStaging)
			}
			if !slices.Equal(v.Targets, want) || !v.Block || v.PV != "pv-1" {
				t.Errorf("FindBlock = %+v, want block volume of pv-1 published at %q", v, want)
			}
		})
	}
	for _, pv := range []string{"staging", "publish", "a/b", ""} {
		if _, err := (nodeprobe.Records{KubeletDir: t.TempDir()}).FindBlock(testDriver, "vol-1", pv); !errors.Is(err, nodeprobe.ErrInvalidVolume) {
			t.Errorf("FindBlock of PersistentVolume %q: %v, want %v", pv, err, nodeprobe.ErrInvalidVolume)
		}
	}
}

// TestRecordsListHasBlockVolumes: a driver's raw block volumes are listed beside its filesystem
// volumes, so that the sweeps of a driver that lists nothing itself know them too.
func TestRecordsListHasBlockVolumes(t *testing.T) {
	k := newKubeletDir(t)
	k.stage(testDriver, "vol-fs", "pv-fs")
	k.blockRecord(testDriver, "vol-blk", "pv-blk")
	k.blockStage("pv-blk")
	k.blockPublish("pv-blk", "pod-1")
	k.blockRecord("other.csi.example.com", "vol-other", "pv-other")
	k.blockPublish("pv-other", "pod-2")
	got, err := nodeprobe.Records{KubeletDir: k.dir}.List(testDriver)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var summary []string
	for _, v := range got {
		s := v.Handle + " pv=" + v.PV + " block=" + map[bool]string{true: "yes", false: "no"}[v.Block]
		if v.StagingPath != "" {
			rel, _ := filepath.Rel(k.dir, v.StagingPath)
			s += " staged=" + rel
		}
		for _, target := range v.Targets {
			rel, _ := filepath.Rel(k.dir, target)
			s += " " + rel
		}
		summary = append(summary, s)
	}
	want := []string{
		"vol-blk pv=pv-blk block=yes staged=plugins/kubernetes.io/csi/volumeDevices/staging/pv-blk plugins/kubernetes.io/csi/volumeDevices/publish/pv-blk/pod-1",
		"vol-fs pv=pv-fs block=no staged=" + strings.TrimPrefix(nodeprobe.Records{KubeletDir: k.dir}.StagingDir(testDriver, "vol-fs"), k.dir+"/") + "/globalmount",
	}
	if !slices.Equal(summary, want) {
		t.Fatalf("List:\n got %q\nwant %q", summary, want)
	}
}

// TestProbeBlock probes raw block volumes: a device that reads is healthy; a device whose backend
// is gone (a loop device whose file was detached), a target that is no device, and a target
// that is gone each get a finding naming the target; a volume published for no pod is not probed,
// and says so. The devices are loop devices, so it needs root.
func TestProbeBlock(t *testing.T) {
	if os.Geteuid() != 0 {
		msg := "this test attaches loop devices and needs root"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	k := newKubeletDir(t)
	p := nodeprobe.New(nodeprobe.Options{KubeletDir: k.dir, Stat: nodeprobe.StatterOptions{Timeout: 10 * time.Second}})
	probe := func(pv string) ([]driverkit.Finding, error) {
		_, findings, err := p.Probe(context.Background(), nodeprobe.Request{Driver: testDriver, Handle: "h-" + pv, PV: pv, Block: true})
		return findings, err
	}

	// A device that reads, at the target of pod-a; the same device detached, at pod-b's.
	live := loopDevice(t)
	k.blockRecord(testDriver, "h-pv-live", "pv-live")
	k.blockStage("pv-live")
	deviceNode(t, live, k.blockPublish("pv-live", "pod-a"))
	if f, err := probe("pv-live"); err != nil || len(f) != 0 {
		t.Fatalf("probe of a block volume whose device reads: %v, %v; want healthy", reasons(k.dir, f), err)
	}

	dead := loopDevice(t)
	k.blockRecord(testDriver, "h-pv-dead", "pv-dead")
	deadTarget := k.blockPublish("pv-dead", "pod-b")
	deviceNode(t, dead, deadTarget)
	if out, err := exec.Command("losetup", "-d", dead).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d %s: %v: %s", dead, err, out)
	}
	f, err := probe("pv-dead")
	if err != nil || len(f) != 1 || f[0].Path != deadTarget || f[0].Reason != driverkit.ReasonMountCheckFailed || !strings.Contains(f[0].Message, "no such device") {
		t.Fatalf("probe of a block volume whose device lost its backend: %+v, %v; want %s at %s (ENXIO)", f, err, driverkit.ReasonMountCheckFailed, deadTarget)
	}

	// pod-c's target is a plain file, not the device; pod-d's is gone.
	k.blockRecord(testDriver, "h-pv-odd", "pv-odd")
	k.blockPublish("pv-odd", "pod-c")
	gone := k.blockPublish("pv-odd", "pod-d")
	deviceNode(t, live, gone)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	// kubelet's folder lists pod-d's target while it is being torn down: a dangling entry.
	if err := os.Symlink(filepath.Join(k.dir, "no-such-device"), gone); err != nil {
		t.Fatal(err)
	}
	f, err = probe("pv-odd")
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	got := reasons(k.dir, f)
	want := []string{
		driverkit.ReasonMountCheckFailed + "@plugins/kubernetes.io/csi/volumeDevices/publish/pv-odd/pod-c",
		driverkit.ReasonMountGone + "@plugins/kubernetes.io/csi/volumeDevices/publish/pv-odd/pod-d",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("probe of a block volume with a plain file and a dangling target: %q, want %q", got, want)
	}
	for _, x := range f {
		if x.Reason == driverkit.ReasonMountCheckFailed && !strings.Contains(x.Message, "block device required") {
			t.Errorf("finding of a target that is no device: %q, want it to say a block device is required", x.Message)
		}
	}

	k.blockRecord(testDriver, "h-pv-idle", "pv-idle")
	k.blockStage("pv-idle")
	if _, err := probe("pv-idle"); !errors.Is(err, nodeprobe.ErrNotProbed) || !strings.Contains(err.Error(), "published for no pod") {
		t.Fatalf("probe of a block volume published for no pod: %v, want %v saying why", err, nodeprobe.ErrNotProbed)
	}
	if _, err := probe("pv-absent"); !errors.Is(err, nodeprobe.ErrNotOnNode) {
		t.Fatalf("probe of a block volume kubelet keeps no record of: %v, want %v", err, nodeprobe.ErrNotOnNode)
	}
}

// loopDevice attaches a loop device to a file of 1 MiB and returns it; it is detached when the
// test ends.
func loopDevice(t *testing.T) string {
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

// deviceNode makes target a device node of the same device as dev, as a driver's NodePublish
// puts the device at kubelet's publish target.
func deviceNode(t *testing.T, dev, target string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(target)
	if err := unix.Mknod(target, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
		t.Fatalf("mknod %s: %v", target, err)
	}
}
