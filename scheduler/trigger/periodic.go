package trigger

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/config"
	"github.com/volume-healer/volume-healer/scheduler"
)

// Schedule sources, as they appear in metrics, logs and Events.
const (
	sourceAnnotation = "annotation"
	sourceConfig     = "config"
	sourceDefault    = "default"
)

// Event reasons on a StorageClass.
const (
	// ReasonInvalidSchedule is the Event reason for a schedule that does not parse.
	ReasonInvalidSchedule = "InvalidSchedule"
)

// PeriodicOptions configure Periodic.
type PeriodicOptions struct {
	// Default is the schedule of StorageClasses that have none of their own. Default: "" (none).
	Default string
	// StorageClasses maps StorageClass names to schedules from the configuration. Default: empty.
	StorageClasses map[string]string
	// Stagger spreads each periodic sweep's calls over this window, or over the time until the
	// class's next firing when that is shorter. Default: 0 (no stagger).
	Stagger time.Duration
	// Clock tells time. Default: the real clock.
	Clock clock.WithTicker
	// Recorder receives Events on StorageClasses whose schedule is invalid. Default: none.
	Recorder record.EventRecorder
	// Metrics counts invalid schedules and publishes each class's schedule interval. Default: none.
	Metrics *Metrics
	// Sweeps receives a Sweep each time a schedule fires. Required.
	Sweeps func(scheduler.Sweep)
}

// Periodic fires periodic sweeps on the cron schedule of each StorageClass. Schedules are read from
// StorageClass annotations as they change (SetStorageClass), so edits apply without a restart. An
// invalid schedule is reported and the class keeps the schedule it had.
type Periodic struct {
	opts         PeriodicOptions
	defaultSched cron.Schedule
	configScheds map[string]cron.Schedule
	mu           sync.Mutex
	entries      map[string]*entry
	wake         chan struct{}
}

// entry is the schedule in force for one StorageClass.
type entry struct {
	spec     string
	source   string
	schedule cron.Schedule
	next     time.Time
	// gap is the longest time between two consecutive firings of schedule; 0 if unknown.
	gap time.Duration
}

