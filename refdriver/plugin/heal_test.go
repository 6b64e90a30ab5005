package plugin_test

import (
	"bytes"
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

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/driverkit"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/plugin"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// TestGroupKillAndHeal plays the failure volume-healer exists for: the node plugin's container
// dies with its mounters, the published volume answers ENOTCONN, the plugin comes back, and a
// heal makes the volume readable and writable again where the pod has it.
func TestGroupKillAndHeal(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	v := p.createStagePublish(e, "pvc-restart")
	t.Logf("NodeStageVolume took %s", v.stageTook.Round(time.Millisecond))
	if err := writeRead(v.target, "before", "written before the kill"); err != nil {
		t.Fatalf("write through the publish target: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(e.stateDir, "volumes", v.id, "before")); err != nil || string(got) != "written before the kill" {
		t.Fatalf("the file is not in the volume's backing folder: %q, %v", got, err)
	}

	killed := time.Now()
	p.killGroup()
	if _, err := os.ReadFile(filepath.Join(v.target, "before")); !deadMount(err) {
		t.Fatalf("reading through the target after the group kill: %v, want ENOTCONN or ECONNABORTED", err)
	}

	p = e.start()
	restarted := time.Now()
	probe, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id, PublishTargetPaths: []string{v.target}})
	if err != nil {
		t.Fatalf("ProbeVolume after the restart: %v", err)
	}
	if !hasHealth(probe.GetHealthStatuses(), csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountDisconnected) || !probe.GetHealable() {
		t.Fatalf("ProbeVolume after the restart = %v healable=%t, want INACCESSIBLE/%s and healable",
			probe.GetHealthStatuses(), probe.GetHealable(), driverkit.ReasonMountDisconnected)
	}
	healStart := time.Now()
	heal, err := p.healer.HealVolume(ctx(t), &healerv1alpha1.HealVolumeRequest{VolumeId: v.id})
	if err != nil {
		t.Fatalf("HealVolume: %v", err)
	}
	healTook := time.Since(healStart)
	if len(heal.GetHealthStatuses()) > 0 {
		t.Fatalf("HealVolume left %v", heal.GetHealthStatuses())
	}
	got, err := os.ReadFile(filepath.Join(v.target, "before"))
	if err != nil || string(got) != "written before the kill" {
		t.Fatalf("reading through the target after the heal: %q, %v", got, err)
	}
	readable := time.Since(killed)
	if err := writeRead(v.target, "after", "written after the heal"); err != nil {
		t.Fatalf("writing through the target after the heal: %v", err)
	}
	t.Logf("group kill -> healed, readable target: %s (plugin restart until it answered %s, probe %s, heal %s)",
		readable.Round(time.Millisecond), restarted.Sub(killed).Round(time.Millisecond),
		healStart.Sub(restarted).Round(time.Millisecond), healTook.Round(time.Millisecond))

	if probe, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id}); err != nil || len(probe.GetHealthStatuses()) > 0 {
		t.Errorf("ProbeVolume after the heal = %v, %v; want healthy", probe.GetHealthStatuses(), err)
	}
	p.teardown(v)
	e.expectNothingLeft()
}

// TestPluginKilledAlone kills the plugin but not its mounters (a crash of the plugin process
// only): the volume keeps working, the restarted plugin finds it healthy without adopting the
// old mounter, and unstaging still stops that mounter, which is no child of the new run.
func TestPluginKilledAlone(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	v := p.createStagePublish(e, "pvc-alone")
	old := p.status(v.id).MounterPID
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if err := writeRead(v.target, "f", "the mounter outlived the plugin"); err != nil {
		t.Fatalf("write through the target with the plugin dead: %v", err)
	}

	p = e.start()
	if vs := p.status(v.id); vs.MounterPID != old || !vs.MounterRunning || vs.Condition != control.Healthy {
		t.Errorf("after the restart the control reports %+v, want the healthy volume with mounter %d", vs, old)
	}
	if probe, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id}); err != nil || len(probe.GetHealthStatuses()) > 0 {
		t.Errorf("ProbeVolume = %v, %v; want healthy", probe.GetHealthStatuses(), err)
	}
	p.teardown(v)
	e.expectNothingLeft()
}

// TestFaults breaks a published volume in each way the control interface can, at the level of
// the mounts, and checks what a workload would notice, what a probe reports, and what a heal
// repairs; with the plugin's own mounter and with rclone.
func TestFaults(t *testing.T) {
	for _, mounter := range stockMounters {
		t.Run(mounter, func(t *testing.T) { testFaults(t, mounter) })
	}
}

