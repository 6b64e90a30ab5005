package dispatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// epoch is the fake clock's start in the tests.
var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// runDispatcher starts a Dispatcher and returns it with stop, which ends Start's ctx and waits for
// Start to return. stop also runs when the test ends; tests that leave calls blocked release them
// in a cleanup registered later, which runs first.
func runDispatcher(t *testing.T, opts Options) (*Dispatcher, func()) {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return d, startDispatcher(t, d)
}

func startDispatcher(t *testing.T, d *Dispatcher) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Start(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Start: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Start did not return after its ctx ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// settle bounds a wait for goroutines to get where the test needs them.
const settle = 5 * time.Second

// stepWhenWaiting advances the fake clock once the dispatcher waits on it.
func stepWhenWaiting(t *testing.T, fc *clocktesting.FakeClock, d time.Duration) {
	t.Helper()
	poll.Eventually(t, settle, "the dispatcher to wait on the clock", poll.True(fc.HasWaiters))
	fc.Step(d)
}

// quiet is how long a test watches for something that must not happen.
const quiet = 30 * time.Millisecond

// results collects Done callbacks by task name.
type results struct {
	mu  sync.Mutex
	got map[string][]Result
	wg  sync.WaitGroup
}

func newResults() *results { return &results{got: map[string][]Result{}} }

// done returns a Done callback for the named task; wait waits for all of them.
func (r *results) done(name string) func(Result) {
	r.wg.Add(1)
	return func(res Result) {
		r.mu.Lock()
		r.got[name] = append(r.got[name], res)
		r.mu.Unlock()
		r.wg.Done()
	}
}

func (r *results) wait(t *testing.T) {
	t.Helper()
	ch := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(ch)
	}()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("not every task's Done was called")
	}
}

// one returns the single result of the named task and fails if Done was called another number of
// times.
func (r *results) one(t *testing.T, name string) Result {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.got[name]); n != 1 {
		t.Fatalf("Done of %s called %d times, want once", name, n)
	}
	return r.got[name][0]
}

// level tracks how many calls are in flight now and the most at once.
type level struct{ cur, max atomic.Int64 }

