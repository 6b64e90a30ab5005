package leader_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/cmd/volume-healer/controller/leader"
)

const self = "replica-a"

// fakeLock is the Lease object in the API server, as a lock of replica self sees it.
type fakeLock struct {
	mu     sync.Mutex
	record resourcelock.LeaderElectionRecord
	// err fails the next request.
	err error
	// during runs while a write is in flight, before it lands.
	during func()
	writes []resourcelock.LeaderElectionRecord
}

func (f *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.err; err != nil {
		f.err = nil
		return nil, nil, err
	}
	rec := f.record
	return &rec, []byte(rec.HolderIdentity), nil
}

func (f *fakeLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return f.Update(ctx, ler)
}

func (f *fakeLock) Update(_ context.Context, ler resourcelock.LeaderElectionRecord) error {
	f.mu.Lock()
	during := f.during
	f.mu.Unlock()
	if during != nil {
		during()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.err; err != nil {
		f.err = nil
		return err
	}
	f.record = ler
	f.writes = append(f.writes, ler)
	return nil
}

func (f *fakeLock) RecordEvent(string)    {}
func (f *fakeLock) Identity() string      { return self }
func (f *fakeLock) Describe() string      { return "volume-healer/volume-healer" }
func (f *fakeLock) setHolder(name string) { f.mu.Lock(); f.record.HolderIdentity = name; f.mu.Unlock() }
func (f *fakeLock) written() []resourcelock.LeaderElectionRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]resourcelock.LeaderElectionRecord(nil), f.writes...)
}

// renewal is the record the leader elector writes to take or renew a Lease of the given duration.
func renewal(seconds int) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: self, LeaseDurationSeconds: seconds}
}

// release is the record the leader elector writes to release the Lease.
var release = resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1}

func newLease(t *testing.T, margin time.Duration) (*leader.Lease, *fakeLock, *clocktesting.FakeClock) {
	t.Helper()
	lock := &fakeLock{}
	clk := clocktesting.NewFakeClock(time.Now())
	l, err := leader.New(leader.Options{Lock: lock, Margin: margin, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return l, lock, clk
}

// left is how long ctx has until its deadline, on the real clock.
func left(t *testing.T, ctx context.Context) time.Duration {
	t.Helper()
	deadline, ok := ctx.Deadline()
	if !ok {
		t.Fatal("the call's context has no deadline")
	}
	return time.Until(deadline)
}

// closeTo fails unless got is want, give or take the time the test itself takes.
func closeTo(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	if got > want || got < want-time.Second {
		t.Errorf("%s = %s, want %s", what, got, want)
	}
}

func TestNoCallBeforeTheLeaseIsTaken(t *testing.T) {
	l, _, _ := newLease(t, time.Second)
	if _, _, err := l.Guard(t.Context()); !errors.Is(err, leader.ErrNotHeld) {
		t.Errorf("Guard before the Lease was taken: %v, want ErrNotHeld", err)
	}
	if until, _ := l.Until(); !until.IsZero() {
		t.Errorf("Until before the Lease was taken = %s, want zero", until)
	}
}

// A call's deadline is the time the Lease is known held: when the last renewal was sent, plus the
// duration written in the Lease, less the margin. Past it no call starts.
func TestCallDeadlineEndsBeforeTheLeaseCouldPass(t *testing.T) {
	tests := map[string]struct {
		seconds  int
		margin   time.Duration
		after    time.Duration
		wantLeft time.Duration
	}{
		"right after the renewal":       {seconds: 15, margin: 2 * time.Second, after: 0, wantLeft: 13 * time.Second},
		"later in the renew period":     {seconds: 15, margin: 2 * time.Second, after: 5 * time.Second, wantLeft: 8 * time.Second},
		"the Lease's own duration":      {seconds: 60, margin: 2 * time.Second, after: 10 * time.Second, wantLeft: 48 * time.Second},
		"a margin of its own":           {seconds: 15, margin: 5 * time.Second, after: 0, wantLeft: 10 * time.Second},
		"just before the time runs out": {seconds: 15, margin: 2 * time.Second, after: 12900 * time.Millisecond, wantLeft: 100 * time.Millisecond},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			l, _, clk := newLease(t, tt.margin)
			renewedAt := clk.Now()
			if err := l.Update(t.Context(), renewal(tt.seconds)); err != nil {
				t.Fatal(err)
			}
			until, _ := l.Until()
			if want := renewedAt.Add(time.Duration(tt.seconds)*time.Second - tt.margin); !until.Equal(want) {
				t.Errorf("Until = %s after the renewal, want %s", until.Sub(renewedAt), want.Sub(renewedAt))
			}
			clk.Step(tt.after)
			ctx, done, err := l.Guard(t.Context())
			if err != nil {
				t.Fatalf("Guard %s after the renewal: %v", tt.after, err)
			}
			defer done()
			closeTo(t, "the call's time", left(t, ctx), tt.wantLeft)

			clk.Step(tt.wantLeft)
			if _, _, err := l.Guard(t.Context()); !errors.Is(err, leader.ErrNotHeld) {
				t.Errorf("Guard once the time the Lease is known held has passed: %v, want ErrNotHeld", err)
			}
		})
	}
}