func testFaults(t *testing.T, mounter string) {
	if mounter == "rclone" {
		requireRclone(t)
	}
	e := newEnv(t)
	e.args = []string{"--mounter", mounter}
	p := e.start()

	t.Run("mounter killed", func(t *testing.T) {
		v := p.createStagePublish(e, "pvc-killed")
		defer p.teardown(v)
		vs := p.status(v.id)
		if !vs.MounterRunning {
			t.Fatalf("the control reports no running mounter: %+v", vs)
		}
		if err := syscall.Kill(vs.MounterPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 10*time.Second, "the mounter to die", poll.True(func() bool { return !p.status(v.id).MounterRunning }))
		// A listing reaches the mounter; a stat may be answered from the kernel's cache.
		if _, err := os.ReadDir(v.target); !deadMount(err) {
			t.Fatalf("listing the target: %v, want ENOTCONN or ECONNABORTED", err)
		}
		expectCondition(t, p, v, control.Gone)
		expectProbe(t, p, v, csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountDisconnected, true)
		expectCSIHealth(t, p, v, csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountDisconnected)
		expectHealed(t, p, v)
		expectCSIHealth(t, p, v, 0, "")
	})

	t.Run("read-only", func(t *testing.T) {
		v := p.createStagePublish(e, "pvc-readonly")
		defer p.teardown(v)
		if err := unix.Mount("", v.staging, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			t.Fatalf("remount the staging mount read-only: %v", err)
		}
		if err := writeRead(v.target, "f", "x"); !errors.Is(err, syscall.EROFS) {
			t.Fatalf("write through the target: %v, want EROFS", err)
		}
		expectCondition(t, p, v, control.ReadOnly)
		expectProbe(t, p, v, csi.VolumeHealthErrorType_DEGRADED, driverkit.ReasonReadOnlyMount, true)
		expectCSIHealth(t, p, v, csi.VolumeHealthErrorType_DEGRADED, driverkit.ReasonReadOnlyMount)
		expectHealed(t, p, v)
		expectCSIHealth(t, p, v, 0, "")
	})

	t.Run("hung", func(t *testing.T) {
		v := p.createStagePublish(e, "pvc-hung")
		defer p.teardown(v)
		if err := writeRead(v.target, "f", "before the freeze"); err != nil {
			t.Fatal(err)
		}
		vs := p.status(v.id)
		if err := syscall.Kill(vs.MounterPID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// The signal stops the mounter's threads one by one; until the last has stopped, it may
		// still answer the probe's stat.
		if err := plugin.WaitStopped(vs.MounterPID, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		// Nothing in this process touches the frozen mount: it would hang until the heal.
		start := time.Now()
		expectProbe(t, p, v, csi.VolumeHealthErrorType_INACCESSIBLE, driverkit.ReasonMountHung, true)
		if took := time.Since(start); took < e.statTimeout || took > 3*e.statTimeout {
			t.Errorf("the probe of the hung volume took %s, want about the stat timeout %s", took, e.statTimeout)
		}
		expectHealed(t, p, v)
		if got, err := os.ReadFile(filepath.Join(v.target, "f")); err != nil || string(got) != "before the freeze" {
			t.Errorf("read through the target after the heal: %q, %v", got, err)
		}
	})

	t.Run("data lost", func(t *testing.T) {
		v := p.createStagePublish(e, "pvc-lost")
		defer p.teardown(v)
		if err := writeRead(v.target, "f", "written before the loss"); err != nil {
			t.Fatal(err)
		}
		vs := p.status(v.id)
		if err := os.RemoveAll(vs.BackingPath); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(v.target, "f")); err == nil {
			t.Errorf("reading a file of a volume whose data is gone succeeded: %q", got)
		}
		// The own mounter fails a listing of its removed folder; rclone's listing may still succeed.
		if _, err := os.ReadDir(v.target); err == nil && mounter == "refdriver" {
			t.Errorf("listing the target of a volume whose data is gone succeeded")
		}
		expectCondition(t, p, v, control.Lost)
		expectProbe(t, p, v, csi.VolumeHealthErrorType_DATA_LOSS, driverkit.ReasonDataLoss, false)
		_, err := p.healer.HealVolume(ctx(t), &healerv1alpha1.HealVolumeRequest{VolumeId: v.id})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("HealVolume of a lost volume: %v, want FAILED_PRECONDITION", err)
		}
		if _, err := os.Stat(vs.BackingPath); err == nil {
			t.Errorf("the refused heal made a new backing folder, which would pass an empty volume for the lost one")
		}
	})

	e.expectNothingLeft()
}

func hasHealth(entries []*csi.VolumeHealth_VolumeHealthEntry, s csi.VolumeHealthErrorType, reason string) bool {
	return slices.ContainsFunc(entries, func(e *csi.VolumeHealth_VolumeHealthEntry) bool {
		return e.GetStatus() == s && e.GetReason() == reason
	})
}