// NewPeriodic checks the configured schedules and returns a Periodic with no StorageClass yet.
func NewPeriodic(opts PeriodicOptions) (*Periodic, error) {
	if opts.Sweeps == nil {
		return nil, fmt.Errorf("trigger: PeriodicOptions.Sweeps is required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	p := &Periodic{
		opts:         opts,
		configScheds: map[string]cron.Schedule{},
		entries:      map[string]*entry{},
		wake:         make(chan struct{}, 1),
	}
	if opts.Default != "" {
		s, err := config.ParseSchedule(opts.Default)
		if err != nil {
			return nil, fmt.Errorf("default schedule: %w", err)
		}
		p.defaultSched = s
	}
	for sc, spec := range opts.StorageClasses {
		s, err := config.ParseSchedule(spec)
		if err != nil {
			return nil, fmt.Errorf("schedule of StorageClass %s in the configuration: %w", sc, err)
		}
		p.configScheds[sc] = s
	}
	return p, nil
}

// SetStorageClass takes a new or changed StorageClass into account. It publishes the class's
// schedule interval (volume_healer_schedule_interval_seconds): the longest gap between two
// firings of its schedule plus the stagger, or no series when the class has no schedule.
func (p *Periodic) SetStorageClass(ctx context.Context, sc *storagev1.StorageClass) {
	logger := klog.FromContext(ctx).WithValues("storageClass", sc.Name)
	spec, source, sched := p.resolve(ctx, sc)
	var gap time.Duration
	if sched != nil {
		gap = p.gapOf(spec, sched)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.entries[sc.Name]
	if old != nil && old.spec == spec && old.source == source {
		return
	}
	if sched == nil {
		if old != nil {
			logger.V(2).Info("Periodic sweeps off", "source", source)
		}
		delete(p.entries, sc.Name)
		p.opts.Metrics.clearInterval(sc.Name)
		p.poke()
		return
	}
	e := &entry{spec: spec, source: source, schedule: sched, next: sched.Next(p.opts.Clock.Now()), gap: gap}
	p.entries[sc.Name] = e
	if gap > 0 {
		p.opts.Metrics.setInterval(sc.Name, gap+p.opts.Stagger)
	} else {
		// A schedule that fires once in the years cron looks ahead has no interval to hold
		// sweeps to.
		p.opts.Metrics.clearInterval(sc.Name)
	}
	logger.V(2).Info("Periodic schedule set", "schedule", spec, "source", source, "next", e.next, "longestGap", gap)
	p.poke()
}

// gapOf returns the longest gap between firings of sched, whose text is spec. Classes mostly
// share a few schedules (the default above all), and the walk over a dense schedule's firings
// takes tens of milliseconds, so the gap of a spec already in force is reused.
func (p *Periodic) gapOf(spec string, sched cron.Schedule) time.Duration {
	p.mu.Lock()
	for _, e := range p.entries {
		if e.spec == spec && e.gap > 0 {
			p.mu.Unlock()
			return e.gap
		}
	}
	p.mu.Unlock()
	return longestGap(sched, p.opts.Clock.Now())
}

// The walk of longestGap. A schedule's pattern repeats at most yearly (day of month against
// month length and weekday), so the walk covers a bit more than a year, and at least
// gapMinFirings firings so that a schedule firing every few years is still seen to repeat.
// gapMaxFirings bounds the cost of a schedule that fires every minute; that many firings still
// span more than a week, which holds the weekday patterns that dense schedules use.
const (
	gapHorizon    = 400 * 24 * time.Hour
	gapMinFirings = 64
	gapMaxFirings = 20000
)

// longestGap returns the longest time between two consecutive firings of s after from, or 0 if
// s fires fewer than twice. A schedule that fires every five minutes on weekdays has a gap of
// two days and five minutes: that, not five minutes, is how long its volumes may go unswept.
func longestGap(s cron.Schedule, from time.Time) time.Duration {
	if every, ok := s.(cron.ConstantDelaySchedule); ok {
		return every.Delay
	}
	var longest time.Duration
	first := s.Next(from)
	if first.IsZero() {
		return 0
	}
	// The horizon counts from the first firing: a schedule may first fire more than a year
	// ahead (every minute of 29 February).
	prev := first
	for n := 1; n < gapMaxFirings; n++ {
		next := s.Next(prev)
		if next.IsZero() {
			// robfig/cron looks five years ahead and no further.
			break
		}
		longest = max(longest, next.Sub(prev))
		prev = next
		if n >= gapMinFirings && prev.Sub(first) >= gapHorizon {
			break
		}
	}
	return longest
}

// resolve picks the schedule in force for sc. An invalid annotation is reported and the schedule
// the class already had stays (or, for a class seen the first time, the configured one).
func (p *Periodic) resolve(ctx context.Context, sc *storagev1.StorageClass) (string, string, cron.Schedule) {
	if spec, ok := annotations.Get(sc.Annotations, annotations.Schedule); ok {
		spec = strings.TrimSpace(spec)
		if spec == annotations.ScheduleOff {
			p.opts.Metrics.clearInvalid(sc.Name)
			return spec, sourceAnnotation, nil
		}
		s, err := config.ParseSchedule(spec)
		if err == nil {
			p.opts.Metrics.clearInvalid(sc.Name)
			return spec, sourceAnnotation, s
		}
		p.reportInvalid(ctx, sc, err)
		p.mu.Lock()
		old := p.entries[sc.Name]
		p.mu.Unlock()
		if old != nil {
			return old.spec, old.source, old.schedule
		}
	} else {
		p.opts.Metrics.clearInvalid(sc.Name)
	}
	if s, ok := p.configScheds[sc.Name]; ok {
		return p.opts.StorageClasses[sc.Name], sourceConfig, s
	}
	if p.defaultSched != nil {
		return p.opts.Default, sourceDefault, p.defaultSched
	}
	return "", sourceDefault, nil
}

func (p *Periodic) reportInvalid(ctx context.Context, sc *storagev1.StorageClass, err error) {
	// Name the key the operator wrote: a class annotated for 0.1.0 carries the previous one.
	key := annotations.Schedule
	if _, ok := sc.Annotations[key]; !ok {
		key = annotations.Previous(key)
	}
	msg := fmt.Sprintf("annotation %s: %v; the previous schedule stays in force", key, err)
	klog.FromContext(ctx).Error(err, "Invalid schedule on StorageClass", "storageClass", sc.Name, "annotation", key)
	if p.opts.Recorder != nil {
		p.opts.Recorder.Event(sc, corev1.EventTypeWarning, ReasonInvalidSchedule, msg)
	}
	p.opts.Metrics.invalidSchedule(sc.Name)
}

// RemoveStorageClass stops the periodic sweeps of a deleted StorageClass and removes its series.
func (p *Periodic) RemoveStorageClass(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.entries, name)
	p.opts.Metrics.clearInvalid(name)
	p.opts.Metrics.clearInterval(name)
	p.poke()
}

// Schedules returns the schedule in force for each StorageClass, for status output and tests.
func (p *Periodic) Schedules() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.entries))
	for name, e := range p.entries {
		out[name] = e.spec
	}
	return out
}

// poke wakes the loop so it recomputes its next wake-up; the caller holds p.mu.
func (p *Periodic) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Start fires sweeps until ctx ends. A schedule that came due while the process was busy fires
// once, not once per missed tick.
func (p *Periodic) Start(ctx context.Context) error {
	for {
		now := p.opts.Clock.Now()
		for _, s := range p.due(now) {
			p.opts.Metrics.triggered(scheduler.TriggerSchedule)
			p.opts.Sweeps(s)
		}
		var timer <-chan time.Time
		var t clock.Timer
		if next, ok := p.nextWake(); ok {
			t = p.opts.Clock.NewTimer(next.Sub(now))
			timer = t.C()
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return nil
		case <-p.wake:
		case <-timer:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// due returns the sweeps whose time has come, in StorageClass order, and moves their entries on.
func (p *Periodic) due(now time.Time) []scheduler.Sweep {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []scheduler.Sweep
	for name, e := range p.entries {
		if e.next.After(now) {
			continue
		}
		e.next = e.schedule.Next(now)
		// The stagger never reaches past the class's next firing: a node's calls of one firing
		// start before the next one's, so that a schedule shorter than the stagger (every 10s
		// with the default 5m) neither piles its sweeps up nor delays a node's probes by minutes.
		stagger := min(p.opts.Stagger, e.next.Sub(now))
		out = append(out, scheduler.Sweep{Trigger: scheduler.TriggerSchedule, StorageClass: name, Stagger: stagger, Fired: now})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StorageClass < out[j].StorageClass })
	return out
}

func (p *Periodic) nextWake() (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var next time.Time
	for _, e := range p.entries {
		if next.IsZero() || e.next.Before(next) {
			next = e.next
		}
	}
	return next, !next.IsZero()
}
