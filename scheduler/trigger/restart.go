package trigger

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
)

// markerAnnotations make up the restart marker, in this order.
var markerAnnotations = []string{annotations.CSIAddonsPod, annotations.CSIAddonsRestart, annotations.HealerRestart}

// onlyCSIAddonsSidecarRestarted reports whether n's restart marker differs from the handled one
// only in the csi-addons sidecar's lastUpdatedAt: the pod (its UID) and the healer sidecar's start
// are the same, so only the csi-addons sidecar container restarted. The handled marker is the
// joined form RestartMarker writes; its lastUpdatedAt is the part that is an RFC 3339 time
// without a "/" (the healer's part carries "/<pod UID>").
func onlyCSIAddonsSidecarRestarted(n *csiaddonsv1alpha1.CSIAddonsNode, handled string) bool {
	current := n.Annotations[annotations.CSIAddonsRestart]
	if handled == "" || current == "" || annotations.Value(n.Annotations, annotations.HealerRestart) == "" {
		return false
	}
	var rest []string
	for _, part := range strings.Split(handled, "|") {
		if _, err := time.Parse(time.RFC3339Nano, part); err == nil && !strings.Contains(part, "/") {
			continue
		}
		rest = append(rest, part)
	}
	var want []string
	for _, a := range []string{annotations.CSIAddonsPod, annotations.HealerRestart} {
		if v := annotations.Value(n.Annotations, a); v != "" {
			want = append(want, v)
		}
	}
	return len(rest) < len(strings.Split(handled, "|")) && slices.Equal(rest, want)
}

// RestartMarker returns the value that identifies the current start of the node plugin behind a
// CSIAddonsNode. A CSIAddonsNode with none of the marker annotations is identified by its UID, so
// that its creation is a restart too.
func RestartMarker(n *csiaddonsv1alpha1.CSIAddonsNode) string {
	var parts []string
	for _, a := range markerAnnotations {
		if v := annotations.Value(n.Annotations, a); v != "" {
			parts = append(parts, v)
		}
	}
	if len(parts) == 0 {
		return "uid:" + string(n.UID)
	}
	return strings.Join(parts, "|")
}

// Unswept returns n's restart marker and whether that restart is still to be swept: the marker
// differs from the handled one, n is not being deleted and names its driver, and the change is
// more than a restart of the csi-addons sidecar container alone (which is swept only with
// sweepCSIAddonsSidecarRestarts, as RestartOptions says). Restarts and healerctl status decide
// with it.
func Unswept(n *csiaddonsv1alpha1.CSIAddonsNode, sweepCSIAddonsSidecarRestarts bool) (marker string, unswept bool) {
	marker = RestartMarker(n)
	handled := annotations.Value(n.Annotations, annotations.HandledMarker)
	if n.DeletionTimestamp != nil || marker == handled || n.Spec.Driver.Name == "" ||
		(!sweepCSIAddonsSidecarRestarts && onlyCSIAddonsSidecarRestarted(n, handled)) {
		return marker, false
	}
	return marker, true
}

// DefaultNewPodWait is RestartOptions.NewPodWait's default.
const DefaultNewPodWait = 30 * time.Second

// RestartOptions configure Restarts.
type RestartOptions struct {
	// Debounce is the shortest time between two restart sweeps of one CSIAddonsNode: the first
	// change of a marker is swept at once, and the changes that follow within the window after
	// a sweep (a crash-looping plugin) are folded into one sweep of the last marker at the
	// window's end, made only when the marker changed again. An object without the healer
	// sidecar's endpoint waits the window from its change, for the sidecar to write it. Default: 0.
	Debounce time.Duration
	// SweepCSIAddonsSidecarRestarts sweeps when only the csi-addons sidecar's lastUpdatedAt
	// changed since the handled marker (a restart of that container alone). Default false: such
	// a change kills no mounter, and a driver restart that made the csi-addons sidecar exit is
	// marked by the healer sidecar, which sees the driver reconnect.
	SweepCSIAddonsSidecarRestarts bool
	// NewPodWait bounds the wait for a replaced node plugin pod's healer sidecar: while the
	// csi-addons sidecar names a new pod (annotations.CSIAddonsPod) and the healer sidecar's
	// marker still names another (its endpoint is the old pod's, dead), the restart is not swept;
	// once the new pod's healer sidecar registers, the marker changes and the sweep goes through
	// it. After NewPodWait the restart is swept anyway. Default: DefaultNewPodWait.
	NewPodWait time.Duration
	// Clock tells time. Default: the real clock.
	Clock clock.WithTicker
	// Metrics counts triggers. Default: none.
	Metrics *Metrics
	// Sweeps receives a restart Sweep when a marker change has settled. Required.
	Sweeps func(scheduler.Sweep)
}

