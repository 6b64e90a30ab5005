package trigger

import (
	"context"
	"strings"
	"testing"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/scheduler"
)

// FuzzScheduleAnnotation feeds arbitrary StorageClass schedule annotations to Periodic: none may
// panic, a valid one takes effect, and an invalid one leaves the previous schedule in force.
func FuzzScheduleAnnotation(f *testing.F) {
	for _, seed := range []string{"@every 1h", "*/5 * * * *", "off", "", "CRON_TZ=", "TZ=Europe/Berlin 0 3 * * *",
		"@every -1s", "0 0 31 2 *", "61 * * * *", "@yearly", "* * * * * *", "\x00"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		p, err := NewPeriodic(PeriodicOptions{Default: "@every 6h", Sweeps: func(scheduler.Sweep) {}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		p.SetStorageClass(ctx, storageClass("c", map[string]string{annotations.Schedule: "@every 2h"}))
		p.SetStorageClass(ctx, storageClass("c", map[string]string{annotations.Schedule: spec}))
		got, ok := p.Schedules()["c"]
		_, parseErr := config.ParseSchedule(spec)
		spec = strings.TrimSpace(spec)
		switch {
		case spec == annotations.ScheduleOff:
			if ok {
				t.Fatalf("off left schedule %q", got)
			}
		case parseErr == nil:
			if got != spec {
				t.Fatalf("valid schedule %q: in force %q", spec, got)
			}
		default:
			if got != "@every 2h" {
				t.Fatalf("invalid schedule %q replaced the previous one with %q", spec, got)
			}
		}
	})
}
