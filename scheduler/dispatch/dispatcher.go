package dispatch

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Stats is a snapshot of a Dispatcher, for status output, tests and benchmarks.
type Stats struct {
	// Queued counts tasks not yet started: waiting for NotBefore or backoff, for a budget, or for
	// the call in flight on their volume.
	Queued int
	// InFlight counts calls of Run in progress.
	InFlight int
	// Started counts calls of Run so far, retries included.
	Started int
	// TrackedVolumes counts volumes the Dispatcher keeps state for: queued, in flight or backing off.
	TrackedVolumes int
	// MaxInFlight is the most calls ever in flight at once.
	MaxInFlight int
	// MaxInFlightPerDriver is the most calls ever in flight at once to any one driver.
	MaxInFlightPerDriver int
	// MaxInFlightPerNode is the most calls ever in flight at once to any one node.
	MaxInFlightPerNode int
	// MaxInFlightPerVolume is the most calls ever in flight at once on any one volume.
	MaxInFlightPerVolume int
}

// Dispatcher runs volumes' tasks under budgets on calls in flight (global, per driver, per node),
// one call per volume at a time, restart sweeps first, with per-volume backoff after failures and a
// timeout on every call, so that a DaemonSet rollout that restarts every node plugin at once is
// worked off at the pace the budgets allow instead of becoming a storm of heals.
//
// Tasks start in this order: restart before manual before schedule, then higher Priority first;
// between equals the (driver, node) pair whose node has the most work queued goes first, with the
// pairs that waited longest gaining on it (see laneLess), and on one pair the task submitted first
// goes first. A task whose driver or node has no budget left never holds up the others.
//
// Queued tasks wait in lanes, one per (driver, node), each a heap in dispatch order; each driver
// keeps a heap of its lanes. Picking the next task looks at the best lane of each driver with
// budget left, so the cost of a dispatch does not grow with the queue, and a lane whose node is
// full is set aside until that node frees a slot instead of blocking the others.
type Dispatcher struct {
	opts    Options
	metrics *Metrics
	// queueWeight and waitWeight rank lanes of equal class (see rankLocked): a queued task of the
	// lane's node weighs queueWeight, a call started elsewhere while the lane waits waitWeight.
	queueWeight, waitWeight int64
	// wake tells the timer loop that the earliest waiting task changed.
	wake chan struct{}
	// calls counts the calls started and not yet settled, so that Start can wait for them.
	calls sync.WaitGroup

	// mu guards everything below.
	mu sync.Mutex
	// started is set by Start, running while it dispatches, stopped once it has ended the queue.
	started, running, stopped bool
	log                       klog.Logger
	// callCtx is the parent of every call's ctx; cancelCalls ends it after the shutdown grace.
	callCtx     context.Context
	cancelCalls context.CancelFunc
	// seq numbers submissions, for first-in first-out among equals.
	seq     uint64
	volumes map[string]*volumeState
	// pruneAt is the size of volumes at which settled volumes are next swept out.
	pruneAt    int
	drivers    map[string]*driverState
	driverList []*driverState
	nodes      map[string]*nodeState
	lanes      map[laneKey]*lane
	// waiting holds the jobs whose NotBefore or backoff lies ahead, earliest first.
	waiting          jobHeap
	queued, inFlight int
	stats            Stats
}

// pruneFloor is the number of tracked volumes below which settled backoff state is not swept out.
const pruneFloor = 1024

// New returns a Dispatcher with an empty queue. Tasks may be submitted before Start;
// they start when it runs.
func New(opts Options) (*Dispatcher, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if m := opts.Metrics; m != nil {
		m.budget.WithLabelValues("global").Set(float64(opts.Global))
		m.budget.WithLabelValues("driver").Set(float64(opts.PerDriver))
		m.budget.WithLabelValues("node").Set(float64(opts.PerNode))
	}
	return &Dispatcher{
		opts:    opts,
		metrics: opts.Metrics,
		// A round is the calls a lane competes for; a lane can hold at most the slots of its node.
		queueWeight: int64(min(opts.Global, opts.PerDriver)),
		waitWeight:  int64(min(opts.Global, opts.PerDriver, opts.PerNode)),
		wake:        make(chan struct{}, 1),
		log:         klog.Background(),
		volumes:     map[string]*volumeState{},
		pruneAt:     pruneFloor,
		drivers:     map[string]*driverState{},
		nodes:       map[string]*nodeState{},
		lanes:       map[laneKey]*lane{},
		waiting:     jobHeap{less: waitsLess},
	}, nil
}

// errStopped is the result of tasks cut short by the Dispatcher stopping.
var errStopped = fmt.Errorf("%w: %w", ErrDispatcherStopped, context.Canceled)

