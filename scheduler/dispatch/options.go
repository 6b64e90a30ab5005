package dispatch

import (
	"context"
	"fmt"
	"time"

	"k8s.io/utils/clock"

	"github.com/volume-healer/volume-healer/scheduler"
)

// Task is one volume's work in one sweep: the probe and heal chain the policy asked for.
type Task struct {
	// Volume is the PV name. At most one task per volume runs at any time, across sweeps.
	Volume string
	// Driver is the CSI driver of the volume; its calls count against the per-driver budget.
	Driver string
	// Node is the node the volume is staged on; its calls count against the per-node budget.
	Node string
	// Trigger orders tasks: restart before manual before schedule.
	Trigger scheduler.Trigger
	// Priority orders tasks of the same trigger class, higher first. It comes from the policy.
	Priority int
	// NotBefore staggers a sweep: the task does not start before this time. Zero: at once.
	NotBefore time.Time
	// Timeout bounds one call of Run. Zero: Options.DefaultTimeout.
	Timeout time.Duration
	// CallsSince, when set, is when what the task calls last started: a restart sweep's task sets
	// the moment the node plugin's restart was seen. Calls on the volume that started before it
	// went to the plugin that is gone, so the backoff their failures earned does not hold this
	// task back, and its own failures back off from BackoffBase. Zero: every failure counts.
	CallsSince time.Time
	// Run does the work. Its ctx carries the values of Start's ctx (the logger) and ends at the
	// timeout and when the Dispatcher stops; Run must return soon after, since the budget slot it
	// holds is freed only then. Wrap ErrRetryLater or
	// ErrPermanent in the error to choose how it is handled; any other error is a failed attempt.
	Run func(ctx context.Context) error
	// Done is called exactly once, when the task is finished for good: succeeded, failed without
	// retry, given up, or cancelled because the Dispatcher stopped. It may be nil. It is called
	// without locks held, so it may Submit again, and it should return quickly.
	Done func(Result)
}

// Result is how a task ended.
type Result struct {
	// Err is nil on success, else the last error. It wraps ErrGaveUp when retries ran out, and
	// ErrDispatcherStopped and context.Canceled when the Dispatcher stopped first.
	Err error
	// Attempts is how many times the Run that produced this result was called.
	Attempts int
	// Coalesced is true when this task's own Run was not called: the task was merged with another
	// task for the same volume (see Dispatcher.Submit), and this is that task's result.
	Coalesced bool
}

// Options configure a Dispatcher. Zero values take the defaults given with each field.
type Options struct {
	// Global bounds the calls in flight in the whole controller. Default: 64.
	Global int
	// PerDriver bounds the calls in flight to one CSI driver, over all its nodes. Default: 32.
	PerDriver int
	// PerNode bounds the calls in flight to one node, over all its drivers: a node plugin that has
	// just restarted is busy restaging its volumes. Default: 4.
	PerNode int
	// BackoffBase is a volume's wait after its first failed call, doubled after each further
	// consecutive failure, and the wait after a busy reply. Default: 5s.
	BackoffBase time.Duration
	// BackoffMax caps a volume's wait between failed calls. A failing volume that has nothing
	// queued for BackoffMax after its wait ended is forgotten, and starts again at BackoffBase.
	// Default: 10m.
	BackoffMax time.Duration
	// MaxAttempts is how many failed calls a task makes before it is given up. Default: 5.
	MaxAttempts int
	// MaxBusyRetries is how many busy replies (ErrRetryLater) a task takes before it is given up;
	// they do not count as failed attempts. Default: 20.
	MaxBusyRetries int
	// DefaultTimeout bounds a call of a Task that has no Timeout of its own. Default: 30s.
	DefaultTimeout time.Duration
	// ShutdownGrace is how long calls in flight may go on after Start's ctx ends; then their ctx is
	// cancelled. Default: 10s.
	ShutdownGrace time.Duration
	// Clock tells time for NotBefore, backoff and the shutdown grace. Call timeouts are context
	// deadlines on the real clock, because they travel with the call to the sidecar and driver.
	// Default: the real clock.
	Clock clock.WithTicker
	// Metrics records budgets, queue and retries. Default: none.
	Metrics *Metrics
	// Lease, when set, holds calls to the time this replica is known to lead: no call starts once
	// the time Lease.Until returns has passed (by Clock), and a call that fails then, perhaps
	// only because the Lease ran out under it, is queued again without counting as an attempt, to
	// start once the Lease is renewed or to end with ErrDispatcherStopped when the Dispatcher
	// stops. Default nil: calls start whenever the budgets allow.
	Lease Lease
}

// Lease tells until when this replica may make calls; the controller's leader election Lease
// (package leader) is one.
type Lease interface {
	// Until returns the time by which every call must have ended, zero when none may start, and
	// a channel that is closed when that changes.
	Until() (time.Time, <-chan struct{})
}

// Defaults of Options.
const (
	defaultGlobal         = 64
	defaultPerDriver      = 32
	defaultPerNode        = 4
	defaultBackoffBase    = 5 * time.Second
	defaultBackoffMax     = 10 * time.Minute
	defaultMaxAttempts    = 5
	defaultMaxBusyRetries = 20
	defaultCallTimeout    = 30 * time.Second
	defaultShutdownGrace  = 10 * time.Second
)

// withDefaults fills in the zero fields and rejects the values that cannot work.
func (o Options) withDefaults() (Options, error) {
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"Global", &o.Global, defaultGlobal},
		{"PerDriver", &o.PerDriver, defaultPerDriver},
		{"PerNode", &o.PerNode, defaultPerNode},
		{"MaxAttempts", &o.MaxAttempts, defaultMaxAttempts},
		{"MaxBusyRetries", &o.MaxBusyRetries, defaultMaxBusyRetries},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return o, fmt.Errorf("dispatch: Options.%s is %d; want 0 (default %d) or more", f.name, *f.v, f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"BackoffBase", &o.BackoffBase, defaultBackoffBase},
		{"BackoffMax", &o.BackoffMax, defaultBackoffMax},
		{"DefaultTimeout", &o.DefaultTimeout, defaultCallTimeout},
		{"ShutdownGrace", &o.ShutdownGrace, defaultShutdownGrace},
	}
	for _, f := range durations {
		if *f.v < 0 {
			return o, fmt.Errorf("dispatch: Options.%s is %s; want 0 (default %s) or more", f.name, *f.v, f.def)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if o.BackoffMax < o.BackoffBase {
		return o, fmt.Errorf("dispatch: Options.BackoffMax (%s) is below BackoffBase (%s)", o.BackoffMax, o.BackoffBase)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o, nil
}
