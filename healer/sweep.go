package healer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
)

// Summary counts what a sweep did.
type Summary struct {
	// Volumes is the number of volumes the planner selected.
	Volumes int
	// Probed, Healed, Skipped, Failed count outcomes. A healed volume was probed too.
	Probed, Healed, Skipped, Failed int
	// Kept counts the volumes a restart sweep found healthy and kept alive by their driver across
	// the restart (their mounters run outside the node plugin): probed and confirmed, not healed.
	Kept int
	// Unhealthy counts volumes found unhealthy and left so (not healable, DATA_LOSS, policy).
	Unhealthy int
	// Undecided counts volumes the policy could not decide (a runtime error, or no accepted
	// policy serving): left alone, and a restart sweep with any is incomplete.
	Undecided int
	// Recycling counts volumes recycled on their node and not yet found healthy there: a restart
	// sweep with any is incomplete, and tries them again until they are.
	Recycling int
	// WouldProbe, WouldHeal and WouldRecycle count dry-run decisions.
	WouldProbe, WouldHeal, WouldRecycle int
	// Cancelled is true when the sweep stopped before every volume was handled.
	Cancelled bool
	// Incomplete says why the sweep did not decide and act on every volume it should have (a
	// sidecar that could not be reached, volumes that failed); empty when it did. A restart sweep
	// is recorded as handled only when it is complete.
	Incomplete string
	// Recorded is true when the sweep recorded its restart marker as handled on the CSIAddonsNode.
	Recorded bool
}

// String says in one line what the sweep did.
func (s Summary) String() string {
	out := fmt.Sprintf("%d volumes: %d probed, %d healed, ", s.Volumes, s.Probed, s.Healed)
	if s.Kept > 0 {
		out += fmt.Sprintf("%d kept, ", s.Kept)
	}
	out += fmt.Sprintf("%d unhealthy left alone, %d skipped, %d failed", s.Unhealthy, s.Skipped, s.Failed)
	if s.Undecided > 0 {
		out += fmt.Sprintf(", %d not decided by the policy", s.Undecided)
	}
	if s.Recycling > 0 {
		out += fmt.Sprintf(", %d being recycled", s.Recycling)
	}
	if s.WouldProbe+s.WouldHeal+s.WouldRecycle > 0 {
		out += fmt.Sprintf("; dry run: would probe %d, would heal %d", s.WouldProbe, s.WouldHeal)
		if s.WouldRecycle > 0 {
			out += fmt.Sprintf(", would recycle %d", s.WouldRecycle)
		}
	}
	if s.Incomplete != "" {
		out += "; incomplete: " + s.Incomplete
	}
	return out
}

// Run runs one sweep to its end and returns what it did. A restart sweep that ends with every
// volume handled records its marker on the CSIAddonsNode; one cut short by ctx does not, so the
// next leader repeats it.
func (s *Sweeper) Run(ctx context.Context, sw scheduler.Sweep) (summary Summary) {
	logger := klog.FromContext(ctx).WithValues("trigger", sw.Trigger, "driver", sw.Driver, "node", sw.Node, "storageClass", sw.StorageClass)
	ctx = klog.NewContext(ctx, logger)
	// A sweep that panics ends alone, unrecorded: a restart stays unhandled and is swept again by
	// the next leader, instead of every restart of a crashing controller repeating every sweep.
	defer func() {
		if r := recover(); r != nil {
			s.opts.Metrics.sweepPanicked(sw.Trigger)
			logger.Error(nil, "Sweep panicked; it ends unrecorded", "panic", r, "stack", string(debug.Stack()))
			summary = Summary{Incomplete: fmt.Sprintf("the sweep panicked: %v", r)}
		}
	}()
	start := s.opts.Clock.Now()
	source := s.begin(sw)
	policyChanged := s.policyChanged()
	var finished map[string]outcome
	if sw.Trigger == scheduler.TriggerRestart {
		finished = map[string]outcome{}
	}
	summary = s.attempt(ctx, sw, finished)
	if sw.Trigger == scheduler.TriggerRestart {
		summary = s.untilComplete(ctx, sw, source, summary, policyChanged, finished)
		if !summary.Cancelled {
			// A node without volumes of the driver gets its tier recorded too.
			s.publishTierOf(ctx, sw.Driver, sw.Node)
		}
	}
	summary.Recorded = s.finish(ctx, sw, source, summary, start)
	return summary
}