func (l *level) enter() {
	n := l.cur.Add(1)
	for {
		m := l.max.Load()
		if n <= m || l.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (l *level) leave() { l.cur.Add(-1) }

// concurrency records calls in flight globally and per driver, node and volume, as the driver side
// would see them.
type concurrency struct {
	global  level
	drivers map[string]*level
	nodes   map[string]*level
	volumes map[string]*level
}

func newConcurrency() *concurrency {
	return &concurrency{drivers: map[string]*level{}, nodes: map[string]*level{}, volumes: map[string]*level{}}
}

// track must be called for every task before the dispatcher runs, so that run only reads the maps.
func (c *concurrency) track(t Task) {
	for _, mk := range []struct {
		m map[string]*level
		k string
	}{{c.drivers, t.Driver}, {c.nodes, t.Node}, {c.volumes, t.Volume}} {
		if mk.m[mk.k] == nil {
			mk.m[mk.k] = &level{}
		}
	}
}

// run wraps a Run so that its calls are counted.
func (c *concurrency) run(t Task, body func(context.Context) error) func(context.Context) error {
	levels := []*level{&c.global, c.drivers[t.Driver], c.nodes[t.Node], c.volumes[t.Volume]}
	return func(ctx context.Context) error {
		for _, l := range levels {
			l.enter()
		}
		defer func() {
			for _, l := range levels {
				l.leave()
			}
		}()
		return body(ctx)
	}
}

func maxOf(levels map[string]*level) int {
	var m int64
	for _, l := range levels {
		m = max(m, l.max.Load())
	}
	return int(m)
}

func TestDispatchBudgetsHold(t *testing.T) {
	tests := map[string]struct {
		global, perDriver, perNode int
		drivers, nodes, perLane    int
		// The budget that binds is reached exactly; the others are not exceeded.
		wantGlobal, wantDriver, wantNode int
	}{
		"global budget binds": {
			global: 5, perDriver: 50, perNode: 50, drivers: 2, nodes: 4, perLane: 5, wantGlobal: 5,
		},
		"per-driver budget binds": {
			global: 50, perDriver: 3, perNode: 50, drivers: 2, nodes: 4, perLane: 5, wantGlobal: 6, wantDriver: 3,
		},
		"per-node budget binds over drivers": {
			global: 50, perDriver: 50, perNode: 2, drivers: 2, nodes: 4, perLane: 5, wantGlobal: 8, wantNode: 2,
		},
		"global and per-driver together": {
			global: 7, perDriver: 4, perNode: 3, drivers: 2, nodes: 4, perLane: 5, wantGlobal: 7, wantDriver: 4,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := New(Options{Global: tc.global, PerDriver: tc.perDriver, PerNode: tc.perNode})
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			conc := newConcurrency()
			res := newResults()
			var tasks []Task
			for dr := 0; dr < tc.drivers; dr++ {
				for n := 0; n < tc.nodes; n++ {
					for v := 0; v < tc.perLane; v++ {
						tasks = append(tasks, Task{
							Volume: fmt.Sprintf("pv-%d-%d-%d", dr, n, v), Driver: fmt.Sprintf("driver-%d", dr),
							Node: fmt.Sprintf("node-%d", n), Trigger: scheduler.TriggerRestart,
						})
					}
				}
			}
			for _, task := range tasks {
				conc.track(task)
			}
			for _, task := range tasks {
				task.Run = conc.run(task, func(ctx context.Context) error {
					select {
					case <-release:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
				task.Done = res.done(task.Volume)
				d.Submit(task)
			}
			stop := startDispatcher(t, d)

			poll.Eventually(t, settle, "the budgets to fill", poll.True(func() bool { return conc.global.cur.Load() == int64(tc.wantGlobal) }))
			time.Sleep(quiet) // a call over budget would start now
			if s := d.Stats(); s.InFlight != tc.wantGlobal || s.Queued != len(tasks)-tc.wantGlobal {
				t.Fatalf("with every call blocked: %d in flight and %d queued, want %d and %d", s.InFlight, s.Queued, tc.wantGlobal, len(tasks)-tc.wantGlobal)
			}
			close(release)
			res.wait(t)
			stop()

			for _, task := range tasks {
				if r := res.one(t, task.Volume); r.Err != nil {
					t.Errorf("%s: %v", task.Volume, r.Err)
				}
			}
			gotGlobal, gotDriver, gotNode, gotVolume := int(conc.global.max.Load()), maxOf(conc.drivers), maxOf(conc.nodes), maxOf(conc.volumes)
			if gotGlobal != tc.wantGlobal {
				t.Errorf("most calls in flight = %d, want %d", gotGlobal, tc.wantGlobal)
			}
			if gotDriver > tc.perDriver || (tc.wantDriver > 0 && gotDriver != tc.wantDriver) {
				t.Errorf("most calls in flight to one driver = %d, want %d (limit %d)", gotDriver, tc.wantDriver, tc.perDriver)
			}
			if gotNode > tc.perNode || (tc.wantNode > 0 && gotNode != tc.wantNode) {
				t.Errorf("most calls in flight to one node = %d, want %d (limit %d)", gotNode, tc.wantNode, tc.perNode)
			}
			if gotVolume != 1 {
				t.Errorf("most calls in flight on one volume = %d, want 1", gotVolume)
			}
			// The dispatcher holds a slot a little longer than Run runs, so its maxima may be above
			// what the driver side saw, never above the limits.
			s := d.Stats()
			if s.MaxInFlight != tc.wantGlobal || s.MaxInFlightPerDriver < gotDriver || s.MaxInFlightPerDriver > tc.perDriver ||
				s.MaxInFlightPerNode < gotNode || s.MaxInFlightPerNode > tc.perNode || s.MaxInFlightPerVolume != 1 {
				t.Errorf("Stats maxima = %d/%d/%d/%d (global/driver/node/volume); the driver side saw %d/%d/%d/%d, the limits are %d/%d/%d/1",
					s.MaxInFlight, s.MaxInFlightPerDriver, s.MaxInFlightPerNode, s.MaxInFlightPerVolume,
					gotGlobal, gotDriver, gotNode, gotVolume, tc.global, tc.perDriver, tc.perNode)
			}
			if s.Started != len(tasks) || s.Queued != 0 || s.InFlight != 0 {
				t.Errorf("Stats after the run: %+v, want %d started and nothing left", s, len(tasks))
			}
		})
	}
}

func TestDispatchOneCallPerVolume(t *testing.T) {
	d, _ := runDispatcher(t, Options{Global: 10})
	res := newResults()
	ran := make(chan string, 10)
	release := map[string]chan struct{}{"first": make(chan struct{}), "second": make(chan struct{})}
	task := func(name string, trigger scheduler.Trigger) Task {
		return Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: trigger, Done: res.done(name),
			Run: func(ctx context.Context) error {
				ran <- name
				if ch := release[name]; ch != nil {
					<-ch
				}
				return nil
			}}
	}
	d.Submit(task("first", scheduler.TriggerSchedule))
	if got := <-ran; got != "first" {
		t.Fatalf("ran %s, want first", got)
	}
	// A restart sweep and another periodic sweep arrive while the first call is in flight.
	d.Submit(task("second", scheduler.TriggerRestart))
	d.Submit(task("third", scheduler.TriggerSchedule))
	select {
	case got := <-ran:
		t.Fatalf("%s ran while the first call on the volume was in flight", got)
	case <-time.After(quiet):
	}
	if s := d.Stats(); s.InFlight != 1 || s.Queued != 1 {
		t.Fatalf("InFlight, Queued = %d, %d; want 1, 1 (the later two merged behind the call)", s.InFlight, s.Queued)
	}
	close(release["first"])
	if got := <-ran; got != "second" {
		t.Fatalf("after the first call ended, ran %s, want second (the restart task)", got)
	}
	close(release["second"])
	res.wait(t)
	select {
	case got := <-ran:
		t.Fatalf("%s ran; it was merged into the second task and must not run", got)
	default:
	}
	want := map[string]Result{"first": {Attempts: 1}, "second": {Attempts: 1}, "third": {Attempts: 1, Coalesced: true}}
	for name, w := range want {
		if got := res.one(t, name); got != w {
			t.Errorf("%s: result %+v, want %+v", name, got, w)
		}
	}
	if s := d.Stats(); s.MaxInFlightPerVolume != 1 {
		t.Errorf("MaxInFlightPerVolume = %d, want 1", s.MaxInFlightPerVolume)
	}
}

func TestDispatchOneCallPerVolumeUnderConcurrentSubmits(t *testing.T) {
	d, _ := runDispatcher(t, Options{Global: 16, PerNode: 16})
	conc := newConcurrency()
	const volumes, submitters, each = 5, 8, 200
	for v := 0; v < volumes; v++ {
		conc.track(Task{Volume: fmt.Sprintf("pv-%d", v), Driver: "rbd", Node: "node-a"})
	}
	var runs, dones atomic.Int64
	var wg sync.WaitGroup
	for s := 0; s < submitters; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				task := Task{Volume: fmt.Sprintf("pv-%d", i%volumes), Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule}
				task.Run = conc.run(task, func(context.Context) error {
					runs.Add(1)
					runtime.Gosched()
					return nil
				})
				task.Done = func(Result) { dones.Add(1) }
				d.Submit(task)
			}
		}()
	}
	wg.Wait()
	poll.Eventually(t, settle, "every Done", poll.True(func() bool { return dones.Load() == submitters*each }))
	time.Sleep(quiet)
	if n := dones.Load(); n != submitters*each {
		t.Fatalf("Done called %d times for %d tasks", n, submitters*each)
	}
	if got := maxOf(conc.volumes); got != 1 {
		t.Fatalf("most calls in flight on one volume = %d, want 1", got)
	}
	if n := runs.Load(); n < volumes || n > submitters*each {
		t.Fatalf("%d calls for %d tasks on %d volumes", n, submitters*each, volumes)
	}
}

