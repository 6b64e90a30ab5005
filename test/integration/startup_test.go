package integration

import (
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// TestRestartBeforeControllerStartIsSwept starts a node plugin whose restart broke volumes while no
// controller ran, then starts the controller with no debounce: its first restart sweep must wait
// for its caches, find every volume of the node and heal the broken ones, before it records the
// restart as handled. A sweep planned from caches still filling would find nothing and lose the
// restart for good.
func TestRestartBeforeControllerStartIsSwept(t *testing.T) {
	f := newFixture(t, "startup")
	nbd := f.StorageClass("startup-rbd-nbd", "rbd-nbd", nil)
	p := f.newPlugin("startup-node-1")
	broken := f.newVolumes(p, nbd, "rbd-nbd", "gone", 20)
	healthy := f.newVolumes(p, nbd, "rbd-nbd", "healthy", 280)
	f.CreateVolumes(p.volumes, true)
	p.start()
	for _, v := range broken {
		v.SetCondition(t, control.Gone, 0)
	}

	startController(t, "startup", map[string]string{"RESTART_DEBOUNCE": "0s"})
	f.SweepFinished(p.Node(), 2*time.Minute)

	counters := p.Driver().Counters()
	for _, v := range broken {
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s is %s after the first sweep, want healed", v.PV, c)
		}
	}
	probed := 0
	for _, v := range append(append([]*volume{}, broken...), healthy...) {
		if counters.VolumeCalls[v.Handle]["ProbeVolume"] > 0 {
			probed++
		}
	}
	if probed != len(p.volumes) {
		t.Errorf("the first sweep probed %d of the node's %d volumes", probed, len(p.volumes))
	}
}