// attempt plans the sweep and acts on its volumes once. When finished is not nil (a restart
// sweep), it holds the volumes that finished well in earlier tries: they are not called again,
// their outcomes count in the summary as they were, and the volumes that finish well in this try
// are added to it. A node whose volume list failed is taken again as a whole on the next try.
func (s *Sweeper) attempt(ctx context.Context, sw scheduler.Sweep, finished map[string]outcome) Summary {
	vols, skipped, planErr := s.plan(ctx, sw)
	for _, sk := range skipped {
		klog.FromContext(ctx).V(3).Info("Volume left out by the planner", "pv", sk.PV, "node", sk.Node, "reason", sk.Reason)
	}
	if planErr != nil {
		clear(finished)
	}
	var earlier []outcome
	if len(finished) > 0 {
		vols = filterVolumes(vols, func(v planner.Volume) bool {
			o, ok := finished[volumeKey(v)]
			if ok {
				earlier = append(earlier, o)
			}
			return !ok
		})
	}
	summary := s.submit(ctx, sw, vols, finished)
	summary.Volumes += len(earlier)
	for _, o := range earlier {
		summary.count(o)
	}
	summary.Skipped += len(skipped)
	var why []string
	if planErr != nil {
		why = append(why, planErr.Error())
	}
	if summary.Failed > 0 {
		why = append(why, fmt.Sprintf("%d of %d volumes failed", summary.Failed, summary.Volumes))
	}
	if summary.Undecided > 0 {
		why = append(why, fmt.Sprintf("%d volume(s) not decided by the policy", summary.Undecided))
	}
	if summary.Recycling > 0 {
		why = append(why, fmt.Sprintf("%d volume(s) being recycled, not yet found healthy", summary.Recycling))
	}
	if summary.Incomplete != "" {
		why = append(why, summary.Incomplete)
	}
	summary.Incomplete = strings.Join(why, "; ")
	return summary
}

// untilComplete tries an incomplete restart sweep again, after the waits of retryBackoff, until
// every volume of the node has finished well across the tries; each try calls only the volumes
// that have not (finished, see attempt). A try that left volumes undecided by the policy is
// repeated as soon as another policy revision serves (policyChanged is closed then), without
// waiting for the backoff. It gives up, leaving the restart unhandled, when ctx ends (a
// controller restart or a new leader sweeps it again, since its marker was never recorded), or
// when the sweep is superseded (see superseded).
func (s *Sweeper) untilComplete(ctx context.Context, sw scheduler.Sweep, source *csiaddonsv1alpha1.CSIAddonsNode, summary Summary, policyChanged <-chan struct{}, finished map[string]outcome) Summary {
	if summary.Incomplete == "" || summary.Cancelled {
		return summary
	}
	logger := klog.FromContext(ctx)
	m := s.opts.Metrics
	m.restartPending(sw.Driver, 1)
	defer m.restartPending(sw.Driver, -1)
	backoff := s.retryBackoff()
	for try := 2; ; try++ {
		if why := s.superseded(ctx, sw); why != "" {
			logger.Info("Incomplete restart sweep stops: "+why, "marker", sw.Marker)
			if source != nil {
				s.event(source, corev1.EventTypeWarning, ReasonRestartSweepStopped,
					"Restart sweep of %s on node %s stops unfinished (%s): %s", sw.Driver, sw.Node, summary.Incomplete, why)
			}
			summary.Incomplete += "; " + why
			return summary
		}
		retryIn := backoff.Step()
		logger.Info("Restart sweep incomplete; trying again", "why", summary.Incomplete, "retryIn", retryIn)
		if source != nil {
			s.event(source, corev1.EventTypeWarning, ReasonRestartSweepPending,
				"Restart sweep of %s on node %s is incomplete (%s); trying again in %s", sw.Driver, sw.Node, summary.Incomplete, retryIn)
		}
		changed := policyChanged
		if summary.Undecided == 0 {
			changed = nil // another policy would not reach what this try missed
		}
		select {
		case <-ctx.Done():
			summary.Cancelled = true
			return summary
		case <-s.opts.Clock.After(retryIn):
		case <-changed:
			logger.Info("Another policy revision serves; trying the restart sweep again")
		}
		m.restartRetried(sw.Driver)
		policyChanged = s.policyChanged()
		summary = s.attempt(ctx, sw, finished)
		if summary.Incomplete == "" || summary.Cancelled {
			logger.Info("Restart sweep complete", "tries", try)
			return summary
		}
	}
}