func TestDispatchCoalescing(t *testing.T) {
	type sub struct {
		name      string
		trigger   scheduler.Trigger
		priority  int
		notBefore time.Duration
	}
	tests := map[string]struct {
		first, later sub
		wantRun      string
		wantStart    time.Duration
	}{
		"same class: the queued task runs, the later one is told": {
			first: sub{name: "a", trigger: scheduler.TriggerSchedule}, later: sub{name: "b", trigger: scheduler.TriggerSchedule}, wantRun: "a",
		},
		"a higher trigger class takes over": {
			first: sub{name: "a", trigger: scheduler.TriggerSchedule}, later: sub{name: "b", trigger: scheduler.TriggerRestart}, wantRun: "b",
		},
		"a higher priority in the same class takes over": {
			first: sub{name: "a", trigger: scheduler.TriggerManual, priority: 1}, later: sub{name: "b", trigger: scheduler.TriggerManual, priority: 5}, wantRun: "b",
		},
		"a lower class does not take over despite its priority": {
			first: sub{name: "a", trigger: scheduler.TriggerRestart}, later: sub{name: "b", trigger: scheduler.TriggerSchedule, priority: 100}, wantRun: "a",
		},
		"the earlier NotBefore is kept": {
			first:   sub{name: "a", trigger: scheduler.TriggerSchedule, notBefore: 10 * time.Minute},
			later:   sub{name: "b", trigger: scheduler.TriggerSchedule, notBefore: time.Minute},
			wantRun: "a", wantStart: time.Minute,
		},
		"a restart task taking over does not wait for the periodic stagger": {
			first:   sub{name: "a", trigger: scheduler.TriggerSchedule, notBefore: 10 * time.Minute},
			later:   sub{name: "b", trigger: scheduler.TriggerRestart},
			wantRun: "b",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fc := clocktesting.NewFakeClock(epoch)
			d, err := New(Options{Clock: fc})
			if err != nil {
				t.Fatal(err)
			}
			res := newResults()
			type run struct {
				name string
				at   time.Time
			}
			ran := make(chan run, 2)
			for _, s := range []sub{tc.first, tc.later} {
				var notBefore time.Time
				if s.notBefore > 0 {
					notBefore = epoch.Add(s.notBefore)
				}
				d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: s.trigger, Priority: s.priority,
					NotBefore: notBefore, Done: res.done(s.name),
					Run: func(context.Context) error { ran <- run{s.name, fc.Now()}; return nil }})
			}
			if s := d.Stats(); s.Queued != 1 {
				t.Fatalf("Queued = %d after two submissions for one volume, want 1", s.Queued)
			}
			startDispatcher(t, d)
			if tc.wantStart > 0 {
				stepWhenWaiting(t, fc, tc.wantStart-time.Second)
				select {
				case r := <-ran:
					t.Fatalf("%s ran %s early", r.name, tc.wantStart-time.Second)
				case <-time.After(quiet):
				}
				fc.Step(time.Second)
			}
			r := <-ran
			if r.name != tc.wantRun || !r.at.Equal(epoch.Add(tc.wantStart)) {
				t.Fatalf("ran %s at %s, want %s at %s", r.name, r.at.Sub(epoch), tc.wantRun, tc.wantStart)
			}
			res.wait(t)
			for _, name := range []string{tc.first.name, tc.later.name} {
				got := res.one(t, name)
				if want := (Result{Attempts: 1, Coalesced: name != tc.wantRun}); got != want {
					t.Errorf("%s: result %+v, want %+v", name, got, want)
				}
			}
			select {
			case r := <-ran:
				t.Errorf("%s ran too; merged tasks make one call", r.name)
			default:
			}
		})
	}
}

func TestDispatchOrder(t *testing.T) {
	subs := []struct {
		name     string
		trigger  scheduler.Trigger
		priority int
	}{
		{"schedule-low", scheduler.TriggerSchedule, 0},
		{"schedule-high", scheduler.TriggerSchedule, 5},
		{"manual", scheduler.TriggerManual, 0},
		{"restart-1", scheduler.TriggerRestart, 0},
		{"restart-urgent", scheduler.TriggerRestart, 9},
		{"restart-2", scheduler.TriggerRestart, 0},
		{"schedule-low-2", scheduler.TriggerSchedule, 0},
	}
	want := []string{"restart-urgent", "restart-1", "restart-2", "manual", "schedule-high", "schedule-low", "schedule-low-2"}
	tests := map[string]struct {
		// busyFirst occupies the only slot while the tasks are submitted one by one.
		busyFirst bool
		// batch submits the tasks in one call to a running dispatcher.
		batch bool
	}{
		"submitted one by one before start": {},
		"submitted while the slot is busy":  {busyFirst: true},
		"submitted in one call":             {batch: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := New(Options{Global: 1})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var order []string
			res := newResults()
			blocker := make(chan struct{})
			if tc.busyFirst {
				startDispatcher(t, d)
				running := make(chan struct{})
				d.Submit(Task{Volume: "pv-busy", Driver: "rbd", Node: "node-z", Trigger: scheduler.TriggerRestart, Done: res.done("busy"),
					Run: func(context.Context) error { close(running); <-blocker; return nil }})
				<-running
			}
			if tc.batch {
				startDispatcher(t, d)
			}
			var tasks []Task
			for i, s := range subs {
				// Every task on its own node and volume: only the order decides.
				tasks = append(tasks, Task{Volume: fmt.Sprintf("pv-%d", i), Driver: "rbd", Node: fmt.Sprintf("node-%d", i),
					Trigger: s.trigger, Priority: s.priority, Done: res.done(s.name),
					Run: func(context.Context) error {
						mu.Lock()
						order = append(order, s.name)
						mu.Unlock()
						return nil
					}})
			}
			switch {
			case tc.batch:
				d.Submit(tasks...)
			case tc.busyFirst:
				for _, task := range tasks {
					d.Submit(task)
				}
				close(blocker)
			default:
				for _, task := range tasks {
					d.Submit(task)
				}
				startDispatcher(t, d)
			}
			res.wait(t)
			if strings.Join(order, " ") != strings.Join(want, " ") {
				t.Fatalf("order:\n got  %v\n want %v", order, want)
			}
		})
	}
}

