package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Options configure an Engine.
type Options struct {
	// Compile tunes every revision the engine compiles; see CompileOptions for the defaults.
	Compile CompileOptions
	// Metrics records decisions, load errors and the serving revision. Default nil: no metrics.
	Metrics *Metrics
}

// Engine serves decisions from the current policy revision and swaps in new revisions atomically.
// A revision that fails to compile or validate never serves: the previous one keeps serving.
type Engine struct {
	opts Options

	// loadMu serializes loads, so that a slow compile cannot swap an older set over a newer one.
	loadMu sync.Mutex

	mu      sync.RWMutex
	current *Revision
	// changed is closed, and replaced, when another revision starts serving.
	changed chan struct{}
}

// NewEngine returns an engine serving the built-in default policy.
func NewEngine(ctx context.Context, opts Options) (*Engine, error) {
	e := &Engine{opts: opts, changed: make(chan struct{})}
	if _, err := e.LoadDefault(ctx); err != nil {
		return nil, fmt.Errorf("loading the built-in policy: %w", err)
	}
	return e, nil
}

// Revision returns the revision serving now.
func (e *Engine) Revision() *Revision {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.current
}

// LoadDefault serves the built-in default policy.
func (e *Engine) LoadDefault(ctx context.Context) (*Revision, error) {
	return e.Load(ctx, DefaultModules())
}

// Load compiles and validates modules as one policy set and, when that succeeds, serves it. On
// failure it returns a *LoadError, counts it, and the revision serving before keeps serving.
// Loading the modules of the serving revision again is a no-op.
func (e *Engine) Load(ctx context.Context, modules []Module) (*Revision, error) {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()

	if cur := e.Revision(); cur != nil && cur.id == revisionID(modules) {
		// A set fixed back to what serves is no longer rejected.
		e.opts.Metrics.serving(cur.id)
		return cur, nil
	}
	rev, err := Compile(ctx, modules, e.opts.Compile)
	if err != nil {
		// Only the policy's own faults count; a cancelled context is not one.
		var le *LoadError
		if errors.As(err, &le) {
			e.opts.Metrics.loadError(le.Kind)
		}
		return nil, err
	}

	e.mu.Lock()
	e.current = rev
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	e.opts.Metrics.serving(rev.id)
	klog.FromContext(ctx).V(2).Info("Serving policy revision", "revision", rev.id, "files", rev.files, "memoized", rev.memo != nil, "detail", rev.Describe())
	return rev, nil
}

// Changed returns a channel that is closed when another revision starts serving, so that work
// the serving policy could not decide can be tried again at once.
func (e *Engine) Changed() <-chan struct{} {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.changed
}

// Decide returns the decision of the serving revision for one volume. While the fail-closed
// policy serves (see ConfigMapSource), it decides nothing and returns ErrNoAcceptedPolicy.
func (e *Engine) Decide(ctx context.Context, in *Input) (Decision, error) {
	rev := e.Revision()
	if rev.failClosed() {
		return Decision{}, fmt.Errorf("policy revision %s: %w", rev.id, ErrNoAcceptedPolicy)
	}
	start := time.Now()
	d, memoized, err := rev.decide(ctx, in)
	e.opts.Metrics.observeDecision(d, err, memoized, time.Since(start), rev.memo != nil)
	if err != nil {
		return Decision{}, fmt.Errorf("policy revision %s: %w", rev.id, err)
	}
	return d, nil
}