// Submit queues tasks. A sweep submits its tasks in one call: they are queued under one lock
// and dispatched in order among themselves.
//
// A task for a volume that already has one queued is merged into it: the merged task runs the Run
// of the one with the higher trigger class (then priority; the queued one on a tie), starts no
// later than the earlier NotBefore, and reports its one result to both Done callbacks, with
// Result.Coalesced set for the task whose Run was dropped. A task for a volume with a call in
// flight runs after that call ends (merged with the call's retry if there is one). A task without
// a Volume or a Run ends at once with ErrInvalidTask, a task submitted after the Dispatcher
// stopped with ErrDispatcherStopped.
func (d *Dispatcher) Submit(tasks ...Task) {
	type rejected struct {
		done func(Result)
		err  error
	}
	var rejects []rejected
	d.mu.Lock()
	now := d.opts.Clock.Now()
	for _, t := range tasks {
		switch {
		case t.Volume == "" || t.Run == nil:
			rejects = append(rejects, rejected{t.Done, fmt.Errorf("%w: a task needs a Volume and a Run (volume %q)", ErrInvalidTask, t.Volume)})
		case d.stopped:
			rejects = append(rejects, rejected{t.Done, errStopped})
		default:
			d.queueLocked(t, now)
		}
	}
	started := d.dispatchLocked(now)
	d.metrics.setQueued(d.queued)
	d.mu.Unlock()

	d.launch(started)
	for _, r := range rejects {
		if r.done != nil {
			d.report(r.done, Result{Err: r.err})
		}
	}
}

// queueLocked queues one task, merging it into its volume's queued job if there is one.
func (d *Dispatcher) queueLocked(t Task, now time.Time) {
	d.seq++
	vol := d.volumes[t.Volume]
	if vol == nil {
		d.pruneLocked(now)
		vol = &volumeState{name: t.Volume}
		d.volumes[t.Volume] = vol
	}
	n := newJob(t, vol, d.seq)
	if q := vol.queued; q != nil {
		d.unlinkLocked(q)
		q.merge(n)
		d.placeLocked(q, vol, now)
		return
	}
	vol.queued = n
	d.queued++
	d.placeLocked(n, vol, now)
}

// Start dispatches tasks until ctx ends. Then it stops starting calls, gives the calls in flight
// ShutdownGrace to finish before cancelling their ctx, waits for them, and ends the tasks still
// queued with ErrDispatcherStopped. A Dispatcher starts once.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	if d.started {
		d.mu.Unlock()
		return ErrDispatcherStarted
	}
	d.started, d.running = true, true
	d.log = klog.FromContext(ctx)
	// Calls outlive ctx by the shutdown grace, so their ctx keeps ctx's values but not its end.
	d.callCtx, d.cancelCalls = context.WithCancel(context.WithoutCancel(ctx))
	d.mu.Unlock()

	d.loop(ctx)
	d.stop()
	return nil
}

// loop starts tasks whose NotBefore or backoff has passed; everything else is dispatched by Submit
// and by calls that end, as it happens.
func (d *Dispatcher) loop(ctx context.Context) {
	var timer clock.Timer
	var timerAt time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for ctx.Err() == nil {
		// Taken before dispatching, so that a renewal of the Lease from now on wakes the loop.
		var leaseChanged <-chan struct{}
		if d.opts.Lease != nil {
			_, leaseChanged = d.opts.Lease.Until()
		}
		d.mu.Lock()
		now := d.opts.Clock.Now()
		d.promoteLocked(now)
		started := d.dispatchLocked(now)
		var next time.Time
		if len(d.waiting.items) > 0 {
			next = d.waiting.items[0].eligibleAt
		}
		d.metrics.setQueued(d.queued)
		d.mu.Unlock()
		d.launch(started)

		if !next.Equal(timerAt) {
			if timer != nil {
				timer.Stop()
				timer = nil
			}
			timerAt = next
			if !next.IsZero() {
				timer = d.opts.Clock.NewTimer(next.Sub(now))
			}
		}
		var fire <-chan time.Time
		if timer != nil {
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-leaseChanged:
		case <-fire:
			timer, timerAt = nil, time.Time{}
		}
	}
}

