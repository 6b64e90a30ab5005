package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// TestBudgetsHoldDuringRollout restarts the node plugins of four nodes at once, as a DaemonSet
// rollout does, with every volume hung for a while (so calls overlap) and low budgets: no node
// ever serves more than the per-node budget, all nodes together never more than the global and
// per-driver budgets, no volume ever gets two calls at once, and every volume is healed.
func TestBudgetsHoldDuringRollout(t *testing.T) {
	const (
		nodes, perNodeVolumes = 4, 20
		global, perDriver     = 3, 3
		perNode               = 2
	)
	f := newFixture(t, "budget")
	sc := f.StorageClass("budget-rbd-nbd", "rbd-nbd", nil)
	all := newCallTracker()
	var plugins []*plugin
	var vols []*volume
	for i := range nodes {
		p := f.newPlugin(fmt.Sprintf("budget-node-%d", i+1), all)
		plugins = append(plugins, p)
		vols = append(vols, f.newVolumes(p, sc, "rbd-nbd", fmt.Sprintf("n%d", i+1), perNodeVolumes)...)
	}
	f.CreateVolumes(vols, true)
	for _, p := range plugins {
		p.start()
	}
	startController(t, "budget", map[string]string{
		"BUDGETS_GLOBAL":     fmt.Sprint(global),
		"BUDGETS_PER_DRIVER": fmt.Sprint(perDriver),
		"BUDGETS_PER_NODE":   fmt.Sprint(perNode),
	})
	for _, p := range plugins {
		f.SweepFinished(p.Node(), time.Minute)
	}

	for _, p := range plugins {
		p.stop()
	}
	for _, v := range vols {
		v.SetCondition(t, control.Hung, 200*time.Millisecond)
	}
	for _, p := range plugins {
		p.start()
	}
	for _, p := range plugins {
		f.SweepFinished(p.Node(), 3*time.Minute)
	}

	for _, v := range vols {
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s is %s after the rollout's sweeps, want healthy", v.PV, c)
		}
	}
	for _, p := range plugins {
		c := p.Driver().Counters()
		if c.MaxConcurrent > perNode {
			t.Errorf("node %s: the driver saw %d calls at once; the per-node budget is %d", p.Node(), c.MaxConcurrent, perNode)
		}
		for id, n := range c.MaxConcurrentPerVolume {
			if n > 1 {
				t.Errorf("node %s: volume %s had %d calls at once", p.Node(), id, n)
			}
		}
		for id, n := range c.Aborted {
			t.Errorf("node %s: volume %s: %d calls were turned away as busy", p.Node(), id, n)
		}
		if atOnce, _ := p.calls.peaks(); atOnce > perNode {
			t.Errorf("node %s: %d calls at once over both starts; the per-node budget is %d", p.Node(), atOnce, perNode)
		}
	}
	atOnce, perVolume := all.peaks()
	if limit := min(global, perDriver); atOnce > limit {
		t.Errorf("all nodes together served %d calls at once; the global and per-driver budgets allow %d", atOnce, limit)
	}
	// Calls that never overlapped would prove nothing about the budgets.
	if atOnce < 2 {
		t.Errorf("at most %d call was in flight at any time: the sweeps ran one call at a time", atOnce)
	}
	if perVolume > 1 {
		t.Errorf("some volume had %d calls at once", perVolume)
	}
	t.Logf("most calls at once: %d over all nodes (budget %d)", atOnce, min(global, perDriver))
}
