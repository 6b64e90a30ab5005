package dispatch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// fakeLease is a leader election Lease whose time the test sets.
type fakeLease struct {
	mu      sync.Mutex
	until   time.Time
	changed chan struct{}
}

func newFakeLease(until time.Time) *fakeLease {
	return &fakeLease{until: until, changed: make(chan struct{})}
}

func (l *fakeLease) Until() (time.Time, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until, l.changed
}

// renew moves the time calls may run until, as a renewal does.
func (l *fakeLease) renew(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = until
	close(l.changed)
	l.changed = make(chan struct{})
}

// No call starts before the Lease is taken, nor once the time it is known held has passed; a
// renewal lets the waiting calls start.
func TestDispatchNoCallWithoutTheLease(t *testing.T) {
	fc := clocktesting.NewFakeClock(epoch)
	lease := newFakeLease(time.Time{})
	d, _ := runDispatcher(t, Options{Clock: fc, Lease: lease})
	started := make(chan string, 4)
	res := newResults()
	submit := func(pv string) {
		d.Submit(Task{Volume: pv, Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Done: res.done(pv),
			Run: func(context.Context) error { started <- pv; return nil }})
	}
	expectNone := func(when string) {
		t.Helper()
		select {
		case pv := <-started:
			t.Fatalf("%s: a call on %s started", when, pv)
		case <-time.After(quiet):
		}
	}
	expect := func(pv string) {
		t.Helper()
		select {
		case got := <-started:
			if got != pv {
				t.Fatalf("call on %s started, want %s", got, pv)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no call on %s started", pv)
		}
	}

	submit("pv-1")
	expectNone("before the Lease was taken")
	lease.renew(epoch.Add(10 * time.Second))
	expect("pv-1")

	fc.Step(10 * time.Second)
	submit("pv-2")
	expectNone("once the Lease's time had passed")
	if s := d.Stats(); s.Queued != 1 {
		t.Errorf("Queued = %d while the Lease's time had passed, want 1", s.Queued)
	}
	lease.renew(fc.Now().Add(10 * time.Second))
	expect("pv-2")
	res.wait(t)
}

// A call that fails after the Lease's time has passed (its deadline came, or the call was refused)
// is no failed attempt: the task waits for a renewal and runs again, however few attempts it has.
func TestDispatchFailureAfterTheLeaseRanOutIsNoAttempt(t *testing.T) {
	fc := clocktesting.NewFakeClock(epoch)
	lease := newFakeLease(epoch.Add(10 * time.Second))
	d, _ := runDispatcher(t, Options{Clock: fc, Lease: lease, MaxAttempts: 1})
	res := newResults()
	calls := make(chan int, 4)
	release := make(chan struct{})
	n := 0
	d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Done: res.done("task"),
		Run: func(context.Context) error {
			n++
			calls <- n
			if n == 1 {
				<-release
				return errors.New("rpc error: code = DeadlineExceeded")
			}
			return nil
		}})
	<-calls
	// The leader is frozen past its Lease's time; its call fails once it runs again.
	fc.Step(11 * time.Second)
	close(release)
	select {
	case c := <-calls:
		t.Fatalf("call %d started before the Lease was renewed", c)
	case <-time.After(quiet):
	}
	poll.Eventually(t, settle, "the failed call to be queued again", poll.True(func() bool { s := d.Stats(); return s.Queued == 1 && s.InFlight == 0 }))

	lease.renew(fc.Now().Add(10 * time.Second))
	res.wait(t)
	if got := res.one(t, "task"); got.Err != nil || got.Attempts != 2 {
		t.Errorf("result %+v, want success on the second call, the first not counted as a failed attempt", got)
	}
}

// Tasks held back by the Lease end with ErrDispatcherStopped when the Dispatcher stops: the
// replica no longer leads, and another one takes the volumes on.
func TestDispatchStopsWithTasksHeldByTheLease(t *testing.T) {
	fc := clocktesting.NewFakeClock(epoch)
	lease := newFakeLease(time.Time{})
	d, stop := runDispatcher(t, Options{Clock: fc, Lease: lease})
	res := newResults()
	d.Submit(Task{Volume: "pv-1", Driver: "rbd", Node: "node-a", Trigger: scheduler.TriggerRestart, Done: res.done("task"),
		Run: func(context.Context) error { t.Error("a call started without the Lease"); return nil }})
	stop()
	res.wait(t)
	if got := res.one(t, "task"); !errors.Is(got.Err, ErrDispatcherStopped) || !errors.Is(got.Err, context.Canceled) || got.Attempts != 0 {
		t.Errorf("result %+v, want ErrDispatcherStopped without a call", got)
	}
}
