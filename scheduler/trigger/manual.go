package trigger

import (
	"context"
	"fmt"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
)

// Manual sweeps are requested by setting annotations.SweepRequest on a PersistentVolumeClaim (its
// volume), a StorageClass (its volumes) or a CSIAddonsNode (its driver's volumes on its node) to a
// new value, for example the current time; `healerctl sweep` does that. When the sweep has finished
// the controller copies the value to annotations.SweepHandled and records a ManualSweepFinished
// Event on the object, so a request is swept once, across controller restarts and leader changes.
//
// Whoever may update a PVC may request a sweep of its volume, so what requests cost is bounded
// here, not by RBAC: an object has at most one sweep in flight and one waiting, and a new request
// replaces the waiting one (a thousand edits while a sweep runs cause one more sweep, of the
// latest request); sweeps start at most PerMinute a minute across the cluster and
// PerNamespacePerMinute a minute per namespace, and the others wait in one queue, served by one
// goroutine, never one per request.

// Defaults of ManualOptions.
const (
	// DefaultManualPerMinute is how many manual sweeps may start in any minute.
	DefaultManualPerMinute = 20
	// DefaultManualPerNamespacePerMinute is how many manual sweeps of one namespace's objects may
	// start in any minute.
	DefaultManualPerNamespacePerMinute = 5
)

// ManualOptions configure Manual.
type ManualOptions struct {
	// Metrics counts triggers. Default: none.
	Metrics *Metrics
	// Sweeps receives a manual Sweep for each request that starts. It must not block. Required.
	Sweeps func(scheduler.Sweep)
	// PerMinute is how many manual sweeps may start in any minute across the cluster; that many
	// may start at once. Default DefaultManualPerMinute.
	PerMinute int
	// PerNamespacePerMinute is how many manual sweeps requested on the objects of one namespace
	// may start in any minute (cluster-scoped StorageClasses share one budget). Default
	// DefaultManualPerNamespacePerMinute.
	PerNamespacePerMinute int
	// Clock tells time for the rate limits. Default real.
	Clock clock.Clock
}

// Manual turns sweep request annotations into manual sweeps.
type Manual struct {
	opts ManualOptions
	// wake tells Start that the queue changed.
	wake chan struct{}

	mu sync.Mutex
	// latest is the last request seen per object and not yet recorded as handled, so that an
	// informer resync or an unrelated update of the object does not request the same sweep twice.
	latest map[string]string
	// waiting is the sweep of each object's latest request, until it starts.
	waiting map[string]scheduler.Sweep
	// inFlight holds the objects whose sweep has started and not yet ended.
	inFlight map[string]bool
	// queue orders the objects whose sweep waits and none is in flight; queued mirrors it.
	queue  []string
	queued map[string]bool
	// global and perNamespace are the start budgets.
	global       *rate.Limiter
	perNamespace map[string]*rate.Limiter
}

// NewManual returns a Manual.
func NewManual(opts ManualOptions) (*Manual, error) {
	if opts.Sweeps == nil {
		return nil, fmt.Errorf("trigger: ManualOptions.Sweeps is required")
	}
	if opts.PerMinute <= 0 {
		opts.PerMinute = DefaultManualPerMinute
	}
	if opts.PerNamespacePerMinute <= 0 {
		opts.PerNamespacePerMinute = DefaultManualPerNamespacePerMinute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Manual{
		opts:         opts,
		wake:         make(chan struct{}, 1),
		latest:       map[string]string{},
		waiting:      map[string]scheduler.Sweep{},
		inFlight:     map[string]bool{},
		queued:       map[string]bool{},
		global:       perMinuteLimiter(opts.PerMinute),
		perNamespace: map[string]*rate.Limiter{},
	}, nil
}

// perMinuteLimiter lets n starts happen at once, and n in any minute after.
func perMinuteLimiter(n int) *rate.Limiter {
	return rate.NewLimiter(rate.Every(time.Minute/time.Duration(n)), n)
}

// manualKey names the object that requests sweeps.
func manualKey(obj client.Object) string {
	return fmt.Sprintf("%T/%s/%s", obj, obj.GetNamespace(), obj.GetName())
}

// Observe takes a created or changed PVC, StorageClass or CSIAddonsNode into account.
func (m *Manual) Observe(ctx context.Context, obj client.Object) {
	request := annotations.Value(obj.GetAnnotations(), annotations.SweepRequest)
	key := manualKey(obj)
	m.mu.Lock()
	if request == "" || request == annotations.Value(obj.GetAnnotations(), annotations.SweepHandled) || obj.GetDeletionTimestamp() != nil {
		delete(m.latest, key)
		delete(m.waiting, key)
		m.mu.Unlock()
		return
	}
	if m.latest[key] == request {
		m.mu.Unlock()
		return
	}
	sw := scheduler.Sweep{Trigger: scheduler.TriggerManual, Marker: request, Requester: obj,
		Source: types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}}
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		if o.Spec.VolumeName == "" {
			m.mu.Unlock()
			klog.FromContext(ctx).Info("Sweep requested on an unbound PVC: nothing to sweep", "pvc", sw.Source)
			return
		}
		sw.PV = o.Spec.VolumeName
	case *storagev1.StorageClass:
		sw.StorageClass = o.Name
	case *csiaddonsv1alpha1.CSIAddonsNode:
		sw.Driver, sw.Node = o.Spec.Driver.Name, o.Spec.Driver.NodeID
	default:
		m.mu.Unlock()
		return
	}
	m.latest[key] = request
	_, replaced := m.waiting[key]
	m.waiting[key] = sw
	m.enqueueLocked(key)
	m.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Manual sweep requested", "object", key, "request", request, "replacesWaiting", replaced)
	m.start(ctx)
}

