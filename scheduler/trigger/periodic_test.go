package trigger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func storageClass(name string, annotations map[string]string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}, Provisioner: "rbd.csi.ceph.com"}
}

func TestScheduleSourcePrecedence(t *testing.T) {
	tests := map[string]struct {
		defaultSpec string
		config      map[string]string
		annotations map[string]string
		want        string // "" means no periodic sweeps
	}{
		"annotation wins over configuration and default": {
			defaultSpec: "@every 6h", config: map[string]string{"fast": "@every 2h"},
			annotations: map[string]string{annotations.Schedule: "@every 1h"}, want: "@every 1h",
		},
		"configuration wins over default": {
			defaultSpec: "@every 6h", config: map[string]string{"fast": "*/15 * * * *"}, want: "*/15 * * * *",
		},
		"default when the class has none": {defaultSpec: "0 */6 * * *", want: "0 */6 * * *"},
		"no schedule at all":              {},
		"annotation off turns sweeps off": {
			defaultSpec: "@every 6h", annotations: map[string]string{annotations.Schedule: "off"},
		},
		"configuration of another class does not apply": {
			defaultSpec: "@daily", config: map[string]string{"other": "@hourly"}, want: "@daily",
		},
		"annotation of 0.1.0 wins over configuration": {
			defaultSpec: "@every 6h", config: map[string]string{"fast": "@every 2h"},
			annotations: map[string]string{annotations.Previous(annotations.Schedule): "@every 1h"}, want: "@every 1h",
		},
		"annotation of 0.1.0 off turns sweeps off": {
			defaultSpec: "@every 6h", annotations: map[string]string{annotations.Previous(annotations.Schedule): "off"},
		},
		"new annotation wins over the one of 0.1.0": {
			defaultSpec: "@every 6h",
			annotations: map[string]string{annotations.Schedule: "@every 3h", annotations.Previous(annotations.Schedule): "off"},
			want:        "@every 3h",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := NewPeriodic(PeriodicOptions{Default: tc.defaultSpec, StorageClasses: tc.config, Sweeps: func(scheduler.Sweep) {}})
			if err != nil {
				t.Fatal(err)
			}
			p.SetStorageClass(context.Background(), storageClass("fast", tc.annotations))
			got, ok := p.Schedules()["fast"]
			if tc.want == "" && ok {
				t.Fatalf("schedule = %q, want no periodic sweeps", got)
			}
			if got != tc.want {
				t.Fatalf("schedule = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestInvalidConfiguredScheduleIsRejected(t *testing.T) {
	tests := map[string]struct {
		opts PeriodicOptions
		want string
	}{
		"default":      {opts: PeriodicOptions{Default: "every hour"}, want: "default schedule"},
		"storageclass": {opts: PeriodicOptions{StorageClasses: map[string]string{"gold": "61 * * * *"}}, want: "StorageClass gold"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.opts.Sweeps = func(scheduler.Sweep) {}
			_, err := NewPeriodic(tc.opts)
			if !errors.Is(err, config.ErrInvalidSchedule) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want config.ErrInvalidSchedule naming %q", err, tc.want)
			}
		})
	}
}

func TestInvalidAnnotationKeepsPreviousSchedule(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	recorder := record.NewFakeRecorder(10)
	p, err := NewPeriodic(PeriodicOptions{Default: "@every 6h", Recorder: recorder, Metrics: metrics, Sweeps: func(scheduler.Sweep) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p.SetStorageClass(ctx, storageClass("gold", map[string]string{annotations.Schedule: "@every 1h"}))
	p.SetStorageClass(ctx, storageClass("gold", map[string]string{annotations.Schedule: "*/5 * * *"}))

	if got := p.Schedules()["gold"]; got != "@every 1h" {
		t.Errorf("schedule after an invalid edit = %q, want the previous @every 1h", got)
	}
	select {
	case ev := <-recorder.Events:
		for _, want := range []string{"Warning", ReasonInvalidSchedule, annotations.Schedule, "*/5 * * *"} {
			if !strings.Contains(ev, want) {
				t.Errorf("event %q does not mention %q", ev, want)
			}
		}
	default:
		t.Error("no Event for the invalid schedule")
	}
	if got := testutil.ToFloat64(metrics.scheduleErrors); got != 1 {
		t.Errorf("schedule errors = %v, want 1", got)
	}
	if got := testutil.ToFloat64(metrics.scheduleInvalid.WithLabelValues("gold")); got != 1 {
		t.Errorf("schedule invalid gauge = %v, want 1", got)
	}

	// A class seen the first time with an invalid annotation falls back to the default.
	p.SetStorageClass(ctx, storageClass("silver", map[string]string{annotations.Schedule: "sometimes"}))
	if got := p.Schedules()["silver"]; got != "@every 6h" {
		t.Errorf("new class with an invalid annotation: schedule = %q, want the default", got)
	}

	// Fixing the annotation clears the gauge.
	p.SetStorageClass(ctx, storageClass("gold", map[string]string{annotations.Schedule: "@every 2h"}))
	if got := p.Schedules()["gold"]; got != "@every 2h" {
		t.Errorf("schedule after the fix = %q, want @every 2h", got)
	}
	if n := testutil.CollectAndCount(metrics.scheduleInvalid); n != 1 {
		t.Errorf("schedule invalid series = %d, want 1 (silver only)", n)
	}
}

// runPeriodic starts p on a fake clock and returns the channel its sweeps arrive on.
func runPeriodic(t *testing.T, opts PeriodicOptions) (*Periodic, *clocktesting.FakeClock, <-chan scheduler.Sweep) {
	t.Helper()
	fc := clocktesting.NewFakeClock(epoch)
	sweeps := make(chan scheduler.Sweep, 16)
	opts.Clock = fc
	opts.Sweeps = func(s scheduler.Sweep) { sweeps <- s }
	p, err := NewPeriodic(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	return p, fc, sweeps
}

// step advances the clock once the loop waits on it.
func step(t *testing.T, fc *clocktesting.FakeClock, d time.Duration) {
	t.Helper()
	poll.Eventually(t, 5*time.Second, "the scheduler to wait on the clock", poll.True(fc.HasWaiters))
	fc.Step(d)
}

func expectSweep(t *testing.T, sweeps <-chan scheduler.Sweep) scheduler.Sweep {
	t.Helper()
	select {
	case s := <-sweeps:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no sweep fired")
		return scheduler.Sweep{}
	}
}

func expectNoSweep(t *testing.T, sweeps <-chan scheduler.Sweep) {
	t.Helper()
	select {
	case s := <-sweeps:
		t.Fatalf("unexpected %s", s)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestPeriodicFiresEachClassOnItsSchedule(t *testing.T) {
	p, fc, sweeps := runPeriodic(t, PeriodicOptions{Stagger: 5 * time.Minute})
	ctx := context.Background()
	p.SetStorageClass(ctx, storageClass("hourly", map[string]string{annotations.Schedule: "@every 1h"}))
	p.SetStorageClass(ctx, storageClass("daily", map[string]string{annotations.Schedule: "@every 24h"}))

	step(t, fc, 59*time.Minute)
	expectNoSweep(t, sweeps)
	step(t, fc, time.Minute)
	s := expectSweep(t, sweeps)
	if s.Trigger != scheduler.TriggerSchedule || s.StorageClass != "hourly" || s.Stagger != 5*time.Minute {
		t.Fatalf("sweep = %+v, want a periodic sweep of hourly with a 5m stagger", s)
	}
	expectNoSweep(t, sweeps)

	// An edit applies without a restart: the class now fires every 10 minutes.
	p.SetStorageClass(ctx, storageClass("hourly", map[string]string{annotations.Schedule: "@every 10m"}))
	step(t, fc, 10*time.Minute)
	if s := expectSweep(t, sweeps); s.StorageClass != "hourly" {
		t.Fatalf("after the edit: sweep of %s, want hourly", s.StorageClass)
	}

	// A deleted class stops firing.
	p.RemoveStorageClass("hourly")
	step(t, fc, 10*time.Minute)
	expectNoSweep(t, sweeps)
}

// TestStaggerEndsBeforeTheNextFiring: a class that fires every 10s under the default 5m stagger
// spreads each sweep over the 10s to its next firing, not over 5 minutes, which would delay a
// node's probe by up to 5 minutes and pile 30 sweeps of the class up behind one another.
func TestStaggerEndsBeforeTheNextFiring(t *testing.T) {
	p, fc, sweeps := runPeriodic(t, PeriodicOptions{Stagger: 5 * time.Minute})
	p.SetStorageClass(context.Background(), storageClass("fast", map[string]string{annotations.Schedule: "@every 10s"}))
	step(t, fc, 10*time.Second)
	if s := expectSweep(t, sweeps); s.Stagger != 10*time.Second {
		t.Fatalf("sweep = %+v, want its stagger cut to the 10s until the next firing", s)
	}
}

func TestPeriodicMissedTicksFireOnce(t *testing.T) {
	p, fc, sweeps := runPeriodic(t, PeriodicOptions{})
	p.SetStorageClass(context.Background(), storageClass("c", map[string]string{annotations.Schedule: "@every 1m"}))
	step(t, fc, 10*time.Minute)
	expectSweep(t, sweeps)
	expectNoSweep(t, sweeps)
}

func TestScheduleInterval(t *testing.T) {
	tests := map[string]struct {
		spec    string
		stagger time.Duration
		want    time.Duration
	}{
		"every hour":                     {spec: "@every 1h", want: time.Hour},
		"every six hours plus stagger":   {spec: "0 */6 * * *", stagger: 5 * time.Minute, want: 6*time.Hour + 5*time.Minute},
		"weekdays at three: the weekend": {spec: "0 3 * * 1-5", want: 72 * time.Hour},
		"every five minutes on weekdays": {spec: "*/5 * * * 1-5", want: 48*time.Hour + 5*time.Minute},
		"office hours, every ten minutes": {
			spec: "*/10 9-17 * * *", stagger: time.Minute, want: 15*time.Hour + 10*time.Minute + time.Minute,
		},
		"first and fifteenth: the 31-day months":         {spec: "0 0 1,15 * *", want: 17 * 24 * time.Hour},
		"every minute of 29 February: the years between": {spec: "* * 29 2 *", want: 1460*24*time.Hour + time.Minute},
		"noon in Berlin: the night the clocks go back": {
			spec: "CRON_TZ=Europe/Berlin 0 12 * * *", want: 25 * time.Hour,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			metrics := NewMetrics(prometheus.NewRegistry())
			p, err := NewPeriodic(PeriodicOptions{Stagger: tc.stagger, Metrics: metrics, Clock: clocktesting.NewFakeClock(epoch), Sweeps: func(scheduler.Sweep) {}})
			if err != nil {
				t.Fatal(err)
			}
			p.SetStorageClass(context.Background(), storageClass("gold", map[string]string{annotations.Schedule: tc.spec}))
			if got := testutil.ToFloat64(metrics.interval.WithLabelValues("gold")); got != tc.want.Seconds() {
				t.Fatalf("volume_healer_schedule_interval_seconds = %v (%v), want %v", got, time.Duration(got*float64(time.Second)), tc.want)
			}
		})
	}
}

func TestScheduleIntervalFollowsTheClass(t *testing.T) {
	metrics := NewMetrics(prometheus.NewRegistry())
	p, err := NewPeriodic(PeriodicOptions{Default: "@every 6h", Metrics: metrics, Recorder: record.NewFakeRecorder(10), Sweeps: func(scheduler.Sweep) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	interval := func(sc string) (float64, bool) {
		v, ok := seriesByLabel(t, metrics.interval, "storageclass")[sc]
		return v, ok
	}
	expect := func(step, sc string, want time.Duration) {
		t.Helper()
		got, ok := interval(sc)
		switch {
		case want == 0 && ok:
			t.Errorf("%s: %s has an interval of %vs, want no series", step, sc, got)
		case want != 0 && !ok:
			t.Errorf("%s: %s has no interval series, want %v", step, sc, want)
		case want != 0 && got != want.Seconds():
			t.Errorf("%s: interval of %s = %vs, want %v", step, sc, got, want)
		}
	}

	p.SetStorageClass(ctx, storageClass("gold", nil))
	p.SetStorageClass(ctx, storageClass("silver", map[string]string{annotations.Schedule: "@every 1h"}))
	expect("default schedule", "gold", 6*time.Hour)
	expect("annotated schedule", "silver", time.Hour)

	p.SetStorageClass(ctx, storageClass("silver", map[string]string{annotations.Schedule: "@every 2h"}))
	expect("edited annotation", "silver", 2*time.Hour)

	// The schedule in force stays, so sweeps are still expected on it.
	p.SetStorageClass(ctx, storageClass("silver", map[string]string{annotations.Schedule: "now and then"}))
	expect("invalid annotation", "silver", 2*time.Hour)

	p.SetStorageClass(ctx, storageClass("silver", map[string]string{annotations.Schedule: "off"}))
	expect("sweeps off", "silver", 0)

	p.RemoveStorageClass("gold")
	expect("deleted class", "gold", 0)
}

// seriesByLabel returns the value of each series c exposes, by the value of label.
func seriesByLabel(t *testing.T, c prometheus.Collector, label string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					out[lp.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// A replica that waited as a standby has schedules whose firings passed while it did not lead.
// It sweeps those classes as soon as it starts leading: the alert on overdue sweeps counts the
// time since the process started and relies on this.
func TestPeriodicSweepsOverdueClassesWhenItStarts(t *testing.T) {
	fc := clocktesting.NewFakeClock(epoch)
	sweeps := make(chan scheduler.Sweep, 16)
	p, err := NewPeriodic(PeriodicOptions{Clock: fc, Sweeps: func(s scheduler.Sweep) { sweeps <- s }})
	if err != nil {
		t.Fatal(err)
	}
	p.SetStorageClass(context.Background(), storageClass("gold", map[string]string{annotations.Schedule: "@every 1h"}))
	fc.Step(30 * time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	if s := expectSweep(t, sweeps); s.StorageClass != "gold" || !s.Fired.Equal(epoch.Add(30*time.Hour)) {
		t.Fatalf("sweep = %+v, want gold fired at start", s)
	}
	expectNoSweep(t, sweeps)
}
