package driverkit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit"
)

func TestUnmountAllTwoLayers(t *testing.T) {
	requireMounts(t, false)
	dir := mkdir(t, t.TempDir(), "target")
	mountTmpfs(t, dir, 0)
	mountTmpfs(t, dir, 0)
	if n := mountCount(t, dir); n != 2 {
		t.Fatalf("%d mounts at %s, want 2 to start with", n, dir)
	}

	n, err := driverkit.UnmountAll(dir)
	if err != nil || n != 2 {
		t.Fatalf("UnmountAll = %d, %v; want 2, nil", n, err)
	}
	if left := mountCount(t, dir); left != 0 {
		t.Fatalf("%d mounts left at %s after UnmountAll", left, dir)
	}
	if n, err := driverkit.UnmountAll(dir); err != nil || n != 0 {
		t.Fatalf("UnmountAll with nothing mounted = %d, %v; want 0, nil", n, err)
	}
}

func TestUnmountAllDeadFUSEMount(t *testing.T) {
	requireMounts(t, true)
	mnt := mkdir(t, t.TempDir(), "staging")
	vol := newFUSEVolume(t, mnt)
	vol.signalDaemon(syscall.SIGSTOP) // a frozen mounter must not block the detach

	done := make(chan error, 1)
	go func() {
		_, err := driverkit.UnmountAll(mnt)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("UnmountAll of a frozen FUSE mount: %v", err)
		}
	case <-time.After(10 * time.Second):
		vol.killDaemon()
		t.Fatal("UnmountAll of a frozen FUSE mount blocked")
	}
	if n := mountCount(t, mnt); n != 0 {
		t.Fatalf("%d mounts left at %s", n, mnt)
	}
}

func TestBindMountReadOnly(t *testing.T) {
	requireMounts(t, false)
	dir := t.TempDir()
	source := mkdir(t, dir, "source")
	mountTmpfs(t, source, unix.MS_NOSUID|unix.MS_NODEV)
	if err := os.WriteFile(filepath.Join(source, dataFile), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := mkdir(t, dir, "target")
	cleanupMounts(t, target)

	if err := driverkit.BindMount(source, target, true); err != nil {
		t.Fatalf("BindMount read-only: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(target, dataFile)); err != nil || string(b) != "data" {
		t.Fatalf("read through the bind mount: %q, %v", b, err)
	}
	err := os.WriteFile(filepath.Join(target, "new"), []byte("x"), 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through a read-only bind mount: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(source, "new"), []byte("x"), 0o644); err != nil {
		t.Fatalf("the source became read-only too: %v", err)
	}
	top := topMount(t, target)
	for _, opt := range []string{"ro", "nosuid", "nodev"} {
		if !slices.Contains(mountOptions(top), opt) {
			t.Errorf("the read-only bind mount has options %v, want %s kept", mountOptions(top), opt)
		}
	}

	// A read-write bind mount stacked on top makes the target writable again.
	if err := driverkit.BindMount(source, target, false); err != nil {
		t.Fatalf("BindMount read-write on top: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "newer"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write through the read-write bind mount on top: %v", err)
	}
	if n := mountCount(t, target); n != 2 {
		t.Errorf("%d mounts at the target, want 2 stacked", n)
	}
}

func TestRepairRemountsReadOnlyStagingReadWrite(t *testing.T) {
	requireMounts(t, false)
	tests := map[string]struct {
		// makeReadOnly turns the healthy staging mount at path read-only.
		makeReadOnly func(path string) error
	}{
		"filesystem remounted read-only after errors": {
			makeReadOnly: func(path string) error {
				return unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID, "")
			},
		},
		"read-only mount flag": {
			makeReadOnly: func(path string) error {
				return unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID, "")
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			staging := mkdir(t, t.TempDir(), "staging")
			mountTmpfs(t, staging, unix.MS_NOSUID)
			if err := tc.makeReadOnly(staging); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(staging, "f"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
				t.Fatalf("write before the repair: %v, want EROFS", err)
			}

			c := driverkit.NewChecker(driverkit.CheckerOptions{})
			remounts := 0
			res, err := c.Repair(context.Background(), driverkit.Repair{
				VolumeID: "vol-ro", StagingPath: staging, Expect: driverkit.Expect{FSType: "tmpfs"},
				Remount: func(context.Context) error { remounts++; return nil },
			})
			if err != nil || len(res.Findings) != 0 {
				t.Fatalf("Repair = %+v, %v; want no findings", res, err)
			}
			if remounts != 0 {
				t.Errorf("Repair restarted the mounter of a read-only mount %d time(s); a remount is enough", remounts)
			}
			if err := os.WriteFile(filepath.Join(staging, "f"), nil, 0o644); err != nil {
				t.Fatalf("write after the repair: %v", err)
			}
			if top := topMount(t, staging); !slices.Contains(mountOptions(top), "nosuid") {
				t.Errorf("the remount dropped nosuid: options %v", mountOptions(top))
			}
			if len(res.Actions) != 1 || !strings.Contains(res.Actions[0], "read-write") {
				t.Errorf("Actions = %q, want one remount", res.Actions)
			}
		})
	}
}