func TestDispatchNoHeadOfLineBlocking(t *testing.T) {
	tests := map[string]struct {
		opts Options
		// The blocker fills its budget; the stuck task shares the blocker's full budget, the free
		// task does not, and was submitted after the stuck one with a lower trigger class.
		blocker, stuck, free Task
	}{
		"a full node does not hold up another node": {
			opts:    Options{Global: 10, PerDriver: 10, PerNode: 1},
			blocker: Task{Volume: "pv-a1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart},
			stuck:   Task{Volume: "pv-a2", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Priority: 9},
			free:    Task{Volume: "pv-b1", Driver: "rbd", Node: "node-b", Trigger: scheduler.TriggerSchedule},
		},
		"a full driver does not hold up another driver": {
			opts:    Options{Global: 10, PerDriver: 1, PerNode: 10},
			blocker: Task{Volume: "pv-a1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart},
			stuck:   Task{Volume: "pv-a2", Driver: "rbd", Node: "node-b", Trigger: scheduler.TriggerRestart, Priority: 9},
			free:    Task{Volume: "pv-b1", Driver: "cephfs", Node: "node-a", Trigger: scheduler.TriggerSchedule},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, _ := runDispatcher(t, tc.opts)
			res := newResults()
			release := make(chan struct{})
			t.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			started := make(chan string, 3)
			submit := func(task Task) {
				name := task.Volume
				task.Done = res.done(name)
				task.Run = func(context.Context) error {
					started <- name
					if name == tc.blocker.Volume {
						<-release
					}
					return nil
				}
				d.Submit(task)
			}
			submit(tc.blocker)
			if got := <-started; got != tc.blocker.Volume {
				t.Fatalf("started %s first, want the blocker", got)
			}
			submit(tc.stuck)
			submit(tc.free)
			select {
			case got := <-started:
				if got != tc.free.Volume {
					t.Fatalf("started %s over a full budget", got)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the task with budget left did not start while another task waited for a full budget")
			}
			select {
			case got := <-started:
				t.Fatalf("started %s over a full budget", got)
			case <-time.After(quiet):
			}
			close(release)
			if got := <-started; got != tc.stuck.Volume {
				t.Fatalf("started %s, want the waiting task once the budget freed", got)
			}
			res.wait(t)
		})
	}
}

func TestDispatchNotBefore(t *testing.T) {
	fc := clocktesting.NewFakeClock(epoch)
	d, _ := runDispatcher(t, Options{Clock: fc})
	ran := make(chan time.Time, 2)
	res := newResults()
	d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule, NotBefore: epoch.Add(30 * time.Second),
		Done: res.done("staggered"), Run: func(context.Context) error { ran <- fc.Now(); return nil }})
	d.Submit(Task{Volume: "pv-2", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule, NotBefore: epoch.Add(-time.Second),
		Done: res.done("due"), Run: func(context.Context) error { ran <- fc.Now(); return nil }})
	if at := <-ran; !at.Equal(epoch) {
		t.Fatalf("the task already due ran at %s, want at once", at.Sub(epoch))
	}
	stepWhenWaiting(t, fc, 29*time.Second)
	select {
	case at := <-ran:
		t.Fatalf("ran at %s, before its NotBefore (30s)", at.Sub(epoch))
	case <-time.After(quiet):
	}
	if s := d.Stats(); s.Queued != 1 || s.Started != 1 {
		t.Fatalf("Queued, Started = %d, %d before NotBefore; want 1, 1", s.Queued, s.Started)
	}
	fc.Step(time.Second)
	if at := <-ran; !at.Equal(epoch.Add(30 * time.Second)) {
		t.Fatalf("ran at %s, want at its NotBefore (30s)", at.Sub(epoch))
	}
	res.wait(t)
}

// attemptRecorder is a Run that answers from a script of errors, the last repeating, and records
// the fake time of each call.
type attemptRecorder struct {
	fc     *clocktesting.FakeClock
	script []error
	mu     sync.Mutex
	calls  int
	times  chan time.Time
}

func newAttemptRecorder(fc *clocktesting.FakeClock, script ...error) *attemptRecorder {
	return &attemptRecorder{fc: fc, script: script, times: make(chan time.Time, 100)}
}

func (a *attemptRecorder) run(context.Context) error {
	a.mu.Lock()
	err := a.script[min(a.calls, len(a.script)-1)]
	a.calls++
	a.mu.Unlock()
	a.times <- a.fc.Now()
	return err
}

// expectAttemptAfter checks that the next call comes exactly gap after the previous one: not a
// millisecond earlier, and when the clock reaches it.
func (a *attemptRecorder) expectAttemptAfter(t *testing.T, prev time.Time, gap time.Duration) time.Time {
	t.Helper()
	stepWhenWaiting(t, a.fc, gap-time.Millisecond)
	select {
	case at := <-a.times:
		t.Fatalf("call at %s, %s after the previous one, want %s", at.Sub(epoch), at.Sub(prev), gap)
	case <-time.After(quiet):
	}
	a.fc.Step(time.Millisecond)
	select {
	case at := <-a.times:
		if at.Sub(prev) != gap {
			t.Fatalf("call %s after the previous one, want %s", at.Sub(prev), gap)
		}
		return at
	case <-time.After(5 * time.Second):
		t.Fatalf("no call %s after the previous one", gap)
		return time.Time{}
	}
}

func TestDispatchBackoff(t *testing.T) {
	fc := clocktesting.NewFakeClock(epoch)
	d, _ := runDispatcher(t, Options{Clock: fc, BackoffBase: time.Second, BackoffMax: 4 * time.Second, MaxAttempts: 5})
	broken := errors.New("mount point is gone")
	rec := newAttemptRecorder(fc, broken)
	res := newResults()
	d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Run: rec.run, Done: res.done("failing")})

	prev := <-rec.times
	for _, gap := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		prev = rec.expectAttemptAfter(t, prev, gap)
	}
	res.wait(t)
	got := res.one(t, "failing")
	if !errors.Is(got.Err, ErrGaveUp) || !errors.Is(got.Err, broken) || got.Attempts != 5 {
		t.Fatalf("result %+v, want given up after 5 attempts with the last error", got)
	}

	// The volume stays in backoff for the next task, from another sweep (failure 6: capped at 4s).
	healthy := newAttemptRecorder(fc, nil)
	res = newResults()
	d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule, Run: healthy.run, Done: res.done("next")})
	healthy.expectAttemptAfter(t, prev, 4*time.Second)
	res.wait(t)
	if got := res.one(t, "next"); got.Err != nil || got.Attempts != 1 {
		t.Fatalf("result %+v, want success in one attempt", got)
	}

	// Success ended the backoff: the next task runs at once.
	res = newResults()
	d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule, Run: healthy.run, Done: res.done("after")})
	select {
	case <-healthy.times:
	case <-time.After(5 * time.Second):
		t.Fatal("a volume that succeeded is still held back")
	}
	res.wait(t)
	if s := d.Stats(); s.TrackedVolumes != 0 {
		t.Fatalf("TrackedVolumes = %d after success, want 0", s.TrackedVolumes)
	}
}

