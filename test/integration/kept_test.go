package integration

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestRestartConfirmsKeptVolumes restarts the node plugin of a driver that keeps its rbd-nbd
// volumes alive across node plugin restarts (it advertises PLUGIN_RESTART, as a driver whose
// mounters run in a mount supervisor outside the plugin does): the restart sweep probes every
// volume, records the kept ones that are healthy as kept and calls no heal for them, heals the
// one kept volume whose mount died anyway, and records the restart as handled with what it did.
func TestRestartConfirmsKeptVolumes(t *testing.T) {
	f := newFixture(t, "kept")
	nbd := f.StorageClass("kept-rbd-nbd", "rbd-nbd", nil)
	p := f.newPluginWith("kept-node-1", func(o *harness.PluginOptions) {
		o.VolumeKeeping = []healerv1alpha1.HealerCapability_VolumeKeeping_Type{healerv1alpha1.HealerCapability_VolumeKeeping_PLUGIN_RESTART}
		o.KeepMounters = []string{"rbd-nbd"}
	})
	kept := f.newVolumes(p, nbd, "rbd-nbd", "kept", 3)
	dead := f.newVolumes(p, nbd, "rbd-nbd", "dead", 1)[0]
	f.CreateVolumes(p.volumes, true)
	p.start()
	startController(t, "kept", nil)
	f.SweepFinished(p.Node(), time.Minute)

	restartedAt := time.Now()
	p.restart(func() {
		// The restart killed no kept mounter; this one died on its own while the plugin was down.
		dead.SetCondition(t, control.Gone, 0)
	})
	marker := f.SweepFinished(p.Node(), time.Minute)

	for _, v := range kept {
		if n := p.calls.count(v, "ProbeVolume", restartedAt); n == 0 {
			t.Errorf("kept volume %s was not probed after the restart", v.PV)
		}
		if n := p.calls.count(v, "HealVolume", restartedAt); n != 0 {
			t.Errorf("kept healthy volume %s got %d HealVolume calls, want none", v.PV, n)
		}
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("kept volume %s is %s, want healthy", v.PV, c)
		}
		if _, n := f.PVCEvents(v, healer.ReasonVolumeHealed); n != 0 {
			t.Errorf("PVC %s has a %s Event but was kept, not healed", v.PVC, healer.ReasonVolumeHealed)
		}
	}
	if n := p.calls.count(dead, "HealVolume", restartedAt); n == 0 {
		t.Errorf("the kept volume %s whose mount died got no HealVolume call", dead.PV)
	}
	if c := dead.Condition(t); c != control.Healthy {
		t.Errorf("the kept volume %s whose mount died is %s after the sweep, want healed", dead.PV, c)
	}
	f.WaitPVCEvent(dead, healer.ReasonVolumeHealed)
	f.WaitSweepMessage(p.Node(), fmt.Sprintf("%d volumes:", len(p.volumes)), "1 healed", fmt.Sprintf("%d kept", len(kept)), "0 failed")

	n := f.AddonsNode(p.Node())
	if got := n.Annotations[annotations.HandledMarker]; got != marker {
		t.Errorf("handled marker %q, want the restart's marker %q", got, marker)
	}
	var res healer.RestartSweepResult
	if err := json.Unmarshal([]byte(n.Annotations[annotations.RestartSweep]), &res); err != nil {
		t.Fatalf("restart sweep result %q on the CSIAddonsNode: %v", n.Annotations[annotations.RestartSweep], err)
	}
	if res.Marker != marker || res.Kept != len(kept) || res.Healed != 1 || res.Volumes != len(p.volumes) {
		t.Errorf("recorded restart sweep result %+v, want marker %q, %d volumes, %d kept, 1 healed", res, marker, len(p.volumes), len(kept))
	}
}
