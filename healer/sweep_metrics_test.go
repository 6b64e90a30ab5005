package healer

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/scheduler"
)

// The overdue alert compares, per StorageClass, the time since the last finished periodic sweep
// with the class's schedule interval: only periodic sweeps that ran to their end may move it.
func TestScheduledSweepFinishedPerStorageClass(t *testing.T) {
	f := newFixture(t, 1, false)
	m := NewMetrics(prometheus.NewRegistry())
	clock := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	f.sweeper.opts.Metrics, f.sweeper.opts.Clock = m, clock
	ctx := context.Background()
	finished := func() map[string]float64 {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m.classFinished)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				for _, lp := range s.GetLabel() {
					out[lp.GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	periodic := func(sc string) scheduler.Sweep {
		return scheduler.Sweep{Trigger: scheduler.TriggerSchedule, StorageClass: sc, Fired: clock.Now()}
	}

	f.sweeper.Run(ctx, periodic("gold"))
	first := float64(clock.Now().Unix())

	clock.SetTime(clock.Now().Add(time.Hour))
	f.sweeper.Run(ctx, f.restart())
	f.sweeper.Run(ctx, scheduler.Sweep{Trigger: scheduler.TriggerManual, StorageClass: "gold"})
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	f.sweeper.Run(cancelled, periodic("gold"))
	f.sweeper.Run(cancelled, periodic("silver"))
	if got := finished(); len(got) != 1 || got["gold"] != first {
		t.Fatalf("after restart, manual and cancelled sweeps: last finished periodic sweeps = %v, want gold at %v only", got, first)
	}

	f.sweeper.Run(ctx, periodic("silver"))
	if got := finished(); got["gold"] != first || got["silver"] != first+3600 {
		t.Fatalf("last finished periodic sweeps = %v, want gold at %v and silver an hour later", got, first)
	}

	f.sweeper.ForgetStorageClass("gold")
	if got := finished(); len(got) != 1 || got["silver"] != first+3600 {
		t.Errorf("after gold was deleted: last finished periodic sweeps = %v, want silver's only", got)
	}
}