func TestDispatchBackoffDurations(t *testing.T) {
	d, err := New(Options{BackoffBase: time.Second, BackoffMax: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		failures int
		want     time.Duration
	}{
		"first failure waits the base":        {1, time.Second},
		"second failure waits twice the base": {2, 2 * time.Second},
		"fourth failure waits 8 times":        {4, 8 * time.Second},
		"fifth failure hits the cap":          {5, 10 * time.Second},
		"many failures stay at the cap":       {200, 10 * time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := d.backoff(tc.failures); got != tc.want {
				t.Fatalf("backoff(%d) = %s, want %s", tc.failures, got, tc.want)
			}
		})
	}
}

func TestDispatchErrorClasses(t *testing.T) {
	busy := fmt.Errorf("rpc error: code = Aborted: %w", ErrRetryLater)
	unimplemented := fmt.Errorf("rpc error: code = Unimplemented: %w", ErrPermanent)
	failed := errors.New("rpc error: code = Internal")
	tests := map[string]struct {
		opts         Options
		script       []error
		wantGaps     []time.Duration
		wantAttempts int
		wantErrs     []error // nil: success
	}{
		"busy is retried after the base without using up attempts": {
			opts:   Options{MaxAttempts: 1, BackoffBase: 2 * time.Second},
			script: []error{busy, busy, nil}, wantGaps: []time.Duration{2 * time.Second, 2 * time.Second}, wantAttempts: 3,
		},
		"busy replies are bounded": {
			opts:   Options{MaxBusyRetries: 2, BackoffBase: time.Second},
			script: []error{busy}, wantGaps: []time.Duration{time.Second, time.Second}, wantAttempts: 3,
			wantErrs: []error{ErrGaveUp, ErrRetryLater},
		},
		"permanent is not retried": {
			opts: Options{MaxAttempts: 5}, script: []error{unimplemented}, wantAttempts: 1,
			wantErrs: []error{ErrPermanent},
		},
		"a failure is retried and success ends the task": {
			opts:   Options{MaxAttempts: 3, BackoffBase: time.Second},
			script: []error{failed, nil}, wantGaps: []time.Duration{time.Second}, wantAttempts: 2,
		},
		"busy does not raise the failure backoff": {
			opts:   Options{MaxAttempts: 3, BackoffBase: time.Second},
			script: []error{failed, busy, failed}, wantGaps: []time.Duration{time.Second, time.Second, 2 * time.Second},
			wantAttempts: 4, wantErrs: []error{ErrGaveUp, failed},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fc := clocktesting.NewFakeClock(epoch)
			tc.opts.Clock = fc
			d, _ := runDispatcher(t, tc.opts)
			rec := newAttemptRecorder(fc, tc.script...)
			res := newResults()
			d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Run: rec.run, Done: res.done("task")})
			prev := <-rec.times
			for _, gap := range tc.wantGaps {
				prev = rec.expectAttemptAfter(t, prev, gap)
			}
			res.wait(t)
			got := res.one(t, "task")
			if got.Attempts != tc.wantAttempts {
				t.Errorf("Attempts = %d, want %d", got.Attempts, tc.wantAttempts)
			}
			if tc.wantErrs == nil && got.Err != nil {
				t.Errorf("Err = %v, want success", got.Err)
			}
			for _, want := range tc.wantErrs {
				if !errors.Is(got.Err, want) {
					t.Errorf("Err = %v, want it to wrap %v", got.Err, want)
				}
			}
			select {
			case at := <-rec.times:
				t.Errorf("extra call at %s", at.Sub(epoch))
			case <-time.After(quiet):
			}
		})
	}
}

func TestDispatchTimeoutFreesTheSlot(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	d, _ := runDispatcher(t, Options{Global: 1, MaxAttempts: 2, BackoffBase: time.Millisecond, Metrics: m})
	res := newResults()
	var deadlines []time.Duration
	var mu sync.Mutex
	// A hung call whose error does not say it timed out, as a gRPC client may answer.
	d.Submit(Task{Volume: "pv-hung", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Timeout: 20 * time.Millisecond,
		Done: res.done("hung"),
		Run: func(ctx context.Context) error {
			dl, ok := ctx.Deadline()
			mu.Lock()
			if ok {
				deadlines = append(deadlines, time.Until(dl))
			}
			mu.Unlock()
			<-ctx.Done()
			return errors.New("rpc error: code = DeadlineExceeded")
		}})
	other := make(chan struct{})
	d.Submit(Task{Volume: "pv-ok", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule, Done: res.done("ok"),
		Run: func(context.Context) error { close(other); return nil }})
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("the slot held by a hung call was never freed")
	}
	res.wait(t)
	hung := res.one(t, "hung")
	if !errors.Is(hung.Err, context.DeadlineExceeded) || !errors.Is(hung.Err, ErrGaveUp) || hung.Attempts != 2 {
		t.Fatalf("hung call result %+v, want given up after 2 timed-out attempts", hung)
	}
	if got := res.one(t, "ok"); got.Err != nil {
		t.Fatalf("the other task: %v", got.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deadlines) != 2 || deadlines[0] <= 0 || deadlines[0] > 20*time.Millisecond {
		t.Fatalf("deadlines seen by the calls = %v, want two of at most 20ms", deadlines)
	}
	if got := testutil.ToFloat64(m.retries.WithLabelValues(retryTimeout)); got != 1 {
		t.Fatalf("retries_total{reason=timeout} = %v, want 1", got)
	}
}