// stop carries out the shutdown order: no new calls, grace for the calls in flight, cancel them,
// wait for them, then end the queued tasks.
func (d *Dispatcher) stop() {
	d.mu.Lock()
	d.running = false
	busy := d.inFlight
	d.mu.Unlock()

	if busy > 0 {
		d.log.V(2).Info("Waiting for calls in flight to finish", "calls", busy, "grace", d.opts.ShutdownGrace)
		idle := make(chan struct{})
		go func() {
			d.calls.Wait()
			close(idle)
		}()
		grace := d.opts.Clock.NewTimer(d.opts.ShutdownGrace)
		select {
		case <-idle:
		case <-grace.C():
			d.mu.Lock()
			busy = d.inFlight
			d.mu.Unlock()
			d.log.Info("Cancelling calls still in flight after the shutdown grace", "calls", busy, "grace", d.opts.ShutdownGrace)
			d.cancelCalls()
			<-idle
		}
		grace.Stop()
	}
	d.cancelCalls()
	// A call that ended may still be running its Done callbacks.
	d.calls.Wait()

	d.mu.Lock()
	d.stopped = true
	var cancelled []waiter
	for _, vol := range d.volumes {
		if vol.queued != nil {
			cancelled = append(cancelled, vol.queued.waiters...)
		}
	}
	d.volumes = map[string]*volumeState{}
	d.drivers = map[string]*driverState{}
	d.driverList = nil
	d.nodes = map[string]*nodeState{}
	d.lanes = map[laneKey]*lane{}
	d.waiting.items = nil
	d.queued = 0
	d.metrics.setQueued(0)
	d.mu.Unlock()

	if len(cancelled) > 0 {
		d.log.V(2).Info("Cancelled queued tasks", "tasks", len(cancelled))
	}
	for _, w := range cancelled {
		d.report(w.done, Result{Err: errStopped, Coalesced: w.coalesced})
	}
}

// Stats returns a snapshot of the queue, the calls in flight and the most ever in flight.
func (d *Dispatcher) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Queued = d.queued
	s.InFlight = d.inFlight
	s.TrackedVolumes = len(d.volumes)
	return s
}

// call is one started call of a task's Run, with what the goroutine needs outside the lock.
type call struct {
	j       *job
	ctx     context.Context
	run     func(context.Context) error
	timeout time.Duration
}

// launch makes each call on a goroutine of its own.
func (d *Dispatcher) launch(calls []call) {
	for _, c := range calls {
		go d.run(c)
	}
}

// run makes c and then, on the same goroutine, the first of the calls that the end of c started:
// during a storm a call ends and another starts all the time, and reusing the goroutine spares a
// goroutine start and its stack growth each time.
func (d *Dispatcher) run(c call) {
	for {
		next := d.call(c)
		if len(next) == 0 {
			return
		}
		d.launch(next[1:])
		c = next[0]
	}
}

// call makes one call of a task's Run and settles it; it returns the calls started meanwhile.
func (d *Dispatcher) call(c call) []call {
	defer d.calls.Done()
	ctx, cancel := context.WithTimeout(c.ctx, c.timeout)
	err := d.protect(ctx, c.run)
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
	cancel()
	if timedOut && err != nil && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w after %s: %w", context.DeadlineExceeded, c.timeout, err)
	}
	return d.finish(c.j, err, timedOut)
}

// protect calls run, and turns a panic into a permanent failure of that task alone: one bad object
// must not take the controller down, since every restart of it would repeat every pending sweep.
func (d *Dispatcher) protect(ctx context.Context, run func(context.Context) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			d.metrics.panicked()
			d.log.Error(nil, "Task panicked; it fails, the others go on", "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: the task panicked: %v", ErrPermanent, r)
		}
	}()
	return run(ctx)
}

