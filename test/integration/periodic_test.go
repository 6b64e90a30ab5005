package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestCronScheduleSweepsOnlyItsStorageClass gives one StorageClass a schedule through its
// annotation while the controller runs (no default schedule): periodic sweeps probe that class's
// volumes again and again and heal a volume that broke, while another class's volumes on the same
// node get no call at all.
func TestCronScheduleSweepsOnlyItsStorageClass(t *testing.T) {
	f := newFixture(t, "cron")
	scheduled := f.StorageClass("cron-scheduled", "rbd-nbd", nil)
	other := f.StorageClass("cron-other", "rbd-nbd", nil)
	p := f.newPlugin("cron-node-1")
	inClass := f.newVolumes(p, scheduled, "rbd-nbd", "scheduled", 4)
	outside := f.newVolumes(p, other, "rbd-nbd", "other", 4)
	f.CreateVolumes(p.volumes, true)
	p.start()
	startController(t, "cron", map[string]string{"SCHEDULE_STAGGER": "500ms"})
	f.SweepFinished(p.Node(), time.Minute)

	// A mount of each class turns read-only; no restart announces it.
	inClass[0].SetCondition(t, control.ReadOnly, 0)
	outside[0].SetCondition(t, control.ReadOnly, 0)
	annotatedAt := time.Now()
	f.AnnotateClass(scheduled, annotations.Schedule, "@every 5s")

	harness.Eventually(t, 40*time.Second, "two periodic sweeps of "+scheduled, func() (bool, string) {
		for _, v := range inClass {
			if n := p.calls.count(v, "ProbeVolume", annotatedAt); n < 2 {
				return false, fmt.Sprintf("%s probed %d times since the schedule was set", v.PV, n)
			}
		}
		if c := inClass[0].Condition(t); c != control.Healthy {
			return false, fmt.Sprintf("%s is %s", inClass[0].PV, c)
		}
		return true, ""
	})

	for _, v := range outside {
		for _, rpc := range []string{"ProbeVolume", "HealVolume"} {
			if n := p.calls.count(v, rpc, annotatedAt); n != 0 {
				t.Errorf("%s (StorageClass %s, no schedule) got %d %s calls from the periodic sweeps of %s", v.PV, other, n, rpc, scheduled)
			}
		}
	}
	if c := outside[0].Condition(t); c != control.ReadOnly {
		t.Errorf("%s (StorageClass %s) is %s; no sweep should have touched it", outside[0].PV, other, c)
	}
	// "@every 5s" first fires 4 to 5 seconds after it is set: a call sooner came from something else.
	for _, v := range inClass {
		if times := p.calls.callTimes(v, "ProbeVolume"); len(times) > 0 {
			first := times[len(times)-p.calls.count(v, "ProbeVolume", annotatedAt)]
			if d := first.Sub(annotatedAt); d < 3500*time.Millisecond {
				t.Errorf("%s was probed %s after the schedule was set; the schedule fires after 4s at the soonest", v.PV, d.Round(time.Millisecond))
			}
		}
	}
}