func TestRepairHealthyVolumeChangesNothing(t *testing.T) {
	requireMounts(t, false)
	dir := t.TempDir()
	staging := mkdir(t, dir, "staging")
	mountTmpfs(t, staging, 0)
	target := mkdir(t, dir, "target")
	cleanupMounts(t, target)
	if err := driverkit.BindMount(staging, target, true); err != nil {
		t.Fatal(err)
	}

	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	res, err := c.Repair(context.Background(), driverkit.Repair{
		VolumeID: "vol-ok", StagingPath: staging,
		PublishTargets: []driverkit.PublishTarget{{Path: target, ReadOnly: true}},
		Remount:        func(context.Context) error { t.Error("Remount called for a healthy volume"); return nil },
	})
	if err != nil || len(res.Findings) != 0 || len(res.Actions) != 0 {
		t.Fatalf("Repair of a healthy volume = %+v, %v; want nothing done and nothing found", res, err)
	}
	if n := mountCount(t, target); n != 1 {
		t.Errorf("%d mounts at the publish target, want the one it had", n)
	}
}

func TestRepairRestoresGoneStagingAndPublishTargets(t *testing.T) {
	requireMounts(t, false)
	dir := t.TempDir()
	staging := mkdir(t, dir, "staging")
	cleanupMounts(t, staging)
	rw := mkdir(t, dir, "rw")
	ro := mkdir(t, dir, "ro")
	cleanupMounts(t, rw)
	cleanupMounts(t, ro)

	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	res, err := c.Repair(context.Background(), driverkit.Repair{
		VolumeID: "vol-gone", StagingPath: staging, Expect: driverkit.Expect{Source: testSource, FSType: "tmpfs"},
		PublishTargets: []driverkit.PublishTarget{{Path: rw}, {Path: ro, ReadOnly: true}},
		Remount: func(context.Context) error {
			return unix.Mount(testSource, staging, "tmpfs", 0, "size=8m")
		},
	})
	if err != nil || len(res.Findings) != 0 {
		t.Fatalf("Repair = %+v, %v; want no findings", res, err)
	}
	if err := os.WriteFile(filepath.Join(rw, dataFile), []byte("data"), 0o644); err != nil {
		t.Fatalf("write through the repaired read-write target: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(staging, dataFile)); err != nil || string(b) != "data" {
		t.Fatalf("the write through the target did not reach the staging mount: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(ro, dataFile)); err != nil || string(b) != "data" {
		t.Fatalf("read through the repaired read-only target: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through the repaired read-only target: %v, want EROFS", err)
	}
}

func TestRepairRemountFails(t *testing.T) {
	staging := mkdir(t, t.TempDir(), "staging")
	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	boom := errors.New("mounter binary missing")
	res, err := c.Repair(context.Background(), driverkit.Repair{
		VolumeID: "vol-x", StagingPath: staging,
		Remount: func(context.Context) error { return boom },
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Repair with a failing Remount: %v, want its error", err)
	}
	if !slices.Contains(reasons(res.Findings), driverkit.ReasonMountGone) {
		t.Errorf("findings after a failed repair = %+v, want the staging mount still gone", res.Findings)
	}
}

// TestRepairPropagatesToWorkloads plays the failure the kit exists for: a FUSE mounter dies
// under a staging mount with a publish target, while a workload in its own mount namespace
// uses the target. The repair must reach the workload when its mount propagation lets it
// receive mounts, and must say the pod needs a restart when it does not.
func TestRepairPropagatesToWorkloads(t *testing.T) {
	requireMounts(t, true)
	tests := map[string]struct {
		private      bool
		wantReads    bool
		wantFindings []string
	}{
		"HostToContainer workload reads again": {wantReads: true},
		"workload with propagation None needs a restart": {
			private: true, wantReads: false, wantFindings: []string{driverkit.ReasonStaleMountInPods},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			root := sharedRoot(t)
			staging := mkdir(t, root, "staging")
			target := mkdir(t, root, "pods", "pod-1", "volume")
			vol := newFUSEVolume(t, staging)
			cleanupMounts(t, target)
			if err := driverkit.BindMount(staging, target, false); err != nil {
				t.Fatal(err)
			}
			w := startWorkload(t, target, tc.private)
			if line, ok := w.waitReads(true, 10*time.Second); !ok {
				t.Fatalf("the workload cannot read the healthy volume: %q %s", line, w.errors())
			}

			vol.killDaemon()
			if line, ok := w.waitReads(false, 10*time.Second); !ok {
				t.Fatalf("the workload still reads after the mounter died: %q", line)
			}

			c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: 2 * time.Second})
			res, err := c.Repair(context.Background(), driverkit.Repair{
				VolumeID: "vol-fuse", StagingPath: staging, Expect: driverkit.Expect{Source: testSource, FSType: fuseFSType},
				PublishTargets: []driverkit.PublishTarget{{Path: target}},
				Remount:        func(context.Context) error { return vol.remount() },
			})
			t.Logf("actions: %q", res.Actions)
			if err != nil {
				t.Fatalf("Repair: %v (findings %+v)", err, res.Findings)
			}
			if got := reasons(res.Findings); !slices.Equal(got, tc.wantFindings) {
				t.Fatalf("Repair findings = %+v, want reasons %v", res.Findings, tc.wantFindings)
			}
			for _, f := range res.Findings {
				t.Logf("finding: %s", f.Message)
				if !strings.Contains(f.Message, "1 process(es) in 1 other mount namespace(s)") || !strings.Contains(f.Message, "restart") {
					t.Errorf("message %q should count the processes and namespaces and say to restart the pods", f.Message)
				}
			}

			// A later probe finds the same from the mount table alone, without the dead device
			// the repair remembered, and stops finding it once the pod is gone. Right after the
			// repair it takes the repair's own search of the namespaces, begun after the repair
			// changed the mounts, instead of one more.
			expect := driverkit.Expect{Source: testSource, FSType: fuseFSType}
			searches := driverkit.ScansRun(c)
			if f, found := c.StaleInPods("vol-fuse", staging, expect); found != tc.private || (found && f.Reason != driverkit.ReasonStaleMountInPods) {
				t.Errorf("StaleInPods after the repair = %+v, %v; want found=%v", f, found, tc.private)
			}
			if tc.private {
				if n := driverkit.ScansRun(c) - searches; n != 0 {
					t.Errorf("StaleInPods right after the repair ran %d searches of its own, want the repair's", n)
				}
				w.kill()
				// A search at most StaleSearchReuse old may still show the pod.
				time.Sleep(driverkit.StaleSearchReuse)
				if f, found := c.StaleInPods("vol-fuse", staging, expect); found {
					t.Errorf("StaleInPods once the pod is gone = %+v, want nothing", f)
				}
			}

			// The node itself sees the repaired volume at both paths.
			for _, p := range []string{staging, target} {
				if _, err := os.ReadFile(filepath.Join(p, dataFile)); err != nil {
					t.Errorf("read at %s on the node after the repair: %v", p, err)
				}
			}
			if tc.wantReads {
				if line, ok := w.waitReads(true, 10*time.Second); !ok {
					t.Fatalf("the workload does not read the repaired volume: %q", line)
				}
				return
			}
			time.Sleep(200 * time.Millisecond)
			if line := w.lastLine(); line == "ok" {
				t.Fatalf("a workload with propagation None reads after the repair; the finding would be wrong")
			}
		})
	}
}

