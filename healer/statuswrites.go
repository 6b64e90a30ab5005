package healer

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// maxStatusWriters is how many status annotations statusWrites patches at once.
const maxStatusWriters = 8

// statusWrites patches the claims' status annotations beside the volume tasks instead of inside
// them: a task holds a place in the node's, the driver's and the global concurrency budget, and
// an API request made in it, 20-30 ms on a busy control plane and seconds on an overloaded one,
// would hold back the next volume's probe and heal for nothing the node plugin does. The writes
// of one claim are made one after another, in the order they were asked for, and a value asked
// for while an earlier one waits replaces it (the annotation holds the volume's latest status
// only), so a claim ends with the last status asked for. What must follow a claim's status (its
// Events: an operator who reads one finds the status it speaks of) runs once the status asked for
// before it is written (then). At most maxStatusWriters writes run at once, in goroutines that
// end when nothing waits; what waits is one entry per claim.
type statusWrites struct {
	// patch writes value (nil: removes the annotation) onto the claim.
	patch func(ctx context.Context, claim types.NamespacedName, value *string)
	// guard, when set, runs f and recovers its panic: a write or an Event that panics is lost,
	// the claim's later writes and the sweeps that wait for them go on.
	guard func(ctx context.Context, f func())

	mu sync.Mutex
	// next is each claim's value to write next; queue the claims with a next value and no
	// write in flight, oldest first; busy the claims' writes in flight.
	next    map[types.NamespacedName]*statusWrite
	queue   []types.NamespacedName
	busy    map[types.NamespacedName]*statusWrite
	writers int
}

// statusWrite is a claim's status to write, with what waits for it.
type statusWrite struct {
	ctx   context.Context
	value *string
	// done are the sweeps' task counts that wait for this write, or for one it replaced.
	done []*sync.WaitGroup
	// then runs after the write, in order: what was asked for after this value or one it
	// replaced.
	then []func()
}

// add asks for value to be written onto claim, with ctx (the sweep's: a write that has not
// started when it ends is given up with it); done, when not nil, counts the write until it is
// made or replaced by a later one, so that a sweep ends with its statuses written.
func (w *statusWrites) add(ctx context.Context, claim types.NamespacedName, value *string, done *sync.WaitGroup) {
	if done != nil {
		done.Add(1)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.next[claim]; ok {
		e.ctx, e.value = ctx, value
		if done != nil {
			e.done = append(e.done, done)
		}
		return
	}
	if w.next == nil {
		w.next, w.busy = map[types.NamespacedName]*statusWrite{}, map[types.NamespacedName]*statusWrite{}
	}
	e := &statusWrite{ctx: ctx, value: value}
	if done != nil {
		e.done = []*sync.WaitGroup{done}
	}
	w.next[claim] = e
	if w.busy[claim] == nil {
		w.queue = append(w.queue, claim)
	}
	if w.writers < maxStatusWriters {
		w.writers++
		go w.work()
	}
}

// work writes queued statuses until none is left.
func (w *statusWrites) work() {
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.queue = nil
			w.writers--
			w.mu.Unlock()
			return
		}
		claim := w.queue[0]
		w.queue = w.queue[1:]
		e := w.next[claim]
		delete(w.next, claim)
		w.busy[claim] = e
		w.mu.Unlock()

		if e.ctx.Err() == nil {
			w.run(e.ctx, func() { w.patch(e.ctx, claim, e.value) })
		}

		w.mu.Lock()
		delete(w.busy, claim)
		if _, ok := w.next[claim]; ok {
			// Asked for again while this write was in flight: it goes after it.
			w.queue = append(w.queue, claim)
		}
		w.mu.Unlock()
		for _, f := range e.then {
			w.run(e.ctx, f)
		}
		for _, d := range e.done {
			d.Done()
		}
	}
}

// run runs f through guard.
func (w *statusWrites) run(ctx context.Context, f func()) {
	if w.guard == nil {
		f()
		return
	}
	w.guard(ctx, f)
}

// then runs f once the status last asked for on claim is written (or given up), at once when
// none waits or is in flight.
func (w *statusWrites) then(claim types.NamespacedName, f func()) {
	w.mu.Lock()
	e := w.next[claim]
	if e == nil {
		e = w.busy[claim]
	}
	if e != nil {
		e.then = append(e.then, f)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	f()
}