// A call that ends on its own deadline, shorter than the task's, is retried as a timeout: the
// metric must not file it under failures.
func TestDispatchCallTimeoutCountsAsTimeout(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	d, _ := runDispatcher(t, Options{Global: 1, MaxAttempts: 2, BackoffBase: time.Millisecond, Metrics: m})
	res := newResults()
	calls := 0
	d.Submit(Task{Volume: "pv-slow", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Timeout: time.Minute,
		Done: res.done("slow"),
		Run: func(context.Context) error {
			calls++
			if calls == 1 {
				return fmt.Errorf("probe: %w", context.DeadlineExceeded)
			}
			return nil
		}})
	res.wait(t)
	if got := res.one(t, "slow"); got.Err != nil {
		t.Fatalf("task: %v", got.Err)
	}
	if got := testutil.ToFloat64(m.retries.WithLabelValues(retryTimeout)); got != 1 {
		t.Errorf("retries_total{reason=timeout} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.retries.WithLabelValues(retryFailed)); got != 0 {
		t.Errorf("retries_total{reason=failed} = %v, want 0", got)
	}
}

func TestDispatchShutdown(t *testing.T) {
	tests := map[string]struct {
		// inFlight is the call in flight at shutdown; it gets a channel closed to let it finish.
		inFlight func(ctx context.Context, finish <-chan struct{}) error
		// finishInGrace lets the call end during the grace; otherwise the grace runs out.
		finishInGrace bool
		wantErrs      []error // nil: success
		wantCancelled bool    // the call's ctx was cancelled
	}{
		"a hung call is cancelled after the grace": {
			inFlight: func(ctx context.Context, _ <-chan struct{}) error { <-ctx.Done(); return ctx.Err() },
			wantErrs: []error{context.Canceled, ErrDispatcherStopped}, wantCancelled: true,
		},
		"a call finishing within the grace keeps its result": {
			inFlight:      func(_ context.Context, finish <-chan struct{}) error { <-finish; return nil },
			finishInGrace: true,
		},
		"a call failing within the grace is not retried": {
			inFlight:      func(_ context.Context, finish <-chan struct{}) error { <-finish; return errors.New("stale mount") },
			finishInGrace: true, wantErrs: []error{ErrDispatcherStopped},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fc := clocktesting.NewFakeClock(epoch)
			d, stop := runDispatcher(t, Options{Global: 1, Clock: fc, ShutdownGrace: 10 * time.Second})
			res := newResults()
			running, finish := make(chan struct{}), make(chan struct{})
			var cancelled atomic.Bool
			d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Done: res.done("in-flight"),
				Run: func(ctx context.Context) error {
					close(running)
					err := tc.inFlight(ctx, finish)
					cancelled.Store(ctx.Err() != nil)
					return err
				}})
			<-running
			queuedRan := make(chan struct{}, 1)
			d.Submit(Task{Volume: "pv-2", Driver: "rbd", Node: "node-b", Trigger: scheduler.TriggerRestart, Done: res.done("queued"),
				Run: func(context.Context) error { queuedRan <- struct{}{}; return nil }})

			stopped := make(chan struct{})
			go func() { stop(); close(stopped) }()
			poll.Eventually(t, settle, "the shutdown grace timer", poll.True(fc.HasWaiters))
			select {
			case <-stopped:
				t.Fatal("Start returned while a call was in flight within the grace")
			case <-time.After(quiet):
			}
			if tc.finishInGrace {
				close(finish)
			} else {
				fc.Step(10*time.Second - time.Millisecond)
				select {
				case <-stopped:
					t.Fatal("Start returned before the grace ran out")
				case <-time.After(quiet):
				}
				fc.Step(time.Millisecond)
			}
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				t.Fatal("Start did not return")
			}
			res.wait(t)

			got := res.one(t, "in-flight")
			if got.Attempts != 1 {
				t.Errorf("in-flight task: %d attempts, want 1", got.Attempts)
			}
			if tc.wantErrs == nil && got.Err != nil {
				t.Errorf("in-flight task: %v, want success", got.Err)
			}
			for _, want := range tc.wantErrs {
				if !errors.Is(got.Err, want) {
					t.Errorf("in-flight task: %v, want it to wrap %v", got.Err, want)
				}
			}
			if cancelled.Load() != tc.wantCancelled {
				t.Errorf("call's ctx cancelled = %v, want %v", cancelled.Load(), tc.wantCancelled)
			}
			q := res.one(t, "queued")
			if !errors.Is(q.Err, ErrDispatcherStopped) || !errors.Is(q.Err, context.Canceled) || q.Attempts != 0 {
				t.Errorf("queued task: %+v, want cancelled without a call", q)
			}
			select {
			case <-queuedRan:
				t.Error("the queued task ran after shutdown began")
			default:
			}

			late := newResults()
			d.Submit(Task{Volume: "pv-3", Run: func(context.Context) error { return nil }, Done: late.done("late")})
			late.wait(t)
			if r := late.one(t, "late"); !errors.Is(r.Err, ErrDispatcherStopped) {
				t.Errorf("task submitted after stop: %v, want ErrDispatcherStopped", r.Err)
			}
			if err := d.Start(context.Background()); !errors.Is(err, ErrDispatcherStarted) {
				t.Errorf("second Start: %v, want ErrDispatcherStarted", err)
			}
		})
	}
}

func TestDispatchLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		d, err := New(Options{Global: 8, PerNode: 2, BackoffBase: time.Millisecond, MaxAttempts: 2, ShutdownGrace: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Start(ctx) }()
		var dones atomic.Int64
		const n = 300
		for i := 0; i < n; i++ {
			task := Task{Volume: fmt.Sprintf("pv-%d", i%100), Driver: "rbd", Node: fmt.Sprintf("node-%d", i%7), Trigger: scheduler.TriggerSchedule,
				Done: func(Result) { dones.Add(1) }}
			switch i % 4 {
			case 0:
				task.Run = func(context.Context) error { return nil }
			case 1:
				task.Run = func(context.Context) error { return errors.New("broken") }
			case 2:
				task.Run = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
			case 3:
				task.NotBefore = time.Now().Add(time.Hour)
				task.Run = func(context.Context) error { return nil }
			}
			d.Submit(task)
		}
		time.Sleep(quiet)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := dones.Load(); got != n {
			t.Fatalf("Done called %d times for %d tasks", got, n)
		}
	}()
	poll.Eventually(t, settle, "the dispatcher's goroutines to end", poll.True(func() bool { return runtime.NumGoroutine() <= before }))
}

func TestDispatchForgetsSettledVolumes(t *testing.T) {
	fc := clocktesting.NewFakeClock(epoch)
	d, _ := runDispatcher(t, Options{Clock: fc, Global: 2000, PerDriver: 2000, PerNode: 2000,
		MaxAttempts: 1, BackoffBase: time.Second, BackoffMax: 2 * time.Second})
	res := newResults()
	const failing = 1100
	for i := 0; i < failing; i++ {
		d.Submit(Task{Volume: fmt.Sprintf("pv-bad-%d", i), Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule,
			Run: func(context.Context) error { return errors.New("broken") }, Done: res.done("bad")})
	}
	res.wait(t)
	if s := d.Stats(); s.TrackedVolumes != failing {
		t.Fatalf("TrackedVolumes = %d, want %d: failed volumes keep their backoff", s.TrackedVolumes, failing)
	}
	// Their backoff (1s) ended more than BackoffMax ago: their state is dropped on the next sweep.
	fc.Step(time.Minute)
	release := make(chan struct{})
	for i := 0; i < 1000; i++ {
		d.Submit(Task{Volume: fmt.Sprintf("pv-good-%d", i), Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule,
			Run: func(context.Context) error { <-release; return nil }, Done: res.done("good")})
	}
	close(release)
	res.wait(t)
	if s := d.Stats(); s.TrackedVolumes != 0 {
		t.Fatalf("TrackedVolumes = %d, want 0: settled volumes are forgotten", s.TrackedVolumes)
	}
}