func expectProbe(t *testing.T, p *proc, v *volume, s csi.VolumeHealthErrorType, reason string, healable bool) {
	t.Helper()
	resp, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
	if err != nil {
		t.Fatalf("ProbeVolume: %v", err)
	}
	if !hasHealth(resp.GetHealthStatuses(), s, reason) || resp.GetHealable() != healable {
		t.Fatalf("ProbeVolume = %v healable=%t, want %s/%s healable=%t", resp.GetHealthStatuses(), resp.GetHealable(), s, reason, healable)
	}
}

// expectCSIHealth checks what kubelet and a health monitor learn through the CSI Node service
// about the volume at its publish target: NodeGetVolumeHealth reports the entry s/reason (none
// when s is 0), and NodeGetVolumeStats answers INTERNAL for an inaccessible mount and the file
// system's usage otherwise.
func expectCSIHealth(t *testing.T, p *proc, v *volume, s csi.VolumeHealthErrorType, reason string) {
	t.Helper()
	health, err := p.node.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{
		VolumeId: v.id, StagingTargetPath: v.staging, VolumePublishPath: v.target,
	})
	if err != nil {
		t.Fatalf("NodeGetVolumeHealth: %v", err)
	}
	entries := health.GetVolumeHealth().GetHealthStatuses()
	if s == 0 && len(entries) > 0 || s != 0 && !hasHealth(entries, s, reason) {
		t.Errorf("NodeGetVolumeHealth = %v, want %s/%s", entries, s, reason)
	}
	stats, err := p.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: v.target})
	switch {
	case s == csi.VolumeHealthErrorType_INACCESSIBLE && status.Code(err) != codes.Internal:
		t.Errorf("NodeGetVolumeStats of an inaccessible mount = %v, %v; want INTERNAL", stats.GetUsage(), err)
	case s != csi.VolumeHealthErrorType_INACCESSIBLE && (err != nil || len(stats.GetUsage()) != 2 || stats.GetUsage()[0].GetTotal() <= 0):
		t.Errorf("NodeGetVolumeStats = %v, %v; want the bytes and inodes of the file system", stats.GetUsage(), err)
	}
}

// expectCondition checks what the control interface observes.
func expectCondition(t *testing.T, p *proc, v *volume, want control.Condition) {
	t.Helper()
	if vs := p.status(v.id); vs.Condition != want {
		t.Errorf("the control reports condition %q, want %q (findings %+v)", vs.Condition, want, vs.Findings)
	}
}

// expectHealed heals the volume and checks that it is writable through its target again.
func expectHealed(t *testing.T, p *proc, v *volume) {
	t.Helper()
	resp, err := p.healer.HealVolume(ctx(t), &healerv1alpha1.HealVolumeRequest{VolumeId: v.id})
	if err != nil {
		t.Fatalf("HealVolume: %v", err)
	}
	if len(resp.GetHealthStatuses()) > 0 {
		t.Fatalf("HealVolume left %v", resp.GetHealthStatuses())
	}
	if err := writeRead(v.target, "after-heal", strings.Repeat("healed ", 100)); err != nil {
		t.Fatalf("write through the target after the heal: %v", err)
	}
	expectCondition(t, p, v, control.Healthy)
}