func TestStaleMounts(t *testing.T) {
	requireMounts(t, false)
	dir := mkdir(t, t.TempDir(), "mnt")
	mountTmpfs(t, dir, 0)
	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	dev, err := c.MountDevice(dir)
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}

	stale, err := c.StaleMounts([]string{dev})
	if err != nil {
		t.Fatalf("StaleMounts: %v", err)
	}
	i := slices.IndexFunc(stale, func(m driverkit.StaleMount) bool { return m.Namespace == own })
	if i < 0 || stale[i].MountPoint != dir || stale[i].Device != dev || stale[i].PID <= 0 {
		t.Fatalf("StaleMounts(%s) = %+v, want %s in this process's namespace %s", dev, stale, dir, own)
	}

	// A mount stacked on top hides it: it is no longer what the path shows.
	mountTmpfs(t, dir, 0)
	stale, err = c.StaleMounts([]string{dev})
	if err != nil {
		t.Fatalf("StaleMounts: %v", err)
	}
	if slices.ContainsFunc(stale, func(m driverkit.StaleMount) bool { return m.Namespace == own }) {
		t.Fatalf("StaleMounts(%s) = %+v, but that mount is covered by another one", dev, stale)
	}
}

func TestStaleMountsUnreadableProc(t *testing.T) {
	c := driverkit.NewChecker(driverkit.CheckerOptions{Proc: filepath.Join(t.TempDir(), "no-proc")})
	if _, err := c.StaleMounts([]string{"0:1"}); err == nil {
		t.Fatal("StaleMounts over a missing proc folder succeeded")
	}
}

