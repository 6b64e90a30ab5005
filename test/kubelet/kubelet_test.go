package kubelet_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"

	"github.com/volume-healer/volume-healer/test/kubelet"
)

func TestStageAndPublishUseKubeletPaths(t *testing.T) {
	requireRoot(t)
	tests := map[string]struct {
		stages bool
	}{
		"driver with STAGE_UNSTAGE_VOLUME":    {stages: true},
		"driver without STAGE_UNSTAGE_VOLUME": {stages: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			node, conn := serveFakeNode(t, tc.stages)
			k := newKubelet(t)
			vol := kubelet.Volume{
				DriverName:    "fake.csi.example.com",
				Handle:        "0001-0009-pool-0000000000000002-vol",
				PVName:        "pvc-7d1e",
				VolumeContext: map[string]string{"pool": "a"},
			}
			const podUID = "1f0c7a52-0b9e-4c55-9d6a-2f1b0e8c3d44"

			// kubelet's layout, written out here rather than taken from the package under test.
			sum := sha256.Sum256([]byte(vol.Handle))
			wantStaging := filepath.Join(k.Root(), "plugins", "kubernetes.io", "csi", vol.DriverName, hex.EncodeToString(sum[:]), "globalmount")
			wantTarget := filepath.Join(k.Root(), "pods", podUID, "volumes", "kubernetes.io~csi", vol.PVName, "mount")
			if got := k.StagingPath(vol.DriverName, vol.Handle); got != wantStaging {
				t.Errorf("StagingPath = %s, want %s", got, wantStaging)
			}
			if got := k.PublishPath(podUID, vol.PVName); got != wantTarget {
				t.Errorf("PublishPath = %s, want %s", got, wantTarget)
			}

			if err := k.Stage(ctx, conn, vol); err != nil {
				t.Fatal(err)
			}
			target, err := k.Publish(ctx, conn, vol, podUID)
			if err != nil {
				t.Fatal(err)
			}
			if target != wantTarget {
				t.Errorf("Publish returned %s, want %s", target, wantTarget)
			}

			staged, published := node.requests()
			wantMounts := []string{wantTarget}
			wantStagingArg := ""
			if tc.stages {
				if len(staged) != 1 || staged[0].GetStagingTargetPath() != wantStaging {
					t.Fatalf("NodeStageVolume calls %v, want one at %s", staged, wantStaging)
				}
				checkCapability(t, "NodeStageVolume", staged[0].GetVolumeCapability())
				wantMounts = append(wantMounts, wantStaging)
				wantStagingArg = wantStaging
			} else if len(staged) != 0 {
				t.Errorf("NodeStageVolume called %d times on a driver that does not stage", len(staged))
			}
			if len(published) != 1 {
				t.Fatalf("NodePublishVolume called %d times, want once", len(published))
			}
			if got := published[0].GetStagingTargetPath(); got != wantStagingArg {
				t.Errorf("NodePublishVolume staging_target_path = %q, want %q", got, wantStagingArg)
			}
			if got := published[0].GetVolumeContext()["pool"]; got != "a" {
				t.Errorf("NodePublishVolume volume_context[pool] = %q, want the volume's %q", got, "a")
			}
			checkCapability(t, "NodePublishVolume", published[0].GetVolumeCapability())

			// Both paths exist, and the volume is really mounted where kubelet said.
			if fi, err := os.Stat(wantStaging); err != nil || !fi.IsDir() {
				t.Errorf("staging path: want a folder: %v", err)
			}
			if got := mountsUnder(t, k.Root()); !sameSet(got, append(wantMounts, k.Root())) {
				t.Errorf("mounts under the root: %v, want the root and %v", got, wantMounts)
			}
			if err := os.WriteFile(filepath.Join(target, "hello"), []byte("hi"), 0o644); err != nil {
				t.Fatalf("write to the published volume: %v", err)
			}
			if tc.stages {
				if b, err := os.ReadFile(filepath.Join(wantStaging, "hello")); err != nil || string(b) != "hi" {
					t.Errorf("file written at the publish path, read at the staging path: %q, %v", b, err)
				}
			}

			if err := k.Unpublish(ctx, conn, vol, podUID); err != nil {
				t.Fatal(err)
			}
			if err := k.Unstage(ctx, conn, vol); err != nil {
				t.Fatal(err)
			}
			// kubelet's removeMountDir takes the folders it made away once nothing is mounted.
			for _, p := range []string{wantTarget, filepath.Dir(wantTarget), wantStaging, filepath.Dir(wantStaging)} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s after unpublish and unstage: want it removed, stat says %v", p, err)
				}
			}
			if got := mountsUnder(t, k.Root()); !slices.Equal(got, []string{k.Root()}) {
				t.Errorf("mounts under the root after unpublish and unstage: %v, want only the root", got)
			}
		})
	}
}

func checkCapability(t *testing.T, call string, c *csi.VolumeCapability) {
	t.Helper()
	if c.GetMount() == nil {
		t.Errorf("%s volume_capability: want a mount access type, got %v", call, c)
	}
	if got := c.GetAccessMode().GetMode(); got != csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER {
		t.Errorf("%s access mode = %s, want SINGLE_NODE_WRITER", call, got)
	}
}

func TestRootIsSharedBind(t *testing.T) {
	requireRoot(t)
	k := newKubelet(t)
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(k.Root()))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 1 {
		t.Fatalf("mounts at %s: %d, want the one bind", k.Root(), len(mounts))
	}
	if !strings.Contains(mounts[0].Optional, "shared:") {
		t.Errorf("root %s: optional fields %q, want shared:N", k.Root(), mounts[0].Optional)
	}
	for _, dir := range []string{"pods", "plugins"} {
		if fi, err := os.Stat(filepath.Join(k.Root(), dir)); err != nil || !fi.IsDir() {
			t.Errorf("%s: want kubelet's folder: %v", dir, err)
		}
	}
}

func TestCloseUnmountsEveryLayer(t *testing.T) {
	requireRoot(t)
	ctx := testContext(t)
	_, conn := serveFakeNode(t, true)
	root := filepath.Join(t.TempDir(), "kubelet")
	k, err := kubelet.New(root)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = k.Close()
		}
	})
	vol := kubelet.Volume{DriverName: "fake.csi.example.com", Handle: "vol-1", PVName: "pv-1"}
	if err := k.Stage(ctx, conn, vol); err != nil {
		t.Fatal(err)
	}
	target, err := k.Publish(ctx, conn, vol, "pod-1")
	if err != nil {
		t.Fatal(err)
	}
	// Two heals stacked on the publish path, and a mount deeper inside the volume.
	for range 2 {
		if err := syscall.Mount("tmpfs", target, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
	}
	deep := filepath.Join(target, "sub")
	if err := os.Mkdir(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", deep, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	if n := len(mountsUnder(t, k.Root())); n < 6 {
		t.Fatalf("%d mounts under the root before Close, want at least 6 (root, staging, target, 2 layers, sub)", n)
	}

	closed = true
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if left := mountsUnder(t, k.Root()); len(left) > 0 {
		t.Errorf("mounts left at or below %s after Close: %v", k.Root(), left)
	}
	if err := k.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
