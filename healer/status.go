package healer

import (
	"context"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
)

// StatusAnnotation on a PVC holds, as JSON, what the healer last found and did with its volume,
// for operators (kubectl get pvc -o yaml). It is written when something is wrong or was done, and
// removed when a later probe finds the volume healthy; healthy probes of healthy volumes write
// nothing, so a periodic sweep does not turn into one API write per volume.
const StatusAnnotation = "healer.csiaddons.openshift.io/status"

// VolumeStatus is the value of StatusAnnotation.
type VolumeStatus struct {
	// Result is unhealthy, healed or heal-failed.
	Result string `json:"result"`
	// Node is the node the volume was probed on.
	Node string `json:"node"`
	// Time is when the result was reached.
	Time time.Time `json:"time"`
	// Health lists the problems the last probe found.
	Health []probe.Health `json:"health,omitempty"`
	// Message explains a failure.
	Message string `json:"message,omitempty"`
}

// Results in VolumeStatus.
const (
	statusUnhealthy = "unhealthy"
	statusHealed    = "healed"
	statusFailed    = "heal-failed"
)

func (s *Sweeper) writeStatus(ctx context.Context, v scheduler.Volume, result string, health []probe.Health, message string) {
	pvc := v.Claim()
	if pvc == nil {
		return
	}
	value, err := json.Marshal(VolumeStatus{Result: result, Node: v.NodeName, Time: s.opts.Clock.Now().UTC(), Health: health, Message: message})
	if err != nil {
		return
	}
	s.patchStatus(ctx, pvc, string(value))
}

// clearStatus removes the annotation of a volume found healthy, if it had one.
func (s *Sweeper) clearStatus(ctx context.Context, v scheduler.Volume) {
	s.setFailing(v, false)
	if _, ok := v.ClaimAnnotation(StatusAnnotation); !ok {
		return
	}
	s.patchStatus(ctx, v.Claim(), nil)
}

// patchStatus sets (value a string) or removes (value nil) the annotation with a merge patch.
func (s *Sweeper) patchStatus(ctx context.Context, pvc *corev1.PersistentVolumeClaim, value any) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{StatusAnnotation: value}}})
	if err != nil {
		return
	}
	obj := &corev1.PersistentVolumeClaim{}
	obj.Namespace, obj.Name = pvc.Namespace, pvc.Name
	if err := s.opts.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot write the volume status annotation", "pvc", pvc.Namespace+"/"+pvc.Name)
	}
}
