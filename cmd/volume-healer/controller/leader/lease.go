package leader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultMargin is the margin of a Lease whose Options set none.
const DefaultMargin = 2 * time.Second

// Options configure a Lease.
type Options struct {
	// Lock is the Lease lock that the leader elector takes, renews and releases through the
	// Lease. Required.
	Lock resourcelock.Interface
	// Margin is taken off the time the Lease is known to be held: calls end that long before
	// another replica could take the Lease over. It covers clocks that run at slightly different
	// rates, the network delay of a call's deadline on its way to the sidecar and the driver, and
	// the time they take to stop once it passes. Default DefaultMargin.
	Margin time.Duration
	// Clock tells time. Default: the real clock.
	Clock clock.Clock
}

// Lease is the leader election Lease as the controller's calls see it. It is the
// resourcelock.Interface to hand to the leader elector (it passes every request on to
// Options.Lock), and it bounds the calls that Guard lets start by what it learns from them.
// It is safe for concurrent use.
//
// A leader elector in one process leads at most once: after its leadership ended (End, a release,
// or the Lease found naming another holder) the Lease lets no call start again.
type Lease struct {
	lock   resourcelock.Interface
	margin time.Duration
	clock  clock.Clock

	// term is the parent of every call's context; endTerm cancels it when leadership ends.
	term    context.Context
	endTerm context.CancelFunc

	mu sync.Mutex
	// until is the time by which calls must have ended: when the last successful renewal was
	// sent, plus the Lease's duration, less the margin. Zero until the Lease is first taken.
	until time.Time
	// holder is the holder the Lease named when it was last read or written.
	holder string
	// ended is set once leadership ended.
	ended bool
	// changed is closed, and replaced, whenever until or ended changes.
	changed chan struct{}
	// calls counts the calls in flight; idle, when not nil, is closed when it drops to zero.
	calls int
	idle  chan struct{}
	// cutAt is when the last call that was cut short (cancelled, or past its deadline) returned:
	// the sidecar and the driver may still be stopping it for a moment.
	cutAt time.Time
}

var _ resourcelock.Interface = (*Lease)(nil)

// New returns a Lease that has not been taken yet: Guard refuses every call until the leader
// elector takes the Lease through it.
func New(opts Options) (*Lease, error) {
	if opts.Lock == nil {
		return nil, errors.New("leader: Options.Lock is required")
	}
	if opts.Margin < 0 {
		return nil, fmt.Errorf("leader: Options.Margin is %s; want 0 (default %s) or more", opts.Margin, DefaultMargin)
	}
	if opts.Margin == 0 {
		opts.Margin = DefaultMargin
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	term, endTerm := context.WithCancel(context.Background())
	return &Lease{
		lock:    opts.Lock,
		margin:  opts.Margin,
		clock:   opts.Clock,
		term:    term,
		endTerm: endTerm,
		changed: make(chan struct{}),
	}, nil
}

// Get reads the Lease. A Lease that names another holder while this replica counted on holding
// it ends this replica's leadership at once: its calls in flight are cancelled.
func (l *Lease) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.lock.Get(ctx)
	if err != nil {
		return rec, raw, err
	}
	l.mu.Lock()
	l.holder = rec.HolderIdentity
	lost := rec.HolderIdentity != l.lock.Identity() && !l.until.IsZero() && !l.ended
	l.mu.Unlock()
	if lost {
		klog.FromContext(ctx).Info("The Lease names another holder: calls to sidecars are cancelled and none starts any more",
			"lease", l.lock.Describe(), "holder", rec.HolderIdentity)
		l.stop()
	}
	return rec, raw, nil
}

// Create creates the Lease; when it names this replica, calls may run until the time Until tells.
func (l *Lease) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	sent := l.clock.Now()
	if err := l.lock.Create(ctx, ler); err != nil {
		return err
	}
	l.written(ctx, ler, sent)
	return nil
}

// Update writes the Lease. A write that names this replica takes or renews the Lease, and moves
// the time calls may run until. A write that names no holder releases the Lease: it first ends
// leadership (End) and waits until the calls in flight have returned and, for those cut short,
// the margin has passed, so that the sidecars and drivers have stopped them too; and it is not
// made once this replica no longer holds the Lease, since it would release another replica's.
func (l *Lease) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity != l.lock.Identity() {
		return l.release(ctx, ler)
	}
	sent := l.clock.Now()
	if err := l.lock.Update(ctx, ler); err != nil {
		return err
	}
	l.written(ctx, ler, sent)
	return nil
}

// written records a successful write of ler, sent at sent. Another replica that saw the write
// (after it reached the API server, so after sent) waits ler's duration on its own clock before
// it takes the Lease over; any replica that did not see it fails to take the Lease over, since the
// write changed the Lease's resource version. The time this replica is known to hold the Lease
// therefore runs to sent plus ler's duration; calls must end the margin before that.
func (l *Lease) written(ctx context.Context, ler resourcelock.LeaderElectionRecord, sent time.Time) {
	if ler.HolderIdentity != l.lock.Identity() {
		return
	}
	// Other replicas read the duration from the Lease, in whole seconds, not from their own
	// configuration: that is the duration that counts.
	until := sent.Add(time.Duration(ler.LeaseDurationSeconds)*time.Second - l.margin)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holder = ler.HolderIdentity
	if until.After(l.until) {
		l.until = until
		l.notifyLocked()
	}
	klog.FromContext(ctx).V(5).Info("Lease written: calls may run until", "lease", l.lock.Describe(), "until", until)
}

