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

// TestFailingHealBacksOffAndIsReported restarts a node plugin with a volume whose mount hangs
// longer than the controller's heal timeout: every heal times out, the controller spaces its
// attempts out with a doubling backoff, then gives up and reports the volume on its PVC (Event and
// status annotation) and in its metrics.
func TestFailingHealBacksOffAndIsReported(t *testing.T) {
	const (
		// Far longer than the heal timeout: the controller's deadline must reach the driver (two gRPC
		// hops) before the hang ends, or the driver finishes the heal; on a loaded machine 200ms of
		// margin was seen to be too little.
		hang        = 3 * time.Second
		healTimeout = 500 * time.Millisecond
		backoffBase = 200 * time.Millisecond
		// Arrival times at the driver may differ from the controller's by scheduling noise.
		slack = 50 * time.Millisecond
	)
	f := newFixture(t, "backoff")
	sc := f.StorageClass("backoff-rbd-nbd", "rbd-nbd", nil)
	p := f.newPlugin("backoff-node-1")
	stuck := f.newVolumes(p, sc, "rbd-nbd", "stuck", 1)[0]
	fine := f.newVolumes(p, sc, "rbd-nbd", "fine", 1)[0]
	f.CreateVolumes(p.volumes, true)
	p.start()
	ctrl := startController(t, "backoff", map[string]string{
		"TIMEOUTS_HEAL": healTimeout.String(),
		"BACKOFF_BASE":  backoffBase.String(),
		"BACKOFF_MAX":   "10s",
	})
	f.SweepFinished(p.Node(), time.Minute)

	p.restart(func() { stuck.SetCondition(t, control.Hung, hang) })
	harness.Eventually(t, time.Minute, "a "+healer.ReasonVolumeHealFailed+" Event on "+stuck.PVC, func() (bool, string) {
		_, n := f.PVCEvents(stuck, healer.ReasonVolumeHealFailed)
		return n > 0, fmt.Sprintf("%d heal calls so far", len(p.calls.callTimes(stuck, "HealVolume")))
	})

	heals := p.calls.callTimes(stuck, "HealVolume")
	if len(heals) < 3 {
		t.Fatalf("%d HealVolume calls before the controller gave up; want at least 3 to see the backoff", len(heals))
	}
	// Between two heals: the heal's timeout (less the tenth of it the sidecar keeps back to
	// answer for the hung driver itself), the backoff after that failure (base, doubling), and the
	// next attempt's probe, which waits for the hung mount.
	gaps := make([]time.Duration, 0, len(heals)-1)
	for i := 1; i < len(heals); i++ {
		gap := heals[i].Sub(heals[i-1])
		gaps = append(gaps, gap)
		backoff := backoffBase << (i - 1)
		if least := healTimeout*9/10 + backoff + hang - slack; gap < least {
			t.Errorf("heal %d came %s after heal %d; with a backoff of %s it cannot come before %s", i+1, gap.Round(time.Millisecond), i, backoff, least)
		}
	}
	if gaps[len(gaps)-1] <= gaps[0] {
		t.Errorf("the gaps between heals did not grow: %v", gaps)
	}
	t.Logf("%d heals, gaps %v", len(heals), gaps)

	if c := stuck.Condition(t); c != control.Hung {
		t.Errorf("%s is %s, want it still hung: the driver never finished a heal", stuck.PV, c)
	}
	st, ok := f.PVCStatus(stuck)
	switch {
	case !ok:
		t.Errorf("PVC %s has no %s annotation", stuck.PVC, annotations.VolumeStatus)
	case st.Result != "heal-failed":
		t.Errorf("PVC %s: status result %q, want heal-failed (status %+v)", stuck.PVC, st.Result, st)
	}
	evs, _ := f.PVCEvents(stuck, healer.ReasonVolumeHealFailed)
	if len(evs) > 0 && evs[0].Type != "Warning" {
		t.Errorf("%s Event has type %s, want Warning", healer.ReasonVolumeHealFailed, evs[0].Type)
	}
	failing, ok := harness.MetricValue(ctrl.Scrape(), "volume_healer_volume_heal_failing",
		map[string]string{"namespace": f.AppNS, "persistentvolumeclaim": stuck.PVC})
	if !ok || failing != 1 {
		t.Errorf("volume_healer_volume_heal_failing{persistentvolumeclaim=%q} = %v (present %v), want 1", stuck.PVC, failing, ok)
	}
	if v, ok := harness.MetricValue(ctrl.Scrape(), "volume_healer_volume_heal_failing", map[string]string{"persistentvolumeclaim": fine.PVC}); ok {
		t.Errorf("volume_healer_volume_heal_failing{persistentvolumeclaim=%q} = %v for a healthy volume; want no series", fine.PVC, v)
	}
	if _, perVolume := p.calls.peaks(); perVolume > 1 {
		t.Errorf("a volume had %d calls at once", perVolume)
	}
}