func TestRepairFrozenMounter(t *testing.T) {
	requireMounts(t, true)
	root := t.TempDir()
	staging := mkdir(t, root, "staging")
	target := mkdir(t, root, "target")
	vol := newFUSEVolume(t, staging)
	cleanupMounts(t, target)
	if err := driverkit.BindMount(staging, target, true); err != nil {
		t.Fatal(err)
	}
	vol.signalDaemon(syscall.SIGSTOP)

	const timeout = 300 * time.Millisecond
	c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: timeout})
	start := time.Now()
	res, err := c.Repair(context.Background(), driverkit.Repair{
		VolumeID: "vol-frozen", StagingPath: staging, Expect: driverkit.Expect{FSType: fuseFSType},
		PublishTargets: []driverkit.PublishTarget{{Path: target, ReadOnly: true}},
		Remount:        func(context.Context) error { return vol.remount() },
	})
	t.Logf("actions: %q", res.Actions)
	if err != nil || len(res.Findings) != 0 {
		t.Fatalf("Repair of a volume whose mounter is frozen = %+v, %v; want no findings", res.Findings, err)
	}
	if took := time.Since(start); took > timeout+10*time.Second {
		t.Errorf("Repair took %s", took)
	}
	if b, err := os.ReadFile(filepath.Join(target, dataFile)); err != nil || string(b) != "data" {
		t.Fatalf("read through the publish target after the repair: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through the read-only publish target after the repair: %v, want EROFS", err)
	}
}

func TestRepairLeavesMissingPublishTarget(t *testing.T) {
	requireMounts(t, false)
	dir := t.TempDir()
	staging := mkdir(t, dir, "staging")
	mountTmpfs(t, staging, 0)
	missing := filepath.Join(dir, "pods", "deleted", "volume")

	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	res, err := c.Repair(context.Background(), driverkit.Repair{
		VolumeID: "vol-1", StagingPath: staging,
		PublishTargets: []driverkit.PublishTarget{{Path: missing}},
		Remount:        func(context.Context) error { return nil },
	})
	if err != nil {
		t.Fatalf("Repair with a publish target that no longer exists: %v", err)
	}
	if len(res.Findings) != 1 || res.Findings[0].Reason != driverkit.ReasonMountGone || !strings.Contains(res.Findings[0].Message, missing) {
		t.Fatalf("findings = %+v, want %s naming %s", res.Findings, driverkit.ReasonMountGone, missing)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Repair created the missing publish target: %v", err)
	}
}