func TestDispatchRejectsInvalidTasks(t *testing.T) {
	d, _ := runDispatcher(t, Options{})
	tests := map[string]Task{
		"no volume": {Run: func(context.Context) error { return nil }},
		"no run":    {Volume: "pv-1"},
	}
	for name, task := range tests {
		t.Run(name, func(t *testing.T) {
			res := newResults()
			task.Done = res.done("task")
			d.Submit(task)
			res.wait(t)
			if got := res.one(t, "task"); !errors.Is(got.Err, ErrInvalidTask) {
				t.Fatalf("Err = %v, want ErrInvalidTask", got.Err)
			}
		})
	}
}

func TestNewDispatcherOptions(t *testing.T) {
	tests := map[string]struct {
		opts    Options
		wantErr string
		check   func(Options) bool
	}{
		"zero values take the defaults": {
			check: func(o Options) bool {
				return o.Global == 64 && o.PerDriver == 32 && o.PerNode == 4 && o.BackoffBase == 5*time.Second &&
					o.BackoffMax == 10*time.Minute && o.MaxAttempts == 5 && o.MaxBusyRetries == 20 &&
					o.DefaultTimeout == 30*time.Second && o.ShutdownGrace == 10*time.Second && o.Clock != nil
			},
		},
		"set values are kept": {
			opts:  Options{Global: 3, PerDriver: 2, PerNode: 1},
			check: func(o Options) bool { return o.Global == 3 && o.PerDriver == 2 && o.PerNode == 1 },
		},
		"a negative budget is rejected":            {opts: Options{PerNode: -1}, wantErr: "PerNode is -1"},
		"a negative timeout is rejected":           {opts: Options{DefaultTimeout: -time.Second}, wantErr: "DefaultTimeout is -1s"},
		"a backoff cap below the base is rejected": {opts: Options{BackoffBase: time.Minute, BackoffMax: time.Second}, wantErr: "BackoffMax (1s) is below BackoffBase (1m0s)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := New(tc.opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(d.opts) {
				t.Fatalf("options = %+v", d.opts)
			}
		})
	}
}

func TestDispatchMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	d, _ := runDispatcher(t, Options{Metrics: m, BackoffBase: time.Millisecond, MaxAttempts: 2})
	res := newResults()
	failOnce := func(err error) func(context.Context) error {
		var calls atomic.Int32
		return func(context.Context) error {
			if calls.Add(1) == 1 {
				return err
			}
			return nil
		}
	}
	d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Run: failOnce(errors.New("broken")), Done: res.done("a")})
	d.Submit(Task{Volume: "pv-2", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Run: failOnce(ErrRetryLater), Done: res.done("b")})
	d.Submit(Task{Volume: "pv-3", Driver: "cephfs", Node: "node-a", Trigger: scheduler.TriggerSchedule,
		Run: func(context.Context) error { return errors.New("broken") }, Done: res.done("c")})
	res.wait(t)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{
		"volume_healer_dispatch_in_flight", "volume_healer_dispatch_queued", "volume_healer_dispatch_budget_wait_seconds",
		"volume_healer_dispatch_retries_total", "volume_healer_dispatch_given_up_total",
	} {
		if !names[want] {
			t.Errorf("metric %s is not exposed", want)
		}
	}
	counts := map[string]float64{
		"retries failed":   testutil.ToFloat64(m.retries.WithLabelValues(retryFailed)),
		"retries busy":     testutil.ToFloat64(m.retries.WithLabelValues(retryBusy)),
		"given up":         testutil.ToFloat64(m.givenUp),
		"queued":           testutil.ToFloat64(m.queued),
		"in flight rbd":    testutil.ToFloat64(m.inFlight.WithLabelValues("rbd")),
		"in flight cephfs": testutil.ToFloat64(m.inFlight.WithLabelValues("cephfs")),
	}
	want := map[string]float64{"retries failed": 2, "retries busy": 1, "given up": 1}
	for k, v := range counts {
		if v != want[k] {
			t.Errorf("%s = %v, want %v", k, v, want[k])
		}
	}
	// Six calls started: two each for pv-1, pv-2 and pv-3.
	if n := testutil.CollectAndCount(m.budgetWait); n != 3 {
		t.Errorf("budget wait series = %d, want one per trigger (3)", n)
	}
	var samples uint64
	for _, f := range families {
		if f.GetName() == "volume_healer_dispatch_budget_wait_seconds" {
			for _, metric := range f.GetMetric() {
				samples += metric.GetHistogram().GetSampleCount()
			}
		}
	}
	if samples != 6 {
		t.Errorf("budget wait observations = %d, want 6 (one per call)", samples)
	}
}