// Restarts turns CSIAddonsNode changes into restart sweeps: one sweep per restart of a driver's
// node plugin on a node, at once, and at most one per debounce window for the restarts that
// follow it.
type Restarts struct {
	opts    RestartOptions
	mu      sync.Mutex
	pending map[types.NamespacedName]*pendingRestart
	// fired is when the last restart sweep of each CSIAddonsNode was handed to Sweeps.
	fired map[types.NamespacedName]time.Time
	// swept is the marker of each CSIAddonsNode whose sweep was handed to Sweeps and has not
	// ended (see Ended): further changes of the object with that marker (a status update, the
	// healer sidecar writing its annotations back) do not start another sweep beside it.
	swept map[types.NamespacedName]string
	wake  chan struct{}
}

// pendingRestart is a restart seen but not yet swept.
type pendingRestart struct {
	sweep scheduler.Sweep
	due   time.Time
	// waitingSince is when the object was first seen naming a new pod whose healer sidecar had
	// not registered yet; zero when it was not.
	waitingSince time.Time
}

// healerOfAnotherPod reports whether n's csi-addons sidecar names a pod other than the one its
// healer sidecar's marker names: the node plugin pod was replaced and its new healer sidecar has
// not registered yet.
func healerOfAnotherPod(n *csiaddonsv1alpha1.CSIAddonsNode) bool {
	pod := n.Annotations[annotations.CSIAddonsPod]
	_, healerPod, ok := strings.Cut(n.Annotations[annotations.HealerRestart], "/")
	return pod != "" && ok && healerPod != "" && healerPod != pod
}

// NewRestarts returns a Restarts with nothing pending.
func NewRestarts(opts RestartOptions) (*Restarts, error) {
	if opts.Sweeps == nil {
		return nil, fmt.Errorf("trigger: RestartOptions.Sweeps is required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.NewPodWait <= 0 {
		opts.NewPodWait = DefaultNewPodWait
	}
	return &Restarts{opts: opts, pending: map[types.NamespacedName]*pendingRestart{}, fired: map[types.NamespacedName]time.Time{},
		swept: map[types.NamespacedName]string{}, wake: make(chan struct{}, 1)}, nil
}

// Observe takes a created or changed CSIAddonsNode into account. A marker that differs from the
// handled one becomes a pending sweep, unless its sweep already started: due at once, or, within
// the debounce window after the object's last sweep, at the window's end; a newer marker before
// then replaces it and keeps its due time.
func (r *Restarts) Observe(ctx context.Context, n *csiaddonsv1alpha1.CSIAddonsNode) {
	key := types.NamespacedName{Namespace: n.Namespace, Name: n.Name}
	marker, unswept := Unswept(n, r.opts.SweepCSIAddonsSidecarRestarts)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !unswept {
		delete(r.pending, key)
		delete(r.swept, key)
		return
	}
	if p, ok := r.pending[key]; ok && p.sweep.Marker == marker {
		return
	}
	if r.swept[key] == marker {
		return // one marker, one sweep
	}
	now := r.opts.Clock.Now()
	p := &pendingRestart{
		sweep: scheduler.Sweep{
			Trigger: scheduler.TriggerRestart,
			Driver:  n.Spec.Driver.Name,
			Node:    n.Spec.Driver.NodeID,
			Source:  key,
			Marker:  marker,
		},
		due: now,
	}
	if last, ok := r.fired[key]; ok {
		// A restart within the window after the last sweep waits for the window's end, with
		// whatever else comes meanwhile.
		p.due = maxTime(p.due, last.Add(r.opts.Debounce))
	}
	if n.Annotations[annotations.Endpoint] == "" {
		// No healer sidecar to call yet (an object the csi-addons sidecar recreated without the
		// healer sidecar's annotations): the window gives it the time to write them back.
		p.due = maxTime(p.due, now.Add(r.opts.Debounce))
	}
	if healerOfAnotherPod(n) {
		// Sweeping now would call the old pod's dead sidecar: wait for the new one, counting
		// from when the new pod was first seen.
		p.waitingSince = now
		if old, ok := r.pending[key]; ok && !old.waitingSince.IsZero() {
			p.waitingSince = old.waitingSince
		}
		p.due = maxTime(p.due, p.waitingSince.Add(r.opts.NewPodWait))
	}
	r.pending[key] = p
	klog.FromContext(ctx).V(2).Info("Node plugin restart seen", "csiAddonsNode", key, "driver", n.Spec.Driver.Name, "node", n.Spec.Driver.NodeID, "marker", marker)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Forget drops a pending restart of a deleted CSIAddonsNode.
func (r *Restarts) Forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, key)
	delete(r.swept, key)
	delete(r.fired, key)
}