// TestRepairAgainAfterTheNewMounterDied repairs a volume twice, as after a node plugin that
// crash-loops: the mounter the first repair started dies too (with the first repair done or
// cut short), and the second repair must still reach a HostToContainer workload.
func TestRepairAgainAfterTheNewMounterDied(t *testing.T) {
	requireMounts(t, true)
	tests := map[string]struct {
		// cutShort ends the first repair once its mounter has mounted, before the publish
		// target gets the new mount, as a node plugin killed then does.
		cutShort bool
	}{
		"first repair done":      {},
		"first repair cut short": {cutShort: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			root := sharedRoot(t)
			staging := mkdir(t, root, "staging")
			target := mkdir(t, root, "pods", "pod-1", "volume")
			vol := newFUSEVolume(t, staging)
			cleanupMounts(t, target)
			if err := driverkit.BindMount(staging, target, false); err != nil {
				t.Fatal(err)
			}
			w := startWorkload(t, target, false)
			if line, ok := w.waitReads(true, 10*time.Second); !ok {
				t.Fatalf("the workload cannot read the healthy volume: %q %s", line, w.errors())
			}
			vol.killDaemon()
			if line, ok := w.waitReads(false, 10*time.Second); !ok {
				t.Fatalf("the workload still reads after the mounter died: %q", line)
			}

			c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: 2 * time.Second})
			repair := driverkit.Repair{
				VolumeID: "vol-fuse", StagingPath: staging, Expect: driverkit.Expect{Source: testSource, FSType: fuseFSType},
				PublishTargets: []driverkit.PublishTarget{{Path: target}},
				Remount:        func(context.Context) error { return vol.remount() },
			}
			first := repair
			if tc.cutShort {
				first.Remount = func(context.Context) error {
					if err := vol.remount(); err != nil {
						return err
					}
					return errors.New("the node plugin was killed")
				}
			}
			res, err := c.Repair(context.Background(), first)
			t.Logf("first repair: actions %q, findings %+v, err %v", res.Actions, res.Findings, err)
			vol.killDaemon()
			if line, ok := w.waitReads(false, 10*time.Second); !ok {
				t.Fatalf("the workload still reads after the second mounter died: %q", line)
			}

			res, err = c.Repair(context.Background(), repair)
			t.Logf("second repair: actions %q", res.Actions)
			if err != nil || len(res.Findings) > 0 {
				t.Errorf("second Repair = findings %+v, error %v; want none", res.Findings, err)
			}
			if line, ok := w.waitReads(true, 10*time.Second); !ok {
				t.Fatalf("the workload does not read the volume after the second repair: %q", line)
			}
		})
	}
}