// release ends leadership, waits for the calls, and releases the Lease if this replica still
// holds it.
func (l *Lease) release(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if err := l.End(ctx); err != nil {
		return fmt.Errorf("lease %s not released: %w", l.lock.Describe(), err)
	}
	if err := l.settle(ctx); err != nil {
		return fmt.Errorf("lease %s not released: waiting for the sidecars to stop the calls cut short: %w", l.lock.Describe(), err)
	}
	l.mu.Lock()
	now, until, holder := l.clock.Now(), l.until, l.holder
	l.mu.Unlock()
	switch {
	case holder != l.lock.Identity():
		return fmt.Errorf("%w: lease %s not released: it names holder %q", ErrNotHeld, l.lock.Describe(), holder)
	case !now.Before(until):
		return fmt.Errorf("%w: lease %s not released: it was last renewed in time for calls until %s, %s ago, and may have passed to another replica",
			ErrNotHeld, l.lock.Describe(), until.Format(time.RFC3339Nano), now.Sub(until).Round(time.Millisecond))
	}
	return l.lock.Update(ctx, ler)
}

// settle waits until the margin has passed since the last call that was cut short returned.
func (l *Lease) settle(ctx context.Context) error {
	l.mu.Lock()
	cutAt := l.cutAt
	l.mu.Unlock()
	if cutAt.IsZero() {
		return nil
	}
	wait := cutAt.Add(l.margin).Sub(l.clock.Now())
	if wait <= 0 {
		return nil
	}
	klog.FromContext(ctx).V(2).Info("Waiting for the sidecars to stop the calls cut short before releasing the Lease", "lease", l.lock.Describe(), "wait", wait)
	t := l.clock.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RecordEvent records an Event about the Lease.
func (l *Lease) RecordEvent(s string) { l.lock.RecordEvent(s) }

// Identity is this replica's identity in the Lease.
func (l *Lease) Identity() string { return l.lock.Identity() }

// Describe names the Lease.
func (l *Lease) Describe() string { return l.lock.Describe() }

// Until returns the time by which every call must have ended, zero when no call may start
// (the Lease was never taken, or leadership ended), and a channel that is closed when that
// changes: at every renewal, and when leadership ends. Past that time no call may start either.
func (l *Lease) Until() (time.Time, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return time.Time{}, l.changed
	}
	return l.until, l.changed
}

// Guard starts a call. It returns the context the call must run under, a child of ctx that ends
// when the time the Lease is known to be held ends or when leadership ends, and the function to
// call once the call has returned. It refuses the call, with an error wrapping ErrNotHeld, when
// that time has passed or leadership has ended.
func (l *Lease) Guard(ctx context.Context) (context.Context, func(), error) {
	l.mu.Lock()
	now := l.clock.Now()
	if l.ended || !now.Before(l.until) {
		err := l.notHeldLocked(now)
		l.mu.Unlock()
		return nil, nil, err
	}
	l.calls++
	left := l.until.Sub(now)
	l.mu.Unlock()

	// A timeout rather than a deadline, so that a Clock other than the real one works too: the
	// deadline is a time on the real clock, and gRPC sends what is left of it with the call.
	callCtx, cancel := context.WithTimeout(ctx, left)
	stop := context.AfterFunc(l.term, cancel)
	var once sync.Once
	return callCtx, func() {
		once.Do(func() {
			stop()
			cut := callCtx.Err() != nil
			cancel()
			l.returned(cut)
		})
	}, nil
}

// notHeldLocked says why no call may start now.
func (l *Lease) notHeldLocked(now time.Time) error {
	switch {
	case l.ended:
		return fmt.Errorf("%w: leadership ended", ErrNotHeld)
	case l.until.IsZero():
		return fmt.Errorf("%w: it was never taken", ErrNotHeld)
	default:
		return fmt.Errorf("%w: it was last renewed in time for calls until %s, %s ago",
			ErrNotHeld, l.until.Format(time.RFC3339Nano), now.Sub(l.until).Round(time.Millisecond))
	}
}

// returned counts a call out; cut tells that it ended before it was answered.
func (l *Lease) returned(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls--
	if cut {
		l.cutAt = l.clock.Now()
	}
	if l.calls == 0 && l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
}

// End ends this replica's leadership for its calls: no call starts any more, the calls in flight
// are cancelled, and End waits until they have returned, or until ctx ends. It may be called more
// than once.
func (l *Lease) End(ctx context.Context) error {
	l.stop()
	l.mu.Lock()
	if l.calls == 0 {
		l.mu.Unlock()
		return nil
	}
	if l.idle == nil {
		l.idle = make(chan struct{})
	}
	idle, n := l.idle, l.calls
	l.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Waiting for the cancelled calls to sidecars to return", "calls", n)
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		l.mu.Lock()
		n = l.calls
		l.mu.Unlock()
		return fmt.Errorf("calls to sidecars had not all returned after they were cancelled, %d still in flight: %w", n, ctx.Err())
	}
}

// stop marks leadership ended and cancels the calls in flight.
func (l *Lease) stop() {
	l.mu.Lock()
	if !l.ended {
		l.ended = true
		l.notifyLocked()
	}
	l.mu.Unlock()
	l.endTerm()
}

// notifyLocked wakes whoever waits on the channel Until returned.
func (l *Lease) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}