// Ended tells Restarts that the sweep s, handed to Sweeps, has ended, and whether it recorded its
// marker as handled. A sweep that did not (it stopped unfinished, or recording failed) is swept
// again on its object's next change; one that did stays counted until the object shows the
// handled marker, so that a change seen before that does not sweep it twice.
func (r *Restarts) Ended(s scheduler.Sweep, recorded bool) {
	if s.Trigger != scheduler.TriggerRestart || recorded {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.swept[s.Source] == s.Marker {
		delete(r.swept, s.Source)
	}
}

// Pending returns the number of restarts waiting for their debounce window to pass.
func (r *Restarts) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// Start hands settled restarts to Sweeps until ctx ends.
func (r *Restarts) Start(ctx context.Context) error {
	for {
		now := r.opts.Clock.Now()
		ready, next := r.settled(now)
		for _, s := range ready {
			r.opts.Metrics.triggered(scheduler.TriggerRestart)
			r.opts.Sweeps(s)
		}
		var wait time.Duration
		if !next.IsZero() {
			// A restart settled at this very instant waits at least a nanosecond, not forever.
			wait = max(next.Sub(now), time.Nanosecond)
		}
		if !waitForWork(ctx, r.opts.Clock, wait, r.wake) {
			return nil
		}
	}
}

// settled removes and returns the restarts whose debounce window has passed, and the earliest due
// time of those still waiting.
func (r *Restarts) settled(now time.Time) ([]scheduler.Sweep, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ready []scheduler.Sweep
	var next time.Time
	for key, p := range r.pending {
		if p.due.After(now) {
			if next.IsZero() || p.due.Before(next) {
				next = p.due
			}
			continue
		}
		s := p.sweep
		s.Fired = now
		ready = append(ready, s)
		delete(r.pending, key)
		r.swept[key] = s.Marker
		r.fired[key] = now
	}
	// What fired longer than a window ago no longer delays anything.
	for key, at := range r.fired {
		if now.Sub(at) >= r.opts.Debounce {
			if _, waiting := r.pending[key]; !waiting && !at.Equal(now) {
				delete(r.fired, key)
			}
		}
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].Source.String() < ready[j].Source.String() })
	return ready, next
}

// RecordHandled writes the marker of a finished restart sweep onto its CSIAddonsNode with a merge
// patch that touches only that annotation and those of with, such as the sweep's result (and
// removes the key release 0.1.0 wrote the marker under), so a csi-addons sidecar owning the
// object keeps its own. with may be nil.
func RecordHandled(ctx context.Context, c client.Client, s scheduler.Sweep, with map[string]string) error {
	set := map[string]string{annotations.HandledMarker: s.Marker}
	for k, v := range with {
		if k != annotations.HandledMarker {
			set[k] = v
		}
	}
	patch := annotations.MergePatch(set)
	n := &csiaddonsv1alpha1.CSIAddonsNode{}
	n.Namespace, n.Name = s.Source.Namespace, s.Source.Name
	if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("record handled restart marker on CSIAddonsNode %s: %w", s.Source, err)
	}
	return nil
}
