package controller

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/scheduler"
)

// sweepRunner runs each requested sweep in its own goroutine, on the leader, and waits for them
// when leadership or the process ends. Overlapping sweeps are safe: the dispatcher never runs two
// calls on one volume.
type sweepRunner struct {
	sweeper interface {
		Run(context.Context, scheduler.Sweep) healer.Summary
	}
	// ready blocks until sweeps can be planned correctly.
	ready func(context.Context) error
	// ended, when set, is told of each sweep that ended and whether it recorded a restart marker.
	ended func(scheduler.Sweep, bool)
	// started, when set, is called as each sweep starts.
	started func()
	mu      sync.Mutex
	ctx     context.Context
	pending []scheduler.Sweep
	wg      sync.WaitGroup
	// running counts the sweeps running; lastEnd is when the last one ended (Unix nanoseconds).
	running, lastEnd atomic.Int64
}

// quietSince returns when the last sweep ended, and false while one runs.
func (r *sweepRunner) quietSince() (time.Time, bool) {
	if r.running.Load() > 0 {
		return time.Time{}, false
	}
	return time.Unix(0, r.lastEnd.Load()), true
}

// submit starts sw, or keeps it until Start is ready when the runner has not started yet.
func (r *sweepRunner) submit(sw scheduler.Sweep) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil {
		r.pending = append(r.pending, sw)
		return
	}
	if r.ctx.Err() != nil {
		return
	}
	r.wg.Add(1)
	r.running.Add(1)
	if r.started != nil {
		r.started()
	}
	go func() {
		defer r.wg.Done()
		defer func() {
			r.lastEnd.Store(time.Now().UnixNano())
			r.running.Add(-1)
		}()
		summary := r.sweeper.Run(r.ctx, sw)
		if r.ended != nil {
			r.ended(sw, summary.Recorded)
		}
	}()
}

// Start runs sweeps until ctx ends, then waits for the running ones to stop.
func (r *sweepRunner) Start(ctx context.Context) error {
	if err := r.ready(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	klog.FromContext(ctx).Info("Caches synced and policy loaded: sweeps start")
	r.mu.Lock()
	r.ctx = ctx
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	for _, sw := range pending {
		r.submit(sw)
	}
	<-ctx.Done()
	r.wg.Wait()
	return nil
}