// report hands r to a task's Done, and survives a Done that panics.
func (d *Dispatcher) report(done func(Result), r Result) {
	defer func() {
		if p := recover(); p != nil {
			d.metrics.panicked()
			d.log.Error(nil, "A task's Done panicked", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	done(r)
}

// Retry reasons, as they appear in the retries metric.
const (
	retryBusy    = "busy"
	retryFailed  = "failed"
	retryTimeout = "timeout"
)

// finish settles a call that returned: frees its budget, decides between done and retry, and
// starts what the freed budget allows; the caller makes those calls.
func (d *Dispatcher) finish(j *job, err error, timedOut bool) []call {
	d.mu.Lock()
	now := d.opts.Clock.Now()
	vol := j.vol
	d.releaseLocked(j, vol)

	final := true
	result := err
	switch {
	case err == nil:
		vol.failures, vol.retryAt = 0, time.Time{}
	case errors.Is(err, ErrPermanent):
	case !d.running:
		result = fmt.Errorf("%w (not retried: %w)", err, errStopped)
	case !d.leaseHeld(now):
		// The Lease ran out during the call, which may have failed for that alone (its deadline
		// came, or it was refused): that is no failed attempt on the volume.
		final = false
		d.log.V(2).Info("Call failed after the Lease ran out; queued until it is renewed", "pv", j.task.Volume, "driver", j.task.Driver, "node", j.task.Node, "err", err)
	case errors.Is(err, ErrRetryLater):
		j.busy++
		vol.retryAt, vol.backoffFrom = now.Add(d.opts.BackoffBase), j.startedAt
		if j.busy > d.opts.MaxBusyRetries {
			result = fmt.Errorf("%w after %d busy replies: %w", ErrGaveUp, j.busy, err)
		} else {
			final = false
			d.metrics.retried(retryBusy)
		}
	default:
		j.failed++
		vol.failures++
		vol.retryAt, vol.backoffFrom = now.Add(d.backoff(vol.failures)), j.startedAt
		if j.failed >= d.opts.MaxAttempts {
			result = fmt.Errorf("%w after %d failed attempts: %w", ErrGaveUp, j.failed, err)
		} else {
			final = false
			// A call's own deadline (shorter than the task's) counts as a timeout too.
			if timedOut || errors.Is(err, context.DeadlineExceeded) {
				d.metrics.retried(retryTimeout)
			} else {
				d.metrics.retried(retryFailed)
			}
		}
	}

	var waiters []waiter
	attempts := j.attempts
	if final {
		waiters = j.waiters
		if errors.Is(result, ErrGaveUp) {
			d.metrics.gaveUp()
			d.log.V(2).Info("Gave up on volume task", "pv", j.task.Volume, "driver", j.task.Driver, "node", j.task.Node,
				"trigger", j.task.Trigger, "attempts", j.attempts, "retryAt", vol.retryAt, "err", err)
		}
		if p := vol.queued; p != nil {
			d.placeLocked(p, vol, now)
		} else {
			d.forgetIfSettledLocked(vol, now)
		}
	} else {
		// A task submitted during the call joins the retry rather than making a second call.
		if p := vol.queued; p != nil {
			j.merge(p)
			d.queued--
		}
		vol.queued = j
		d.queued++
		d.placeLocked(j, vol, now)
	}
	started := d.dispatchLocked(now)
	d.metrics.setQueued(d.queued)
	d.mu.Unlock()

	for _, w := range waiters {
		d.report(w.done, Result{Err: result, Attempts: attempts, Coalesced: w.coalesced})
	}
	return started
}

// backoff is the wait after a volume's failures-th consecutive failure: base * 2^(failures-1),
// capped at BackoffMax: the steps of a wait.Backoff, taken until the cap.
func (d *Dispatcher) backoff(failures int) time.Duration {
	b := wait.Backoff{Duration: d.opts.BackoffBase, Factor: 2, Cap: d.opts.BackoffMax, Steps: math.MaxInt}
	next := b.Step()
	for i := 1; i < failures && next < d.opts.BackoffMax; i++ {
		next = b.Step()
	}
	return min(next, d.opts.BackoffMax)
}

// placeLocked puts a queued job where it waits: behind its volume's call in flight, in the
// timer heap until NotBefore and the volume's backoff have passed, or in its lane.
func (d *Dispatcher) placeLocked(j *job, vol *volumeState, now time.Time) {
	if vol.inFlight > 0 {
		j.where = jobParked
		return
	}
	if !vol.retryAt.IsZero() && vol.backoffFrom.Before(j.task.CallsSince) {
		// The failures went to a node plugin that has been replaced since: they say nothing of
		// the new one, which the task calls at once.
		vol.failures, vol.retryAt, vol.backoffFrom = 0, time.Time{}, time.Time{}
	}
	at := j.task.NotBefore
	if vol.retryAt.After(at) {
		at = vol.retryAt
	}
	j.eligibleAt = at
	if at.After(now) {
		j.where = jobWaiting
		heap.Push(&d.waiting, j)
		if d.waiting.items[0] == j {
			select {
			case d.wake <- struct{}{}:
			default:
			}
		}
		return
	}
	d.pushReadyLocked(j, now)
}

// unlinkLocked takes a queued job out of the heap it is in, so that it can be changed and placed
// again.
func (d *Dispatcher) unlinkLocked(j *job) {
	switch j.where {
	case jobWaiting:
		heap.Remove(&d.waiting, j.index)
	case jobReady:
		l := j.lane
		heap.Remove(&l.jobs, j.index)
		j.lane = nil
		d.laneChangedLocked(l)
	}
	j.where = jobParked
}

// promoteLocked moves the jobs whose time has come from the timer heap to their lanes.
func (d *Dispatcher) promoteLocked(now time.Time) {
	for len(d.waiting.items) > 0 && !d.waiting.items[0].eligibleAt.After(now) {
		j := heap.Pop(&d.waiting).(*job)
		d.pushReadyLocked(j, j.eligibleAt)
	}
}

// pushReadyLocked queues a job that may start as soon as budgets allow; since is when it became
// eligible, the start of its budget wait.
func (d *Dispatcher) pushReadyLocked(j *job, since time.Time) {
	l := d.laneLocked(j.task.Driver, j.task.Node)
	j.where = jobReady
	j.readyAt = since
	j.lane = l
	heap.Push(&l.jobs, j)
	d.laneChangedLocked(l)
}

// Where a queued job is.
const (
	jobParked  = iota // behind its volume's call in flight, or being changed
	jobWaiting        // in the timer heap
	jobReady          // in its lane
	jobRunning        // its Run is being called
)