func TestDispatchOrderBetweenNodes(t *testing.T) {
	type sub struct{ name, driver, node string }
	tests := map[string]struct {
		subs []sub
		// restart names the one submission of the restart class; the others are periodic.
		restart string
		want    []string
	}{
		// With one slot, a task queued on a node counts as much as a call started elsewhere while
		// a lane waits. node-b, with the most queued, goes first and twice, until node-c, equal to
		// it and waiting, has its turn; node-a, with one task, is served once it has waited three
		// calls, before node-b's remaining two.
		"the node with the most queued first, gained on by waiting": {
			subs: []sub{{"a1", "rbd", "node-a"}, {"b1", "rbd", "node-b"}, {"b2", "rbd", "node-b"}, {"b3", "rbd", "node-b"},
				{"b4", "rbd", "node-b"}, {"c1", "rbd", "node-c"}, {"c2", "rbd", "node-c"}},
			want: []string{"b1", "b2", "c1", "a1", "b3", "c2", "b4"},
		},
		// node-a has four volumes over two drivers, node-b three: node-a's per-node budget is the
		// one that runs longest, so node-a goes first although each of its drivers has fewer.
		"a node's drivers count together": {
			subs: []sub{{"a-rbd-1", "rbd", "node-a"}, {"a-rbd-2", "rbd", "node-a"}, {"a-fs-1", "cephfs", "node-a"},
				{"a-fs-2", "cephfs", "node-a"}, {"b1", "rbd", "node-b"}, {"b2", "rbd", "node-b"}, {"b3", "rbd", "node-b"}},
			want: []string{"a-rbd-1", "a-fs-1", "b1", "a-rbd-2", "a-fs-2", "b2", "b3"},
		},
		"the trigger class before the queue": {
			subs:    []sub{{"a1", "rbd", "node-a"}, {"a2", "rbd", "node-a"}, {"a3", "rbd", "node-a"}, {"b-restart", "rbd", "node-b"}},
			restart: "b-restart",
			want:    []string{"b-restart", "a1", "a2", "a3"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := New(Options{Global: 1})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var order []string
			res := newResults()
			for _, s := range tc.subs {
				trigger := scheduler.TriggerSchedule
				if s.name == tc.restart {
					trigger = scheduler.TriggerRestart
				}
				d.Submit(Task{Volume: "pv-" + s.name, Driver: s.driver, Node: s.node, Trigger: trigger, Done: res.done(s.name),
					Run: func(context.Context) error {
						mu.Lock()
						order = append(order, s.name)
						mu.Unlock()
						return nil
					}})
			}
			startDispatcher(t, d)
			res.wait(t)
			if strings.Join(order, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("order:\n got  %v\n want %v", order, tc.want)
			}
		})
	}
}

func TestDispatchBudgetGauge(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	if _, err := New(Options{Global: 10, PerDriver: 6, PerNode: 3, Metrics: m}); err != nil {
		t.Fatal(err)
	}
	for scope, want := range map[string]float64{"global": 10, "driver": 6, "node": 3} {
		if got := testutil.ToFloat64(m.budget.WithLabelValues(scope)); got != want {
			t.Errorf("volume_healer_dispatch_budget{scope=%q} = %v, want %v", scope, got, want)
		}
	}
}

// TestDispatchRestartIsNotHeldByTheGonePluginsBackoff: a periodic sweep's calls on a volume fail
// as its node plugin goes down, which puts the volume in backoff; the restart sweep of the new
// plugin, seen after those calls started, calls the volume at once instead of after that backoff
// (with the defaults, 5s after one failure and 15s after two: the heal a workload waits for), both
// when the failed call had ended and when it was still in flight. The restart task's own failures
// back off as any.
func TestDispatchRestartIsNotHeldByTheGonePluginsBackoff(t *testing.T) {
	gone := errors.New("rpc error: code = Unavailable: connection refused")
	t.Run("the failed calls had ended", func(t *testing.T) {
		fc := clocktesting.NewFakeClock(epoch)
		d, _ := runDispatcher(t, Options{Clock: fc, BackoffBase: 5 * time.Second, BackoffMax: time.Minute, MaxAttempts: 5})
		periodic := newAttemptRecorder(fc, gone)
		res := newResults()
		d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule, Run: periodic.run, Done: res.done("periodic")})
		prev := <-periodic.times
		// The periodic task tries again after the backoff, and fails again: 10s of backoff now.
		prev = periodic.expectAttemptAfter(t, prev, 5*time.Second)

		// The new plugin registered 1s later; its restart sweep heals the volume.
		fc.Step(time.Second)
		restarted := fc.Now()
		healed := newAttemptRecorder(fc, nil)
		d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, CallsSince: restarted, Run: healed.run, Done: res.done("restart")})
		select {
		case at := <-healed.times:
			if !at.Equal(restarted) {
				t.Fatalf("the restart sweep's call came %s after the restart, want at once", at.Sub(restarted))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the restart sweep's call waits for the backoff of the calls to the gone plugin (until %s after the restart)", prev.Add(10*time.Second).Sub(restarted))
		}
		res.wait(t)
		if got := res.one(t, "restart"); got.Err != nil || got.Attempts != 1 {
			t.Fatalf("restart task: %+v, want success at its first attempt", got)
		}
		if got := res.one(t, "periodic"); got.Err != nil || !got.Coalesced {
			t.Fatalf("periodic task: %+v, want the restart task's success, coalesced", got)
		}
	})
	t.Run("the failed call was in flight", func(t *testing.T) {
		fc := clocktesting.NewFakeClock(epoch)
		d, _ := runDispatcher(t, Options{Clock: fc, BackoffBase: 5 * time.Second, BackoffMax: time.Minute, MaxAttempts: 5})
		release := make(chan struct{})
		started := make(chan struct{})
		hung := func(context.Context) error {
			close(started)
			<-release
			return gone
		}
		res := newResults()
		d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerSchedule, Run: hung, Done: res.done("periodic")})
		<-started
		fc.Step(2 * time.Second)
		restarted := fc.Now()
		healed := newAttemptRecorder(fc, nil)
		d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, CallsSince: restarted, Run: healed.run, Done: res.done("restart")})
		// The call to the gone plugin fails only now, after the restart was seen.
		fc.Step(time.Second)
		close(release)
		select {
		case at := <-healed.times:
			if want := restarted.Add(time.Second); !at.Equal(want) {
				t.Fatalf("the restart sweep's call came %s after the failed call ended, want at once", at.Sub(want))
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the restart sweep's call waits for the backoff of the call to the gone plugin")
		}
		res.wait(t)
	})
	t.Run("the restart task's own failures back off", func(t *testing.T) {
		fc := clocktesting.NewFakeClock(epoch)
		d, _ := runDispatcher(t, Options{Clock: fc, BackoffBase: 5 * time.Second, BackoffMax: time.Minute, MaxAttempts: 3})
		failing := newAttemptRecorder(fc, gone)
		res := newResults()
		d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, CallsSince: fc.Now(), Run: failing.run, Done: res.done("restart")})
		prev := <-failing.times
		prev = failing.expectAttemptAfter(t, prev, 5*time.Second)
		failing.expectAttemptAfter(t, prev, 10*time.Second)
		res.wait(t)
		if got := res.one(t, "restart"); !errors.Is(got.Err, ErrGaveUp) || got.Attempts != 3 {
			t.Fatalf("restart task: %+v, want given up after 3 attempts", got)
		}
	})
}
