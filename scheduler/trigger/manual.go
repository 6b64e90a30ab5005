package trigger

import (
	"context"
	"fmt"
	"sync"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
)

// Manual sweeps are requested by setting annotations.SweepRequest on a PersistentVolumeClaim (its
// volume), a StorageClass (its volumes) or a CSIAddonsNode (its driver's volumes on its node) to a
// new value, for example the current time; `healerctl sweep` does that. When the sweep has finished
// the controller copies the value to annotations.SweepHandled and records a ManualSweepFinished
// Event on the object, so a request is swept once, across controller restarts and leader changes.
// ManualOptions configure Manual.
type ManualOptions struct {
	// Metrics counts triggers. Default: none.
	Metrics *Metrics
	// Sweeps receives a manual Sweep for each new request. Required.
	Sweeps func(scheduler.Sweep)
}

// Manual turns sweep request annotations into manual sweeps.
type Manual struct {
	opts ManualOptions
	mu   sync.Mutex
	// started remembers the requests handed out and not yet recorded as handled, so that an
	// informer resync or an unrelated update of the object does not start the same sweep twice.
	started map[string]string
}

// NewManual returns a Manual.
func NewManual(opts ManualOptions) (*Manual, error) {
	if opts.Sweeps == nil {
		return nil, fmt.Errorf("scheduler: ManualOptions.Sweeps is required")
	}
	return &Manual{opts: opts, started: map[string]string{}}, nil
}

// Observe takes a created or changed PVC, StorageClass or CSIAddonsNode into account.
func (m *Manual) Observe(ctx context.Context, obj client.Object) {
	request := annotations.Value(obj.GetAnnotations(), annotations.SweepRequest)
	key := fmt.Sprintf("%T/%s/%s", obj, obj.GetNamespace(), obj.GetName())
	m.mu.Lock()
	if request == "" || request == annotations.Value(obj.GetAnnotations(), annotations.SweepHandled) || obj.GetDeletionTimestamp() != nil {
		delete(m.started, key)
		m.mu.Unlock()
		return
	}
	if m.started[key] == request {
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
	m.started[key] = request
	m.mu.Unlock()
	klog.FromContext(ctx).Info("Manual sweep requested", "object", key, "request", request)
	m.opts.Metrics.triggered(scheduler.TriggerManual)
	m.opts.Sweeps(sw)
}

// Forget drops what Manual remembers of obj's request, when obj is deleted.
func (m *Manual) Forget(obj client.Object) {
	key := fmt.Sprintf("%T/%s/%s", obj, obj.GetNamespace(), obj.GetName())
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.started, key)
}

// Pending is how many requests Manual remembers as started and not yet handled.
func (m *Manual) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.started)
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
