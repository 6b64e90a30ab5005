package healer

import (
	"context"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/probe"
)

// VolumeStatus is the value of annotations.VolumeStatus.
type VolumeStatus struct {
	// Result is StatusUnhealthy, StatusHealed, StatusHealFailed or StatusRecycling.
	Result string `json:"result"`
	// Node is the node the volume was probed on.
	Node string `json:"node"`
	// Time is when the result was reached.
	Time time.Time `json:"time"`
	// Health lists the problems the last probe found.
	Health []probe.Health `json:"health,omitempty"`
	// Message explains a failure.
	Message string `json:"message,omitempty"`
	// Recycle is the progress of the volume's recycle on Node; with StatusRecycling only.
	Recycle *RecycleStatus `json:"recycle,omitempty"`
}

// RecycleStatus is how far a volume's recycle on its node has come.
type RecycleStatus struct {
	// Since is when the recycle began.
	Since time.Time `json:"since"`
	// Finding is the probe's reason that led to it.
	Finding string `json:"finding,omitempty"`
	// Evicted counts the pods evicted so far.
	Evicted int `json:"evicted"`
	// Waiting counts the pods waiting for the eviction budget or a retry after an error.
	Waiting int `json:"waiting"`
	// Blocked counts the pods whose eviction a PodDisruptionBudget refused.
	Blocked int `json:"blocked"`
	// Left counts the pods the policy leaves alone (a bare pod, no opt-in).
	Left int `json:"left"`
}

// Results in VolumeStatus.
const (
	// StatusUnhealthy: the last probe found the volume unhealthy and it was not healed: the
	// policy did not ask for a heal, the driver cannot heal it (its data is lost, say), or pods
	// must restart to see the repaired mount.
	StatusUnhealthy = "unhealthy"
	// StatusHealed: the volume was healed and a probe after the heal found it healthy.
	StatusHealed = "healed"
	// StatusHealFailed: a probe or heal of the volume failed after the dispatcher's retries.
	StatusHealFailed = "heal-failed"
	// StatusRecycling: the volume is recycled on its node (the pods using it there are evicted)
	// and not yet found healthy there; VolumeStatus.Recycle says how far it has come.
	StatusRecycling = "recycling"
)

// writeStatus writes the volume's status annotation on its claim, if it has one: result with the
// probe's health and a message. The write is made beside the task (Sweeper.statuses), before the
// sweep ends.
func (w *volumeWork) writeStatus(result string, health []probe.Health, message string) {
	w.putStatus(VolumeStatus{Result: result, Node: w.v.NodeName, Time: w.s.opts.Clock.Now().UTC(), Health: health, Message: message})
}

// writeRecycling writes the status of a volume recycled on its node, with its progress p.
func (w *volumeWork) writeRecycling(health []probe.Health, p evict.Progress) {
	since := p.Since
	if since.IsZero() {
		since = w.s.opts.Clock.Now()
	}
	w.putStatus(VolumeStatus{Result: StatusRecycling, Node: w.v.NodeName, Time: w.s.opts.Clock.Now().UTC(), Health: health,
		Recycle: &RecycleStatus{Since: since.UTC(), Finding: p.Finding, Evicted: p.Evicted, Waiting: p.Waiting, Blocked: p.Blocked, Left: p.Left}})
}

// putStatus has st written onto the volume's claim, if it has one.
func (w *volumeWork) putStatus(st VolumeStatus) {
	pvc := w.v.Claim()
	if pvc == nil {
		return
	}
	value, err := json.Marshal(st)
	if err != nil {
		return
	}
	text := string(value)
	w.s.statuses.add(w.sweepCtx, client.ObjectKeyFromObject(pvc), &text, w.tasks)
}

// clearStatus removes the annotation of a volume found healthy, if it had one: under its key, or
// under the key of 0.1.0 on a claim that version wrote.
func (w *volumeWork) clearStatus() {
	w.s.setFailing(w.v, false)
	for _, key := range annotations.Keys(annotations.VolumeStatus) {
		if _, ok := w.v.ClaimAnnotation(key); ok {
			pvc := w.v.Claim()
			w.s.statuses.add(w.sweepCtx, client.ObjectKeyFromObject(pvc), nil, w.tasks)
			return
		}
	}
}

// patchStatus sets (value not nil) or removes (value nil) the annotation on claim with a merge
// patch, which also removes the annotation 0.1.0 wrote, so that a claim carries one status.
func (s *Sweeper) patchStatus(ctx context.Context, claim types.NamespacedName, value *string) {
	var patch []byte
	if value == nil {
		patch = annotations.MergePatch(nil, annotations.VolumeStatus)
	} else {
		patch = annotations.MergePatch(map[string]string{annotations.VolumeStatus: *value})
	}
	obj := &corev1.PersistentVolumeClaim{}
	obj.Namespace, obj.Name = claim.Namespace, claim.Name
	if err := s.opts.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot write the volume status annotation", "pvc", claim.String())
	}
}