// deadMount tells whether err is what an access to a FUSE mount whose daemon died answers:
// ENOTCONN once the kernel has aborted the connection, ECONNABORTED for a request that was already
// queued when it did (the daemon's last /dev/fuse descriptor is released a little after it is
// reaped).
func deadMount(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// TestHundredVolumesHealedAfterGroupKill is a node plugin restart with 100 volumes, each healed
// the way a restart sweep does it (probe, heal, confirming probe): every volume must come back
// with its data where its pod has it. The heals of one restart read the node's mount tables over
// and over while they change them; a table read from before a change would make a heal detach the
// wrong layer or miss the new mount. It runs two restarts: the first healed 4 volumes at a time
// (the chart's budget per node), the second all 100 at once, which no budget allows but which is
// the driver's floor on this machine without pods, API server or kubelet beside it (the figure
// docs/performance.md compares with the real node's). It logs how long each took.
func TestHundredVolumesHealedAfterGroupKill(t *testing.T) {
	e := newEnv(t)
	p := e.start()
	vols := make([]*volume, 100)
	for i := range vols {
		vols[i] = p.createStagePublish(e, fmt.Sprintf("pvc-%03d", i))
		if err := writeRead(vols[i].target, "before", vols[i].id); err != nil {
			t.Fatalf("write through %s: %v", vols[i].target, err)
		}
	}
	for _, atOnce := range []int{4, len(vols)} {
		p.killGroup()
		p = e.start()
		healRestart(t, p, vols, atOnce)
	}
}

// healRestart probes, heals and probes again each of vols, atOnce volumes at a time, checks
// that each reads back the file its pod wrote, and logs how long the heals took.
func healRestart(t *testing.T, p *proc, vols []*volume, atOnce int) {
	t.Helper()
	start := time.Now()
	work := make(chan *volume)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var heals []time.Duration
	for range atOnce {
		wg.Go(func() {
			for v := range work {
				targets := []string{v.target}
				probe, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id, PublishTargetPaths: targets})
				if err != nil || !probe.GetHealable() || len(probe.GetHealthStatuses()) == 0 {
					t.Errorf("ProbeVolume(%s) after the restart = %v healable=%t, %v; want broken and healable", v.id, probe.GetHealthStatuses(), probe.GetHealable(), err)
					continue
				}
				began := time.Now()
				heal, err := p.healer.HealVolume(ctx(t), &healerv1alpha1.HealVolumeRequest{VolumeId: v.id, PublishTargetPaths: targets})
				took := time.Since(began)
				if err != nil || len(heal.GetHealthStatuses()) > 0 {
					t.Errorf("HealVolume(%s) = %v, %v; want healthy", v.id, heal.GetHealthStatuses(), err)
					continue
				}
				confirm, err := p.healer.ProbeVolume(ctx(t), &healerv1alpha1.ProbeVolumeRequest{VolumeId: v.id, PublishTargetPaths: targets})
				if err != nil || len(confirm.GetHealthStatuses()) > 0 {
					t.Errorf("ProbeVolume(%s) after its heal = %v, %v; want healthy", v.id, confirm.GetHealthStatuses(), err)
				}
				mu.Lock()
				heals = append(heals, took)
				mu.Unlock()
			}
		})
	}
	for _, v := range vols {
		work <- v
	}
	close(work)
	wg.Wait()
	took := time.Since(start)
	for _, v := range vols {
		if got, err := os.ReadFile(filepath.Join(v.target, "before")); err != nil || string(got) != v.id {
			t.Errorf("reading %s after the heals (%d at a time): %q, %v; want %q", v.target, atOnce, got, err, v.id)
		}
	}
	if len(heals) > 0 {
		slices.Sort(heals)
		t.Logf("%d volumes probed, healed and probed again, %d at a time, in %s; heal p50 %s, p99 %s",
			len(vols), atOnce, took.Round(time.Millisecond), heals[len(heals)/2].Round(time.Millisecond), heals[len(heals)*99/100].Round(time.Millisecond))
	}
}

// TestStopMountersOnExit stops a plugin with SIGTERM, as a container runtime stops a node plugin
// container: with --stop-mounters-on-exit it kills and reaps its mounters before it exits, so
// that none is left for whoever reaps orphans (containerd's shim, one a second beyond 32) and the
// volumes' mounts are dead as the runtime would leave them; without it they keep serving.
func TestStopMountersOnExit(t *testing.T) {
	for _, stop := range []bool{true, false} {
		t.Run(fmt.Sprintf("stop=%t", stop), func(t *testing.T) {
			e := newEnv(t)
			if stop {
				e.args = append(e.args, "--stop-mounters-on-exit")
			}
			p := e.start()
			vols := []*volume{p.createStagePublish(e, "pvc-a"), p.createStagePublish(e, "pvc-b")}
			if got := len(mountersOf(e.stateDir)); got != len(vols) {
				t.Fatalf("%d mounters run for %d volumes", got, len(vols))
			}
			if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.done:
			case <-time.After(20 * time.Second):
				t.Fatal("the plugin did not exit within 20s of SIGTERM")
			}
			if !p.cmd.ProcessState.Success() {
				t.Errorf("the plugin exited with %v after SIGTERM, want 0", p.cmd.ProcessState)
			}
			left := mountersOf(e.stateDir)
			log, _ := os.ReadFile(e.logPath())
			stopped := bytes.Contains(log, []byte(`"Stopped the mounters before exiting" count=2`))
			for _, v := range vols {
				_, err := os.ReadDir(v.target)
				if stop && !deadMount(err) {
					t.Errorf("reading %s after the plugin stopped its mounters: %v, want ENOTCONN or ECONNABORTED", v.target, err)
				}
				if !stop && err != nil {
					t.Errorf("reading %s after the plugin exited alone: %v, want its mounter still serving", v.target, err)
				}
			}
			switch {
			case stop && (len(left) > 0 || !stopped):
				t.Errorf("after SIGTERM with --stop-mounters-on-exit: mounters %v still run, log says it stopped 2: %t", left, stopped)
			case !stop && (len(left) != len(vols) || stopped):
				t.Errorf("after SIGTERM without --stop-mounters-on-exit: mounters %v run (want %d), log says it stopped them: %t", left, len(vols), stopped)
			}
		})
	}
}