// TestRepairDoesNotTakeAReusedDeviceForDead repairs two volumes at once, as a restart sweep
// does. The kernel numbers FUSE mounts from a pool and hands a number out again as soon as the
// last mount of its filesystem is gone: detaching volume A's dead staging mount frees its
// number, and volume B's new mounter, started while A's repair runs, may get it. A's search for
// pods that still see its dead mount must not take B's live mount, which a HostToContainer
// workload received, for A's dead one.
func TestRepairDoesNotTakeAReusedDeviceForDead(t *testing.T) {
	requireMounts(t, true)
	root := sharedRoot(t)
	stagingA := mkdir(t, root, "a", "staging")
	volA := newFUSEVolume(t, stagingA)
	stagingB := mkdir(t, root, "b", "staging")
	targetB := mkdir(t, root, "pods", "pod-b", "volume")
	volB := newFUSEVolume(t, stagingB)
	cleanupMounts(t, targetB)
	if err := driverkit.BindMount(stagingB, targetB, false); err != nil {
		t.Fatal(err)
	}
	w := startWorkload(t, targetB, false)
	if line, ok := w.waitReads(true, 10*time.Second); !ok {
		t.Fatalf("the workload cannot read the healthy volume: %q %s", line, w.errors())
	}
	volA.killDaemon()
	volB.killDaemon()
	if line, ok := w.waitReads(false, 10*time.Second); !ok {
		t.Fatalf("the workload still reads after the mounter died: %q", line)
	}

	c := driverkit.NewChecker(driverkit.CheckerOptions{StatTimeout: 2 * time.Second})
	expect := driverkit.Expect{Source: testSource, FSType: fuseFSType}
	deadA := topMount(t, stagingA)
	var newB string
	resA, errA := c.Repair(context.Background(), driverkit.Repair{
		VolumeID: "vol-a", StagingPath: stagingA, Expect: expect,
		Remount: func(ctx context.Context) error {
			// Volume B is repaired while A's dead staging mount is already detached.
			resB, err := c.Repair(ctx, driverkit.Repair{
				VolumeID: "vol-b", StagingPath: stagingB, Expect: expect,
				PublishTargets: []driverkit.PublishTarget{{Path: targetB}},
				Remount:        func(context.Context) error { return volB.remount() },
			})
			if err != nil || len(resB.Findings) > 0 {
				return fmt.Errorf("repair of volume B: findings %+v, error %v", resB.Findings, err)
			}
			m := topMount(t, stagingB)
			newB = fmt.Sprintf("%d:%d", m.Major, m.Minor)
			return volA.remount()
		},
	})
	t.Logf("A's dead mount was device %d:%d, B's new one is %s", deadA.Major, deadA.Minor, newB)
	if errA != nil || len(resA.Findings) > 0 {
		t.Errorf("repair of volume A: findings %+v, error %v; want none", resA.Findings, errA)
	}
	if line, ok := w.waitReads(true, 10*time.Second); !ok {
		t.Fatalf("the workload does not read volume B after its repair: %q", line)
	}
}

// TestStaleMountsShareSearches: the probes and repairs of a node plugin's restart each search the
// machine's mount namespaces, a read of every process's namespace; calls at once share the
// searches (one running, one for all that came meanwhile) and each still gets its own answer.
func TestStaleMountsShareSearches(t *testing.T) {
	proc := t.TempDir()
	// 500 processes in the host's namespace, and one pod's process that keeps device 0:77.
	writeProc := func(pid int, ns, table string) { driverkit.WriteFakeProcess(t, proc, pid, ns, table) }
	host := "22 1 0:21 / / rw - ext4 /dev/root rw\n"
	for pid := 1; pid <= 500; pid++ {
		writeProc(pid, "mnt:[4026531840]", host)
	}
	writeProc(5000, "mnt:[4026532999]", host+"30 22 0:77 / /data rw - fuse.refdriver vol-a rw\n31 22 0:78 / /other rw - fuse.refdriver vol-b rw\n")
	c := driverkit.NewChecker(driverkit.CheckerOptions{Proc: proc})

	const calls = 16
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make([][]driverkit.StaleMount, calls)
	errs := make([]error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			dev := []string{"0:77", "0:78"}[i%2]
			results[i], errs[i] = c.StaleMounts([]string{dev})
		}()
	}
	close(start)
	wg.Wait()
	for i := range calls {
		want := []string{"/data", "/other"}[i%2]
		if errs[i] != nil || len(results[i]) != 1 || results[i][0].MountPoint != want || results[i][0].PID != 5000 {
			t.Errorf("call %d: %+v, %v; want %s in process 5000", i, results[i], errs[i], want)
		}
	}
	if n := driverkit.ScansRun(c); n > 3 {
		t.Errorf("%d calls at once ran %d searches of the namespaces, want them shared (at most 3)", calls, n)
	}
	// A call after those sees the namespaces as they are now.
	if err := os.WriteFile(filepath.Join(proc, "5000", "mountinfo"), []byte(host), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := c.StaleMounts([]string{"0:77"}); err != nil || len(got) != 0 {
		t.Errorf("after the pod let go of the mount: %+v, %v; want none", got, err)
	}
}