// policyChanged returns a channel closed when another policy revision serves, nil (never) when
// Options.PolicyChanged is unset.
func (s *Sweeper) policyChanged() <-chan struct{} {
	if s.opts.PolicyChanged == nil {
		return nil
	}
	return s.opts.PolicyChanged()
}

// retryBackoff spaces the tries of an incomplete restart sweep: RetryBase, doubling after each
// try, at most RetryMax.
func (s *Sweeper) retryBackoff() wait.Backoff {
	return wait.Backoff{Duration: s.opts.RetryBase, Factor: 2, Cap: s.opts.RetryMax, Steps: math.MaxInt}
}

// superseded says why the restart that sw sweeps no longer needs its sweep, or "": its Node is
// gone, its CSIAddonsNode was deleted (the API server says NotFound), or the node plugin restarted
// again (the marker moved on; the new restart has a sweep of its own). A CSIAddonsNode that names
// no usable endpoint (a csi-addons sidecar recreated it without the healer sidecar's annotations)
// supersedes nothing: the sweep stays pending until the healer sidecar puts them back.
func (s *Sweeper) superseded(ctx context.Context, sw scheduler.Sweep) string {
	if _, _, err := s.opts.Targets.Target(sw.Driver, sw.Node); errors.Is(err, ErrNodeGone) {
		return fmt.Sprintf("Node %s is gone", sw.Node)
	}
	n, ok := s.opts.Targets.Object(sw.Source)
	if !ok {
		// The cache may not have seen the object yet, or lost it to a missed watch event: only
		// the API server says that it is gone.
		n = &csiaddonsv1alpha1.CSIAddonsNode{}
		err := s.opts.Client.Get(ctx, sw.Source, n)
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Sprintf("its CSIAddonsNode %s was deleted", sw.Source)
		case err != nil:
			klog.FromContext(ctx).Error(err, "Cannot read the restart sweep's CSIAddonsNode; the sweep stays pending", "csiAddonsNode", sw.Source)
			return ""
		}
	}
	if marker := trigger.RestartMarker(n); marker != sw.Marker {
		return fmt.Sprintf("the node plugin restarted again (marker %q)", marker)
	}
	return ""
}

// begin counts the sweep as started and, for a restart sweep, forgets what the restarted node
// plugin advertised before. It returns the restart sweep's CSIAddonsNode for its Events (the
// node's chosen registration, usable or not, else the sweep's own object), nil for other sweeps.
func (s *Sweeper) begin(sw scheduler.Sweep) *csiaddonsv1alpha1.CSIAddonsNode {
	if m := s.opts.Metrics; m != nil {
		m.sweepsStarted.WithLabelValues(string(sw.Trigger)).Inc()
	}
	if sw.Trigger != scheduler.TriggerRestart {
		return nil
	}
	// The node plugin restarted: what it advertised may have changed.
	s.opts.Sidecars.Refresh(sw.Driver, sw.Node)
	s.mem.capabilitiesChanged(sw.Driver, sw.Node)
	_, n, _ := s.opts.Targets.Target(sw.Driver, sw.Node)
	if n == nil {
		n, _ = s.opts.Targets.Object(sw.Source)
	}
	if n == nil {
		// Not in the cache (its Node is gone, or the cache lags): the Events name the object.
		n = &csiaddonsv1alpha1.CSIAddonsNode{ObjectMeta: metav1.ObjectMeta{Namespace: sw.Source.Namespace, Name: sw.Source.Name}}
	}
	s.event(n, corev1.EventTypeNormal, ReasonRestartSweepStarted, "Node plugin of %s on node %s restarted: sweeping its volumes", sw.Driver, sw.Node)
	return n
}