// enqueueLocked queues key's waiting sweep unless one of key is in flight or queued already.
func (m *Manual) enqueueLocked(key string) {
	if m.inFlight[key] || m.queued[key] {
		return
	}
	if _, ok := m.waiting[key]; !ok {
		return
	}
	m.queue = append(m.queue, key)
	m.queued[key] = true
}

// Ended is told of each sweep that ended; a manual one lets its object's waiting request start.
func (m *Manual) Ended(s scheduler.Sweep, _ bool) {
	if s.Trigger != scheduler.TriggerManual || s.Requester == nil {
		return
	}
	key := manualKey(s.Requester)
	m.mu.Lock()
	delete(m.inFlight, key)
	m.enqueueLocked(key)
	m.mu.Unlock()
	m.start(context.Background())
}

// start hands out the queued sweeps the budgets allow now, in the order they were requested, and
// tells Start to wait for the next one.
func (m *Manual) start(ctx context.Context) {
	ready, _ := m.take()
	m.hand(ctx, ready)
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// hand gives the sweeps that start to Sweeps.
func (m *Manual) hand(ctx context.Context, ready []scheduler.Sweep) {
	for _, sw := range ready {
		klog.FromContext(ctx).Info("Manual sweep starts", "object", manualKey(sw.Requester), "request", sw.Marker)
		m.opts.Metrics.triggered(scheduler.TriggerManual)
		m.opts.Sweeps(sw)
	}
}

// take removes from the queue the sweeps that may start now, and returns them with how long the
// first of the others must wait (0: none waits).
func (m *Manual) take() ([]scheduler.Sweep, time.Duration) {
	now := m.opts.Clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var ready []scheduler.Sweep
	var wait time.Duration
	kept := m.queue[:0]
	for _, key := range m.queue {
		sw, ok := m.waiting[key]
		if !ok || m.inFlight[key] {
			delete(m.queued, key)
			continue
		}
		if d := m.allowLocked(sw.Source.Namespace, now); d > 0 {
			kept = append(kept, key)
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		delete(m.waiting, key)
		delete(m.queued, key)
		m.inFlight[key] = true
		ready = append(ready, sw)
	}
	clear(m.queue[len(kept):])
	m.queue = kept
	// A namespace whose budget is whole again needs no limiter of its own.
	for ns, l := range m.perNamespace {
		if l.TokensAt(now) >= float64(l.Burst()) {
			delete(m.perNamespace, ns)
		}
	}
	return ready, wait
}

// allowLocked takes a start from the cluster's and namespace's budgets and returns 0, or takes
// none and returns how long until both have one.
func (m *Manual) allowLocked(namespace string, now time.Time) time.Duration {
	ns, ok := m.perNamespace[namespace]
	if !ok {
		ns = perMinuteLimiter(m.opts.PerNamespacePerMinute)
		m.perNamespace[namespace] = ns
	}
	var wait time.Duration
	for _, l := range []*rate.Limiter{m.global, ns} {
		if tokens := l.TokensAt(now); tokens < 1 {
			wait = max(wait, time.Duration((1-tokens)/float64(l.Limit())*float64(time.Second))+time.Millisecond)
		}
	}
	if wait > 0 {
		return wait
	}
	m.global.AllowN(now, 1)
	ns.AllowN(now, 1)
	return 0
}

// Start hands out the sweeps that waited for the budgets, until ctx ends.
func (m *Manual) Start(ctx context.Context) error {
	for {
		ready, wait := m.take()
		m.hand(ctx, ready)
		if !waitForWork(ctx, m.opts.Clock, wait, m.wake) {
			return nil
		}
	}
}

// Forget drops what Manual remembers of obj's request, when obj is deleted.
func (m *Manual) Forget(obj client.Object) {
	key := manualKey(obj)
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.latest, key)
	delete(m.waiting, key)
}

// Pending is how many objects have a request that Manual has seen and that is not yet handled.
func (m *Manual) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.latest)
}

// RecordManualHandled copies a finished manual sweep's request value to annotations.SweepHandled on
// the object that requested it, with a merge patch that touches only that annotation (and removes
// the key release 0.1.0 wrote it under).
func RecordManualHandled(ctx context.Context, c client.Client, s scheduler.Sweep) error {
	if s.Requester == nil {
		return nil
	}
	patch := annotations.MergePatch(map[string]string{annotations.SweepHandled: s.Marker})
	obj, ok := s.Requester.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("record handled sweep request: %T is not an API object", s.Requester)
	}
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("record handled sweep request on %T %s: %w", s.Requester, s.Source, err)
	}
	return nil
}

// RequestSweep asks the controller for a manual sweep of obj (a PVC, StorageClass or
// CSIAddonsNode) by setting annotations.SweepRequest to request (and removing a request under the
// key of release 0.1.0), and returns the request value to wait for with SweepHandled.
func RequestSweep(ctx context.Context, c client.Client, obj client.Object, request string) error {
	patch := annotations.MergePatch(map[string]string{annotations.SweepRequest: request})
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("request a sweep of %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// SweepHandled reports whether the controller has finished the sweep request on obj.
func SweepHandled(obj client.Object, request string) bool {
	return annotations.Value(obj.GetAnnotations(), annotations.SweepHandled) == request
}
