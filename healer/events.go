package healer

import (
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// Event reasons.
const (
	// ReasonVolumeHealed: a heal made the volume healthy again.
	ReasonVolumeHealed = "VolumeHealed"
	// ReasonVolumeHealFailed: the volume is still unhealthy after its heal attempts.
	ReasonVolumeHealFailed = "VolumeHealFailed"
	// ReasonVolumeDataLoss: the driver reports data loss; nothing is healed automatically.
	ReasonVolumeDataLoss = "VolumeDataLoss"
	// ReasonVolumeUnhealthy: a probe found the volume unhealthy and the policy chose not to heal.
	ReasonVolumeUnhealthy = "VolumeUnhealthy"
	// ReasonRestartSweepStarted and ReasonRestartSweepFinished bracket a restart sweep on the
	// CSIAddonsNode.
	ReasonRestartSweepStarted  = "RestartSweepStarted"
	ReasonRestartSweepFinished = "RestartSweepFinished"
	// ReasonVolumePolicyFailed: the policy failed to decide for the volume (a runtime error on its
	// input); the volume is left alone, never decided by the built-in policy.
	ReasonVolumePolicyFailed = "VolumePolicyFailed"
	// ReasonRestartSweepPending: a restart sweep did not reach every volume of its node; it is
	// tried again, and the restart stays unhandled until a try is complete.
	ReasonRestartSweepPending = "RestartSweepPending"
	// ReasonRestartSweepStopped: a pending restart sweep stops unfinished, because the node
	// plugin restarted again (the new restart's sweep takes over), its CSIAddonsNode was deleted
	// or its Node is gone. The restart is not recorded as handled.
	ReasonRestartSweepStopped = "RestartSweepStopped"
	// ReasonVolumePodsMustRestart: the volume works on its node again, but running pods still
	// see its dead mount (the driver reports healerv1alpha1.ReasonStaleMountInPods): only
	// restarting them gives them the volume back.
	ReasonVolumePodsMustRestart = "VolumePodsMustRestart"
	// ReasonVolumeRecycled: a volume recycled on its node (its pods there evicted, see
	// evict.ReasonVolumeRecycling) was found healthy there again, or no longer staged there with
	// no pod left on it; with the time the recycle took.
	ReasonVolumeRecycled = "VolumeRecycled"
	// ReasonManualSweepFinished reports a requested sweep's outcome on the object that asked.
	ReasonManualSweepFinished = "ManualSweepFinished"
)

// volumeEvent records an Event on the volume's PVC, or on the PV when no claim is known.
func (s *Sweeper) volumeEvent(v planner.Volume, eventType, reason, format string, args ...any) {
	pvc := v.Claim()
	if pvc == nil {
		s.event(v.Objects().PV, eventType, reason, format, args...)
		return
	}
	// After the claim's status asked for before it: the Event speaks of it.
	s.statuses.then(client.ObjectKeyFromObject(pvc), func() {
		s.event(pvc, eventType, reason, format, args...)
	})
}

// event records an Event on obj when the sweeper has a Recorder.
func (s *Sweeper) event(obj runtime.Object, eventType, reason, format string, args ...any) {
	if s.opts.Recorder != nil {
		s.opts.Recorder.Eventf(obj, eventType, reason, format, args...)
	}
}