// finish reports the sweep's end (metrics, log, Events) and records a finished restart marker or
// manual request as handled, so that it is not swept again. It says whether a restart marker was
// recorded.
func (s *Sweeper) finish(ctx context.Context, sw scheduler.Sweep, source *csiaddonsv1alpha1.CSIAddonsNode, summary Summary, start time.Time) (recorded bool) {
	logger := klog.FromContext(ctx)
	result := "ok"
	switch {
	case summary.Cancelled:
		result = "cancelled"
	case summary.Failed > 0, summary.Incomplete != "":
		result = "failed"
	}
	if m := s.opts.Metrics; m != nil {
		m.sweepsFinished.WithLabelValues(string(sw.Trigger), result).Inc()
		m.sweepDuration.WithLabelValues(string(sw.Trigger)).Observe(s.opts.Clock.Since(start).Seconds())
		if !summary.Cancelled {
			m.sweepFinished(sw, s.opts.Clock.Now())
		}
	}
	logger.Info("Sweep finished", "summary", summary.String(), "duration", s.opts.Clock.Since(start))
	if summary.Cancelled {
		return
	}
	switch sw.Trigger {
	case scheduler.TriggerManual:
		if sw.Requester == nil {
			return
		}
		s.event(sw.Requester, corev1.EventTypeNormal, ReasonManualSweepFinished, "Requested sweep %q finished: %s", sw.Marker, summary)
		if err := trigger.RecordManualHandled(ctx, s.opts.Client, sw); err != nil {
			logger.Error(err, "Manual sweep finished but the request could not be marked handled; it will run again")
		}
	case scheduler.TriggerRestart:
		if summary.Incomplete != "" {
			return
		}
		if source != nil {
			s.event(source, corev1.EventTypeNormal, ReasonRestartSweepFinished, "Restart sweep of %s on node %s finished: %s", sw.Driver, sw.Node, summary)
		}
		return s.recordHandled(ctx, sw, summary)
	}
	return false
}

// RestartSweepResult is the value of annotations.RestartSweep on a CSIAddonsNode: what the last
// finished restart sweep of its node plugin did with the volumes.
type RestartSweepResult struct {
	// Marker is the restart marker the sweep handled.
	Marker string `json:"marker"`
	// Time is when the sweep finished.
	Time time.Time `json:"time"`
	// Volumes is the number of volumes the sweep selected.
	Volumes int `json:"volumes"`
	// Healed counts the volumes it healed.
	Healed int `json:"healed"`
	// Kept counts the volumes it found healthy and kept alive by the driver across the restart
	// (their mounters run outside the node plugin): confirmed, not healed.
	Kept int `json:"kept"`
	// Unhealthy counts the volumes it found unhealthy and left so.
	Unhealthy int `json:"unhealthy"`
	// Skipped counts the volumes it did not call (policy, detaching, not staged).
	Skipped int `json:"skipped"`
}

// recordHandled records the marker of a finished restart sweep, with what the sweep did
// (RestartSweepResult) in the same patch, trying again after the waits of
// retryBackoff while the patch fails: the object may not change again, and nothing else would
// arm the restart anew. It gives up when ctx ends or the restart is superseded; the restart is
// then swept again (by the next leader, or for its new marker).
func (s *Sweeper) recordHandled(ctx context.Context, sw scheduler.Sweep, summary Summary) bool {
	logger := klog.FromContext(ctx)
	backoff := s.retryBackoff()
	var with map[string]string
	result, err := json.Marshal(RestartSweepResult{Marker: sw.Marker, Time: s.opts.Clock.Now().UTC(), Volumes: summary.Volumes,
		Healed: summary.Healed, Kept: summary.Kept, Unhealthy: summary.Unhealthy, Skipped: summary.Skipped})
	if err == nil {
		with = map[string]string{annotations.RestartSweep: string(result)}
	}
	for {
		err := trigger.RecordHandled(ctx, s.opts.Client, sw, with)
		if err == nil {
			return true
		}
		if why := s.superseded(ctx, sw); why != "" {
			logger.Error(err, "Restart sweep finished but its marker could not be recorded; no retry: "+why)
			return false
		}
		retryIn := backoff.Step()
		logger.Error(err, "Restart sweep finished but its marker could not be recorded; trying again", "retryIn", retryIn)
		select {
		case <-ctx.Done():
			return false
		case <-s.opts.Clock.After(retryIn):
		}
	}
}
