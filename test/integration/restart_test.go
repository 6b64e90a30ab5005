package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestRestartHealsExactlyTheBrokenHealableVolumes restarts a node plugin whose restart killed the
// rbd-nbd mounters of some volumes: the restart sweep heals exactly those, leaves krbd volumes
// (which the driver cannot heal) and a volume with lost data alone, reports the data loss on its
// PVC and the sweep on the CSIAddonsNode, and records the restart as handled.
func TestRestartHealsExactlyTheBrokenHealableVolumes(t *testing.T) {
	f := newFixture(t, "restart")
	nbd := f.StorageClass("restart-rbd-nbd", "rbd-nbd", nil)
	krbd := f.StorageClass("restart-rbd", "", nil)
	p := f.newPlugin("restart-node-1")
	gone := f.newVolumes(p, nbd, "rbd-nbd", "gone", 2)
	readOnly := f.newVolumes(p, nbd, "rbd-nbd", "readonly", 1)
	lost := f.newVolumes(p, nbd, "rbd-nbd", "lost", 1)[0]
	krbdBroken := f.newVolumes(p, krbd, "krbd", "krbd-gone", 1)
	krbdBroken = append(krbdBroken, f.newVolumes(p, krbd, "krbd", "krbd-readonly", 1)...)
	healthy := append(f.newVolumes(p, nbd, "rbd-nbd", "healthy", 2), f.newVolumes(p, krbd, "krbd", "krbd-healthy", 1)...)
	f.CreateVolumes(p.volumes, true)

	p.start()
	startController(t, "restart", nil)
	f.SweepFinished(p.Node(), time.Minute)

	healable := append(append([]*volume{}, gone...), readOnly...)
	p.restart(func() {
		for _, v := range gone {
			v.SetCondition(t, control.Gone, 0)
		}
		readOnly[0].SetCondition(t, control.ReadOnly, 0)
		krbdBroken[0].SetCondition(t, control.Gone, 0)
		krbdBroken[1].SetCondition(t, control.ReadOnly, 0)
		lost.SetCondition(t, control.Lost, 0)
	})
	marker := f.SweepFinished(p.Node(), time.Minute)
	counters := p.Driver().Counters()

	for _, v := range healable {
		if n := counters.VolumeCalls[v.Handle]["HealVolume"]; n == 0 {
			t.Errorf("%s (broken, rbd-nbd) got no HealVolume call", v.PV)
		}
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s (broken, rbd-nbd) is %s after the restart sweep, want healthy", v.PV, c)
		}
		f.WaitPVCEvent(v, healer.ReasonVolumeHealed)
	}
	f.WaitPVCEvent(lost, healer.ReasonVolumeDataLoss)
	for _, v := range krbdBroken {
		f.WaitPVCEvent(v, healer.ReasonVolumeUnhealthy)
	}
	// 9 volumes: 3 healed; 3 found broken and left alone (2 krbd, the lost one); 3 healthy.
	f.WaitSweepMessage(p.Node(), fmt.Sprintf("%d volumes:", len(p.volumes)), "3 healed", "3 unhealthy left alone", "0 failed")
	leftAlone := map[*volume]control.Condition{lost: control.Lost, krbdBroken[0]: control.Gone, krbdBroken[1]: control.ReadOnly}
	for _, v := range healthy {
		leftAlone[v] = control.Healthy
	}
	for v, want := range leftAlone {
		if n := counters.VolumeCalls[v.Handle]["HealVolume"]; n != 0 {
			t.Errorf("%s got %d HealVolume calls; only broken volumes the driver can heal may get one", v.PV, n)
		}
		if c := v.Condition(t); c != want {
			t.Errorf("%s is %s after the restart sweep, want %s", v.PV, c, want)
		}
		if _, n := f.PVCEvents(v, healer.ReasonVolumeHealed); n != 0 {
			t.Errorf("PVC %s has a %s Event but was not healed", v.PVC, healer.ReasonVolumeHealed)
		}
	}
	for id, n := range counters.MaxConcurrentPerVolume {
		if n > 1 {
			t.Errorf("volume %s had %d calls at once", id, n)
		}
	}
	if got := f.AddonsNode(p.Node()).Annotations[annotations.HandledMarker]; got != marker {
		t.Errorf("handled marker %q, want the restart's marker %q", got, marker)
	}
}

