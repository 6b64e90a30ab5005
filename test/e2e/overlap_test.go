package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestOverlappingRestartAndPeriodicSweeps runs periodic sweeps every second over three nodes while
// the node plugins of two of them restart with broken and slow (hung) volumes: restart and periodic
// sweeps run at the same time over the same volumes. Each volume still gets one call at a time,
// the budgets hold across both kinds of sweep, every broken healable volume is healed (by whichever
// sweep reaches it first), and the detaching volume is never called.
func TestOverlappingRestartAndPeriodicSweeps(t *testing.T) {
	f := newFixture(t, "overlap")
	sc := f.StorageClass("overlap-rbd-nbd", "rbd-nbd", map[string]string{annotations.Schedule: "@every 1s"})
	b := budgets{global: 3, perDriver: 3, perNode: 2}
	var nodes []*node
	vols := map[*node][]*volume{}
	for i := range 3 {
		n := f.newNode(fmt.Sprintf("overlap-node-%d", i+1))
		nodes = append(nodes, n)
		vols[n] = f.newVolumes(n, sc, "rbd-nbd", fmt.Sprintf("n%d", i+1), 6)
	}
	var all []*volume
	for _, n := range nodes {
		all = append(all, vols[n]...)
	}
	f.CreateVolumes(all, true)
	detaching := vols[nodes[2]][5]
	f.Detach(detaching)
	for _, n := range nodes {
		n.start()
	}
	c := f.startController("overlap", b.settings())
	f.sweepsFinished(nodes, time.Minute)
	harness.Eventually(t, 30*time.Second, "periodic sweeps to run", func() (bool, string) {
		n := c.Metric("volume_healer_sweeps_started_total", map[string]string{"trigger": "schedule"})
		return n >= 2, fmt.Sprintf("%v periodic sweeps started", n)
	})

	periodicBefore := c.Metric("volume_healer_sweeps_started_total", map[string]string{"trigger": "schedule"})
	var healed []*volume
	for _, n := range nodes[:2] {
		// The restart kills the mounters of some volumes and leaves others hanging, so that calls
		// take long enough to overlap.
		for i, v := range vols[n][:5] {
			if i%2 == 0 {
				v.SetCondition(t, control.Hung, 500*time.Millisecond)
			} else {
				v.SetCondition(t, control.Gone, 0)
			}
		}
		healed = append(healed, vols[n][:5]...)
		n.restart()
	}
	// A volume of the third node breaks without a restart: only a periodic sweep finds it.
	lone := vols[nodes[2]][0]
	lone.SetCondition(t, control.ReadOnly, 0)
	healed = append(healed, lone)
	// detaching is broken too, and must stay so.
	detaching.SetCondition(t, control.Gone, 0)

	f.sweepsFinished(nodes[:2], 2*time.Minute)
	periodicDuring := c.Metric("volume_healer_sweeps_started_total", map[string]string{"trigger": "schedule"}) - periodicBefore
	if periodicDuring < 1 {
		t.Errorf("no periodic sweep started while the restart sweeps ran; the sweeps did not overlap")
	}
	harness.Eventually(t, time.Minute, "every broken healable volume to be healthy", func() (bool, string) {
		var broken []string
		for _, v := range healed {
			if v.Condition(t) != control.Healthy {
				broken = append(broken, v.PV)
			}
		}
		return len(broken) == 0, fmt.Sprintf("still broken: %v", broken)
	})
	c.MustRun()
	p := f.verify(nodes, b, outcome{healed: healed, untouched: []*volume{detaching}})
	if p.all < 2 {
		t.Errorf("at most %d call was in flight at any time: the sweeps never overlapped", p.all)
	}
	t.Logf("%v periodic sweeps started while the restart sweeps ran", periodicDuring)
}