// A call keeps its own shorter deadline.
func TestCallKeepsItsOwnShorterDeadline(t *testing.T) {
	l, _, _ := newLease(t, time.Second)
	if err := l.Update(t.Context(), renewal(60)); err != nil {
		t.Fatal(err)
	}
	parent, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	ctx, done, err := l.Guard(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	closeTo(t, "the call's time", left(t, ctx), 3*time.Second)
}

// The time counts from when the renewal was sent, not from when its answer came back: the other
// replicas may have seen it at any moment in between.
func TestSlowRenewalCountsFromItsSending(t *testing.T) {
	l, lock, clk := newLease(t, time.Second)
	sentAt := clk.Now()
	lock.during = func() { clk.Step(4 * time.Second) }
	if err := l.Update(t.Context(), renewal(15)); err != nil {
		t.Fatal(err)
	}
	until, _ := l.Until()
	if want := sentAt.Add(14 * time.Second); !until.Equal(want) {
		t.Errorf("Until = %s after the send, want 14s", until.Sub(sentAt))
	}
}

// Each renewal moves the time on and wakes whoever waits on Until; a failed one does not.
func TestRenewalsMoveTheTimeOn(t *testing.T) {
	l, lock, clk := newLease(t, 2*time.Second)
	if err := l.Update(t.Context(), renewal(15)); err != nil {
		t.Fatal(err)
	}
	first, changed := l.Until()

	clk.Step(2 * time.Second)
	lock.err = errors.New("the API server did not answer")
	if err := l.Update(t.Context(), renewal(15)); err == nil {
		t.Fatal("the failed renewal succeeded")
	}
	if until, _ := l.Until(); !until.Equal(first) {
		t.Errorf("a failed renewal moved Until by %s", until.Sub(first))
	}
	select {
	case <-changed:
		t.Error("a failed renewal woke the waiters on Until")
	default:
	}

	clk.Step(2 * time.Second)
	if err := l.Update(t.Context(), renewal(15)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("a renewal did not wake the waiters on Until")
	}
	if until, _ := l.Until(); until.Sub(first) != 4*time.Second {
		t.Errorf("a renewal 4s later moved Until by %s", until.Sub(first))
	}
}

// A Lease no longer than the margin leaves no time for any call.
func TestLeaseShorterThanTheMargin(t *testing.T) {
	l, _, _ := newLease(t, 2*time.Second)
	if err := l.Update(t.Context(), renewal(1)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Guard(t.Context()); !errors.Is(err, leader.ErrNotHeld) {
		t.Errorf("Guard with a 1s Lease and a 2s margin: %v, want ErrNotHeld", err)
	}
}

// The call of a replica frozen past the time it knew it held the Lease ends at that time (the
// sidecar and driver see the same deadline), and once the replica runs again it starts none.
func TestNoCallAfterTheTimeRanOut(t *testing.T) {
	l, _, clk := newLease(t, 0)
	if err := l.Update(t.Context(), renewal(3)); err != nil {
		t.Fatal(err)
	}
	// With the default margin of 2s, a call has 1s.
	ctx, done, err := l.Guard(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "the call's time", left(t, ctx), time.Second)
	select {
	case <-ctx.Done():
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Errorf("the call's context ended with %v, want its deadline", ctx.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call's context did not end at the time the Lease is known held")
	}
	done()
	clk.Step(time.Hour)
	if _, _, err := l.Guard(t.Context()); !errors.Is(err, leader.ErrNotHeld) {
		t.Errorf("Guard an hour later: %v, want ErrNotHeld", err)
	} else {
		t.Log(err)
	}
}

// End cancels the calls in flight at once, waits for them to return, and lets no call start.
func TestEndCancelsCallsAndWaitsForThem(t *testing.T) {
	l, _, _ := newLease(t, time.Second)
	if err := l.Update(t.Context(), renewal(60)); err != nil {
		t.Fatal(err)
	}
	_, changed := l.Until()
	ctx, done, err := l.Guard(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- l.End(t.Context()) }()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("End did not cancel the call in flight")
	}
	select {
	case err := <-ended:
		t.Fatalf("End returned (%v) before the call did", err)
	case <-time.After(50 * time.Millisecond):
	}
	done()
	if err := <-ended; err != nil {
		t.Errorf("End: %v", err)
	}
	if _, _, err := l.Guard(t.Context()); !errors.Is(err, leader.ErrNotHeld) {
		t.Errorf("Guard after End: %v, want ErrNotHeld", err)
	}
	if until, _ := l.Until(); !until.IsZero() {
		t.Errorf("Until after End = %s, want zero", until)
	}
	select {
	case <-changed:
	default:
		t.Error("End did not wake the waiters on Until")
	}
	if err := l.End(t.Context()); err != nil {
		t.Errorf("a second End: %v", err)
	}
}

// End gives up on calls that do not return when its context ends, and says how many.
func TestEndIsBounded(t *testing.T) {
	l, _, _ := newLease(t, time.Second)
	if err := l.Update(t.Context(), renewal(60)); err != nil {
		t.Fatal(err)
	}
	_, done, err := l.Guard(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := l.End(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("End with a call that never returns: %v, want its context's deadline", err)
	} else {
		t.Log(err)
	}
}

// The release of the Lease waits for the calls in flight, cancelled first, and then for the
// margin, so that the sidecars and drivers have stopped them before another replica may lead.
func TestReleaseWaitsForTheCalls(t *testing.T) {
	l, lock, clk := newLease(t, 2*time.Second)
	if err := l.Update(t.Context(), renewal(60)); err != nil {
		t.Fatal(err)
	}
	lock.setHolder(self)
	ctx, done, err := l.Guard(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- l.Update(t.Context(), release) }()
	<-ctx.Done()
	if n := len(lock.written()); n != 1 {
		t.Fatalf("the Lease was written %d times before the call returned, want once (the renewal)", n)
	}
	done()
	// The release waits 2s after the call returned.
	for !clk.HasWaiters() {
		select {
		case err := <-released:
			t.Fatalf("the release returned (%v) without waiting for the margin", err)
		case <-time.After(time.Millisecond):
		}
	}
	if n := len(lock.written()); n != 1 {
		t.Fatalf("the Lease was released before the margin passed")
	}
	clk.Step(2 * time.Second)
	if err := <-released; err != nil {
		t.Fatalf("release: %v", err)
	}
	w := lock.written()
	if len(w) != 2 || w[1].HolderIdentity != "" {
		t.Errorf("writes = %+v, want the renewal and then the release", w)
	}
}

// A replica that was frozen or cut off past the time it knew it held the Lease does not release
// it: by then it may be another replica's.
func TestNoReleaseOfALeaseNoLongerHeld(t *testing.T) {
	tests := map[string]func(*fakeLock, *clocktesting.FakeClock){
		"another replica holds it": func(lock *fakeLock, _ *clocktesting.FakeClock) {
			lock.setHolder("replica-b")
		},
		"the time ran out": func(lock *fakeLock, clk *clocktesting.FakeClock) {
			lock.setHolder(self)
			clk.Step(time.Minute)
		},
	}
	for name, after := range tests {
		t.Run(name, func(t *testing.T) {
			l, lock, clk := newLease(t, 2*time.Second)
			if err := l.Update(t.Context(), renewal(15)); err != nil {
				t.Fatal(err)
			}
			after(lock, clk)
			// The leader elector reads the Lease before it releases it.
			if _, _, err := l.Get(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := l.Update(t.Context(), release); !errors.Is(err, leader.ErrNotHeld) {
				t.Errorf("release: %v, want ErrNotHeld", err)
			} else {
				t.Log(err)
			}
			if w := lock.written(); len(w) != 1 {
				t.Errorf("the Lease was written %d times, want once (the renewal): %+v", len(w), w)
			}
		})
	}
}

// A Lease found naming another holder while this replica counts on it ends its calls at once.
func TestLeaseTakenByAnotherEndsCalls(t *testing.T) {
	l, lock, _ := newLease(t, 2*time.Second)
	if err := l.Update(t.Context(), renewal(15)); err != nil {
		t.Fatal(err)
	}
	ctx, done, err := l.Guard(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	lock.setHolder("replica-b")
	if _, _, err := l.Get(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the call went on after the Lease named another holder")
	}
	if _, _, err := l.Guard(t.Context()); !errors.Is(err, leader.ErrNotHeld) {
		t.Errorf("Guard: %v, want ErrNotHeld", err)
	}
}

// A standby reads the Lease held by another replica all the time; that ends nothing, and it may
// still take the Lease later.
func TestStandbyReadsAnotherHolder(t *testing.T) {
	l, lock, _ := newLease(t, 2*time.Second)
	lock.setHolder("replica-b")
	if _, _, err := l.Get(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := l.Update(t.Context(), renewal(15)); err != nil {
		t.Fatal(err)
	}
	_, done, err := l.Guard(t.Context())
	if err != nil {
		t.Fatalf("Guard after taking the Lease over: %v", err)
	}
	done()
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := leader.New(leader.Options{}); err == nil {
		t.Error("New without a lock succeeded")
	}
	if _, err := leader.New(leader.Options{Lock: &fakeLock{}, Margin: -time.Second}); err == nil {
		t.Error("New with a negative margin succeeded")
	}
}