// TestDetachingVolumeIsNotTouched deletes a VolumeAttachment that a finalizer holds (the volume is
// detaching) before the node plugin restarts: the restart sweep heals the node's other broken
// volumes and sends nothing for the detaching one.
func TestDetachingVolumeIsNotTouched(t *testing.T) {
	f := newFixture(t, "detach")
	sc := f.StorageClass("detach-rbd-nbd", "rbd-nbd", nil)
	p := f.newPlugin("detach-node-1")
	vols := f.newVolumes(p, sc, "rbd-nbd", "vol", 4)
	detaching, others := vols[3], vols[:3]
	f.CreateVolumes(vols, true)
	p.start()
	startController(t, "detach", nil)
	f.SweepFinished(p.Node(), time.Minute)

	f.Detach(detaching)
	restartedAt := time.Now()
	p.restart(func() {
		for _, v := range vols {
			v.SetCondition(t, control.Gone, 0)
		}
	})
	f.SweepFinished(p.Node(), time.Minute)

	for _, v := range others {
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s is %s after the restart sweep, want healthy", v.PV, c)
		}
	}
	for _, rpc := range []string{"ProbeVolume", "HealVolume"} {
		if n := p.calls.count(detaching, rpc, restartedAt); n != 0 {
			t.Errorf("the detaching volume %s got %d %s calls", detaching.PV, n, rpc)
		}
	}
	if c := detaching.Condition(t); c != control.Gone {
		t.Errorf("the detaching volume %s is %s, want it left gone", detaching.PV, c)
	}
	f.WaitSweepMessage(p.Node(), "3 volumes:", "3 healed", "1 skipped")
}

// TestVolumeDetachingMidSweepIsNotTouched starts detaching a volume while the restart sweep is
// under way (one call at a time on the node, so the sweep takes a while) and before the sweep has
// reached that volume: nothing may be sent for it once its VolumeAttachment is being deleted.
func TestVolumeDetachingMidSweepIsNotTouched(t *testing.T) {
	f := newFixture(t, "midsweep")
	sc := f.StorageClass("midsweep-rbd-nbd", "rbd-nbd", nil)
	p := f.newPlugin("midsweep-node-1")
	vols := f.newVolumes(p, sc, "rbd-nbd", "vol", 6)
	// The node's volumes are swept in name order: the last one comes last.
	first, detaching := vols[0], vols[len(vols)-1]
	f.CreateVolumes(vols, true)
	p.start()
	startController(t, "midsweep", map[string]string{"BUDGETS_PER_NODE": "1"})
	f.SweepFinished(p.Node(), time.Minute)

	restartedAt := time.Now()
	p.restart(func() {
		for _, v := range vols {
			v.SetCondition(t, control.Hung, 400*time.Millisecond)
		}
	})
	harness.Eventually(t, 30*time.Second, "the sweep to heal its first volume", func() (bool, string) {
		n := p.calls.count(first, "HealVolume", restartedAt)
		return n > 0, fmt.Sprintf("%d heals of %s", n, first.PV)
	})
	f.Detach(detaching)
	detachedAt := time.Now()
	f.SweepFinished(p.Node(), time.Minute)

	for _, rpc := range []string{"ProbeVolume", "HealVolume"} {
		if n := p.calls.count(detaching, rpc, detachedAt); n != 0 {
			t.Errorf("%s got %d %s calls after its VolumeAttachment began deleting (detaching mid-sweep)", detaching.PV, n, rpc)
		}
	}
	for _, v := range vols[:len(vols)-1] {
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s is %s after the restart sweep, want healthy", v.PV, c)
		}
	}
}

// TestDryRunCallsNothing runs the controller in dry-run mode through a plugin's first start and a
// restart that broke volumes: no probe or heal reaches the driver, the broken volumes stay broken,
// and the sweep's Event says what would have been done.
func TestDryRunCallsNothing(t *testing.T) {
	f := newFixture(t, "dryrun")
	sc := f.StorageClass("dryrun-rbd-nbd", "rbd-nbd", nil)
	p := f.newPlugin("dryrun-node-1")
	broken := f.newVolumes(p, sc, "rbd-nbd", "broken", 3)
	f.newVolumes(p, sc, "rbd-nbd", "healthy", 3)
	f.CreateVolumes(p.volumes, true)
	p.start()
	startController(t, "dryrun", map[string]string{"DRY_RUN": "true"})
	f.SweepFinished(p.Node(), time.Minute)

	p.restart(func() {
		for _, v := range broken {
			v.SetCondition(t, control.Gone, 0)
		}
	})
	f.SweepFinished(p.Node(), time.Minute)

	for _, rpc := range []string{"ProbeVolume", "HealVolume"} {
		if n := p.calls.total(rpc); n != 0 {
			t.Errorf("dry run: the driver got %d %s calls, want none", n, rpc)
		}
		if n := p.Driver().Counters().Calls[rpc]; n != 0 {
			t.Errorf("dry run: the driver counted %d %s calls, want none", n, rpc)
		}
	}
	for _, v := range broken {
		if c := v.Condition(t); c != control.Gone {
			t.Errorf("dry run: %s is %s, want it left gone", v.PV, c)
		}
	}
	f.WaitSweepMessage(p.Node(), fmt.Sprintf("would probe %d", len(p.volumes)))
}
