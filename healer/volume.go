package healer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
)

// outcome is one volume's result in a sweep.
type outcome int

const (
	outcomeSkipped outcome = iota
	outcomeHealthy
	outcomeUnhealthy
	outcomeHealed
	outcomeFailed
	// outcomeUndecided is a volume the policy could not decide (a runtime error, or no accepted
	// policy serving): left alone, and its restart kept pending.
	outcomeUndecided
	outcomeWouldProbe
	outcomeWouldHeal
	outcomeWouldRecycle
	// outcomeRecycling is a volume recycled on its node and not yet found healthy there: a
	// restart sweep with one stays pending.
	outcomeRecycling
	// outcomeKept is a volume that a restart sweep found healthy and kept alive by its driver
	// across the restart (its mounter runs outside the node plugin): confirmed, not healed.
	outcomeKept
)

// volumeWork is one volume's task as the dispatcher runs it: prepare's decision and what act
// needs, held in one allocation. A periodic sweep makes one for each of its volumes, 300,000 in a
// large cluster, and each allocation more per volume is garbage that the collector must chase
// through a heap as large as the controller's caches.
type volumeWork struct {
	s *Sweeper
	// sweepCtx is the sweep's context, for done's log; base the sweep's logger.
	sweepCtx context.Context
	base     klog.Logger
	v        planner.Volume
	target   probe.Target
	caps     *probe.Capabilities
	in       policy.Input
	action   policy.Action
	// restartPods hands pods that a probe finds on the volume's dead mount to the Restarter;
	// the pods a heal leaves on the mount it replaced are handed over in every sweep.
	restartPods bool
	// evictFrom is the earliest time a recycle of this task evicts pods (evict.Request.NotBefore).
	evictFrom time.Time
	// tally counts the volume's outcome once done; tasks counts the task until then.
	tally *tally
	tasks *sync.WaitGroup
	// The dispatcher may run the task more than once (retries); the last run's outcome counts.
	mu   sync.Mutex
	last outcome
}

// logger is the volume's logger. It is made when something is logged or called: a periodic
// sweep of healthy volumes logs nothing at the default verbosity, and prepare runs for every
// volume.
func (w *volumeWork) logger() klog.Logger {
	return w.base.WithValues("pv", w.v.PVName, "node", w.v.NodeName, "driver", w.v.Driver)
}

// run is the task's Run.
func (w *volumeWork) run(ctx context.Context) error {
	o, err := w.act(klog.NewContext(ctx, w.logger()))
	w.mu.Lock()
	w.last = o
	w.mu.Unlock()
	return err
}

// done is the task's Done: it counts the volume's outcome.
func (w *volumeWork) done(r dispatch.Result) {
	defer w.tasks.Done()
	if nothingToDo(r.Err) {
		// The driver says the volume is not staged on the node (it was unstaged since the
		// planner saw it) or that it does not do this call: nothing to act on, and no
		// failure to report; a restart sweep is not kept pending for it.
		klog.FromContext(w.sweepCtx).V(2).Info("Nothing to do for the volume on its node", "pv", w.v.PVName, "node", w.v.NodeName, "reason", r.Err.Error())
		w.tally.add(w.v, outcomeSkipped)
		return
	}
	if r.Err != nil {
		w.failed(r.Err)
		w.tally.add(w.v, outcomeFailed)
		return
	}
	w.mu.Lock()
	o := w.last
	w.mu.Unlock()
	w.tally.add(w.v, o)
}

// prepare makes the first decision for v. It returns no work when nothing is to be called, and
// then the volume's outcome; otherwise the work and its task, without Run and Done.
func (s *Sweeper) prepare(ctx context.Context, sw scheduler.Sweep, v planner.Volume) (*volumeWork, dispatch.Task, outcome) {
	w := &volumeWork{s: s, sweepCtx: ctx, base: klog.FromContext(ctx), v: v}
	base, volumeLogger := w.base, w.logger
	target, addonsNode, err := s.opts.Targets.Target(v.Driver, v.NodeName)
	if err != nil {
		s.opts.Metrics.callError(v.Driver, err)
		volumeLogger().Error(err, "No sidecar for the volume's driver on its node")
		return nil, dispatch.Task{}, outcomeFailed
	}
	caps, err := s.opts.Sidecars.Capabilities(ctx, target)
	if err != nil {
		s.opts.Metrics.callError(v.Driver, err)
		volumeLogger().Error(err, "Cannot read the driver's capabilities")
		return nil, dispatch.Task{}, outcomeFailed
	}
	s.opts.Metrics.startDriver(v.Driver)
	if !caps.Probe && !caps.Heal {
		return nil, dispatch.Task{}, outcomeSkipped
	}
	state := s.mem.get(v.PVName, v.NodeName)
	if sw.Trigger == scheduler.TriggerSchedule && s.opts.Clock.Now().Before(state.recheckAt) {
		if base.V(3).Enabled() {
			volumeLogger().V(3).Info("Driver asked to check again later", "recheckAt", state.recheckAt)
		}
		return nil, dispatch.Task{}, outcomeSkipped
	}

	driver := driverTermOf(s.drivers, caps, addonsNode, s.opts.Evict && s.opts.Restarter != nil)
	w.in = v.PolicyInput(driver.info, policy.Trigger(sw.Trigger))
	in := &w.in
	if in.Driver.Name == driver.info.Name {
		in.Terms.Driver = driver.term
	}
	in.Remedies, in.Terms.Remedies = driver.remedies, driver.remediesTerm
	if in.Node == nil {
		in.Node = &policy.Node{Name: v.NodeName}
	}
	in.History = state.history
	d, err := s.opts.Policy.Decide(ctx, in)
	if err != nil {
		// Fail closed: the policy governs this volume and cannot say what to do with it, so the
		// volume is left alone (never decided by the built-in policy), its restart stays pending,
		// and the operator is told on its PVC; volume_healer_policy_evaluation_errors_total
		// counts it.
		volumeLogger().Error(err, "Policy evaluation failed; the volume is left alone")
		s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumePolicyFailed,
			"The policy failed on this volume, which is left alone until the policy is fixed: %v", err)
		return nil, dispatch.Task{}, outcomeUndecided
	}
	if m := s.opts.Metrics; m != nil {
		m.decisions.WithLabelValues(string(sw.Trigger), string(d.Action)).Inc()
	}
	if base.V(2).Enabled() {
		volumeLogger().V(2).Info("Decision", "action", d.Action, "reason", d.Reason)
	}

	// Built-in guards: the driver must advertise the operation.
	action := d.Action
	switch {
	case action == policy.ActionProbe && !caps.Probe, action == policy.ActionHeal && !caps.Heal:
		action = policy.ActionSkip
	case action == policy.ActionHeal && !state.offeredForHealing(s.mem.generation(v.Driver, v.NodeName)):
		action = policy.ActionSkip
	}
	switch {
	case action == policy.ActionSkip:
		return nil, dispatch.Task{}, outcomeSkipped
	case s.opts.DryRun && action == policy.ActionRecycle:
		volumeLogger().Info("Dry run: would recycle", "reason", d.Reason)
		return nil, dispatch.Task{}, outcomeWouldRecycle
	case s.opts.DryRun && action == policy.ActionProbe:
		volumeLogger().Info("Dry run: would probe", "reason", d.Reason)
		return nil, dispatch.Task{}, outcomeWouldProbe
	case s.opts.DryRun:
		volumeLogger().Info("Dry run: would heal", "reason", d.Reason)
		return nil, dispatch.Task{}, outcomeWouldHeal
	}

	t := dispatch.Task{
		Volume:   v.PVName,
		Driver:   v.Driver,
		Node:     v.NodeName,
		Trigger:  sw.Trigger,
		Priority: d.Priority,
		Timeout:  d.Timeout,
	}
	if sw.Stagger > 0 {
		t.NotBefore = sw.Fired.Add(scheduler.StaggerOffset(v.NodeName, sw.Stagger))
	}
	if sw.Trigger == scheduler.TriggerRestart {
		// A call of another sweep that failed as the node plugin went down (a periodic sweep's
		// probe in flight then) must not delay the heal of its replacement by that call's backoff.
		t.CallsSince = sw.Fired
		// kubelet drops a restarted driver and registers it again up to two of its plugin
		// reconciler's one-second rounds after the new socket appears; pods evicted meanwhile
		// cannot be unstaged (the driver is unknown), and kubelet then fails to stage the volume
		// for their replacements on the dead staging mount left behind, for good.
		if !sw.Fired.IsZero() {
			w.evictFrom = sw.Fired.Add(RecycleAfterRestart)
		}
	}
	w.target, w.caps, w.action, w.restartPods = target, caps, action, !sw.AfterEviction
	return w, t, outcomeSkipped
}

// RecycleAfterRestart is how long after a node plugin's restart was seen a recycle begins to
// evict: kubelet registers the restarted driver again within two rounds of its plugin reconciler
// (one second each), and a pod evicted before that cannot be unstaged.
const RecycleAfterRestart = 3 * time.Second

// act probes, asks the policy again with the probe result, heals if it says so, and probes again
// to confirm. Pods that the probe finds on the volume's dead mount are handed to the Restarter
// when w.restartPods is set, those the heal leaves on the mount it replaced always. Errors are
// classified for the dispatcher.
func (w *volumeWork) act(ctx context.Context) (outcome, error) {
	s, v, target, caps, in := w.s, w.v, w.target, w.caps, w.in
	logger := klog.FromContext(ctx)
	pv := v.PVName
	gen := s.mem.generation(v.Driver, v.NodeName)
	// Each attempt calls the sidecar that serves the node now: a task retried after its sidecar
	// died must reach the replacement, whose restart sweep joined this task instead of calling.
	if current, _, err := s.opts.Targets.Target(v.Driver, v.NodeName); err == nil {
		target = current
	}
	// The task may start long after planning: the built-in guards are checked again before each call.
	if reason := s.recheck(v); reason != "" {
		logger.V(2).Info("Volume left alone", "reason", reason)
		return outcomeSkipped, nil
	}
	if w.action == policy.ActionRecycle {
		// The policy recycles without a probe: nothing names a finding.
		return w.recycle(ctx, nil, in, ""), nil
	}
	if w.action == policy.ActionProbe {
		res, err := s.probe(ctx, v, target)
		if err != nil {
			if errors.Is(err, probe.ErrNotStaged) {
				if o, pending := w.recycleUnstaged(ctx); pending {
					return o, nil
				}
			}
			return outcomeFailed, err
		}
		if res.Healthy() {
			w.clearStatus()
			s.remedyDone(v, "found healthy on node "+v.NodeName)
			if res.Kept && in.Trigger == policy.TriggerRestart {
				// The driver kept the volume alive across its node plugin's restart, and the
				// probe confirms that it works: the restart broke nothing here.
				logger.V(2).Info("Volume kept alive across the node plugin restart; confirmed healthy")
				s.opts.Metrics.volumeKept(v.Driver)
				return outcomeKept, nil
			}
			return outcomeHealthy, nil
		}
		if res.Has(string(policy.HealthDataLoss)) {
			s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumeDataLoss, "Driver %s reports data loss on node %s: %s; not healed automatically, restore from a snapshot or replica", v.Driver, v.NodeName, describe(res.Health))
		}
		probedAt := s.opts.Clock.Now()
		in.Probe = &policy.ProbeResult{Healthy: false, Health: policyHealth(res.Health), Healable: res.Healable, RecheckAfterSeconds: int64(res.RecheckAfter / time.Second), Kept: res.Kept}
		in.History = s.mem.get(pv, v.NodeName).history
		d, err := s.opts.Policy.Decide(ctx, &in)
		if err != nil {
			if res.HasReason(healerv1alpha1.ReasonStaleMountInPods) {
				s.podsMustRestart(v, res, probedAt, in, w.restartPods)
			}
			logger.Error(err, "Policy evaluation with the probe result failed; the volume is left alone")
			w.writeStatus(StatusUnhealthy, res.Health, "")
			s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumePolicyFailed,
				"Volume is unhealthy on node %s (%s); the policy failed on it, so it is left alone until the policy is fixed: %v", v.NodeName, describe(res.Health), err)
			return outcomeUndecided, nil
		}
		logger.V(2).Info("Decision after probe", "action", d.Action, "reason", d.Reason)
		if d.Action == policy.ActionRecycle {
			return w.recycle(ctx, res, in, d.Reason), nil
		}
		if res.HasReason(healerv1alpha1.ReasonStaleMountInPods) {
			s.podsMustRestart(v, res, probedAt, in, w.restartPods)
		}
		if d.Action != policy.ActionHeal || !caps.Heal || !res.Healable || !s.mem.get(pv, v.NodeName).offeredForHealing(gen) {
			w.writeStatus(StatusUnhealthy, res.Health, "")
			if !res.Has(string(policy.HealthDataLoss)) {
				s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumeUnhealthy, "Volume is unhealthy on node %s (%s) and is not healed: %s", v.NodeName, describe(res.Health), d.Reason)
			}
			return outcomeUnhealthy, nil
		}
	}

	if reason := s.recheck(v); reason != "" {
		logger.V(2).Info("Volume left alone before its heal", "reason", reason)
		return outcomeSkipped, nil
	}
	start := s.opts.Clock.Now()
	healed, err := s.opts.Sidecars.Heal(ctx, target, pv)
	s.observe("heal", start)
	if err != nil {
		s.mem.recordFailure(pv, v.NodeName)
		s.count(v.Driver, false, errorResult(err))
		s.opts.Metrics.callError(v.Driver, err)
		return outcomeFailed, dispatchError(err)
	}
	confirm, err := s.probe(ctx, v, target)
	if err != nil {
		s.count(v.Driver, false, "failed")
		return outcomeFailed, err
	}
	if healed.OnlyReason(healerv1alpha1.ReasonStaleMountInPods) && (confirm.Healthy() || confirm.OnlyReason(healerv1alpha1.ReasonStaleMountInPods)) {
		// The node's mount is repaired; what is left is beyond any heal: the pods must restart.
		// Nothing claims the volume healed, and the failing-heal alert fires until they do.
		s.mem.recordFailure(pv, v.NodeName)
		s.count(v.Driver, false, "pods_must_restart")
		w.writeStatus(StatusUnhealthy, healed.Health, "")
		s.setFailing(v, true)
		// This heal replaced the mount the pods hold, so the pods created before it are on a
		// dead mount whatever the sweep: also in the probe that follows an eviction, when the
		// volume broke again since (its new mounter died) and the replacement pods are the
		// ones left on it.
		s.podsMustRestart(v, healed, start, in, true)
		return outcomeUnhealthy, nil
	}
	if !confirm.Healthy() || !healed.Healthy() {
		s.mem.recordFailure(pv, v.NodeName)
		s.count(v.Driver, false, "failed")
		return outcomeFailed, fmt.Errorf("volume still unhealthy after heal: %s", describe(confirm.Health))
	}
	s.mem.recordHeal(pv, v.NodeName, s.opts.Clock.Now())
	s.remedyDone(v, "healed on node "+v.NodeName)
	s.count(v.Driver, false, "healed")
	w.writeStatus(StatusHealed, nil, "")
	s.setFailing(v, false)
	s.volumeEvent(v, corev1.EventTypeNormal, ReasonVolumeHealed, "Volume healed on node %s by driver %s; a probe after the heal found it healthy", v.NodeName, v.Driver)
	return outcomeHealed, nil
}

// podsMustRestart tells the operator, on the PVC, that running pods still see the volume's dead
// mount and must be restarted, and hands them to the Restarter when there is one and restart is
// set. healedAt is when the mount was found repaired: the pods created before then are the ones to
// restart. in is the volume's policy input, which the restart decision of each pod sees with res
// as its probe.
func (s *Sweeper) podsMustRestart(v planner.Volume, res *probe.Result, healedAt time.Time, in policy.Input, restart bool) {
	s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumePodsMustRestart,
		"Volume works again on node %s, but running pods still see its dead mount (%s): restart the pods on node %s that use it; "+
			"their mount propagation (None) keeps the repaired mount from reaching them", v.NodeName, describe(res.Health), v.NodeName)
	claim := v.ClaimName()
	if claim.Name != "" {
		s.opts.Metrics.podsOnDeadMount(claim.Namespace, claim.Name, v.Driver, true, healedAt)
	}
	if s.opts.Restarter == nil || !restart || claim.Name == "" {
		return
	}
	in.Probe = &policy.ProbeResult{Healthy: false, Health: policyHealth(res.Health), Healable: res.Healable, RecheckAfterSeconds: int64(res.RecheckAfter / time.Second), Kept: res.Kept}
	req := evict.Request{PV: v.PVName, Claim: claim, Node: v.NodeName, Driver: v.Driver, HealedAt: healedAt, Input: in,
		Remedy: policy.RemedyHeal, Finding: healerv1alpha1.ReasonStaleMountInPods}
	if pvc := v.Claim(); pvc != nil {
		req.ClaimUID = pvc.UID
	}
	s.opts.Restarter.Add(req)
}

// recheck returns why the volume must now be left alone, or "".
func (s *Sweeper) recheck(v planner.Volume) string {
	_, reason := s.opts.Planner.Recheck(v)
	return reason
}

// probe calls the sidecar and remembers the result.
func (s *Sweeper) probe(ctx context.Context, v planner.Volume, target probe.Target) (*probe.Result, error) {
	start := s.opts.Clock.Now()
	res, err := s.opts.Sidecars.Probe(ctx, target, v.PVName)
	s.observe("probe", start)
	if err != nil {
		s.mem.recordFailure(v.PVName, v.NodeName)
		s.count(v.Driver, true, errorResult(err))
		s.opts.Metrics.callError(v.Driver, err)
		return nil, dispatchError(err)
	}
	s.mem.recordProbe(v.PVName, v.NodeName, v.Driver, s.opts.Clock.Now(), res, s.mem.generation(v.Driver, v.NodeName))
	result := "healthy"
	if !res.Healthy() {
		result = "unhealthy"
	}
	s.count(v.Driver, true, result)
	return res, nil
}

// failed reports a volume whose task ended in an error after the dispatcher's retries.
func (w *volumeWork) failed(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	v := w.v
	klog.FromContext(w.sweepCtx).Error(err, "Volume not healed", "pv", v.PVName, "node", v.NodeName, "driver", v.Driver)
	w.writeStatus(StatusHealFailed, nil, err.Error())
	w.s.setFailing(v, true)
	w.s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumeHealFailed, "Volume on node %s not healed: %v", v.NodeName, err)
}

// nothingToDo reports whether a task's error says that there is nothing to act on, rather than
// that acting failed: the volume is not staged on the node, or the driver does not implement the
// call.
func nothingToDo(err error) bool {
	return err != nil && (errors.Is(err, probe.ErrNotStaged) || errors.Is(err, probe.ErrUnsupported))
}

// errorResult is the result label of a failed call: busy volumes are not failures.
func errorResult(err error) string {
	if errors.Is(err, probe.ErrBusy) {
		return "busy"
	}
	return "error"
}

// dispatchError tells the dispatcher how to treat a sidecar error: busy volumes are retried
// later, errors that cannot go away are not retried, others back off.
func dispatchError(err error) error {
	switch {
	case errors.Is(err, probe.ErrBusy):
		return fmt.Errorf("%w: %w", dispatch.ErrRetryLater, err)
	case errors.Is(err, probe.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded):
		// The call's deadline passed: the dispatcher counts the retry as a timeout.
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	case !probe.Retryable(err):
		return fmt.Errorf("%w: %w", dispatch.ErrPermanent, err)
	default:
		return err
	}
}

// describe says what a probe found, for Events and errors.
func describe(hs []probe.Health) string {
	if len(hs) == 0 {
		return "healthy"
	}
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		p := h.Status + "/" + h.Reason
		if h.Message != "" {
			p += ": " + h.Message
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// recycle starts or continues the recycle of the task's volume on its node: the Restarter evicts
// every pod that uses it there (each as the policy's restart decision says, from w.evictFrom on)
// when w.restartPods is set, so that kubelet unstages it and the driver's NodeStage mounts it
// again for the replacements. res is the probe that found the volume dead (nil when the policy
// recycled without one), in the policy's input with it, reason the policy's. The volume stays
// recycling, and a restart sweep of its node pending, until a later probe there finds it healthy
// or it is no longer staged there with no pod left on it (remedyDone, recycleUnstaged).
func (w *volumeWork) recycle(ctx context.Context, res *probe.Result, in policy.Input, reason string) outcome {
	s, v := w.s, w.v
	logger := klog.FromContext(ctx)
	claim := v.ClaimName()
	var health []probe.Health
	if res != nil {
		health = res.Health
	}
	finding := policy.FindingOf(in.Probe)
	switch {
	case s.opts.Restarter == nil || !s.opts.Evict:
		w.writeStatus(StatusUnhealthy, health, "")
		s.volumeEvent(v, corev1.EventTypeWarning, evict.ReasonVolumeRecycleBlocked,
			"The policy recycles the volume on node %s (%s: %s), but this controller evicts no pods (remediation is off or in dry run): restart the pods on node %s that use it",
			v.NodeName, reason, describe(health), v.NodeName)
		s.setFailing(v, true)
		return outcomeUnhealthy
	case claim.Name == "":
		w.writeStatus(StatusUnhealthy, health, "")
		s.volumeEvent(v, corev1.EventTypeWarning, evict.ReasonVolumeRecycleBlocked,
			"The policy recycles the volume on node %s (%s), but it is bound to no claim, so no pod uses it", v.NodeName, reason)
		s.setFailing(v, true)
		return outcomeUnhealthy
	}
	now := s.opts.Clock.Now()
	if w.restartPods {
		req := evict.Request{PV: v.PVName, Claim: claim, Node: v.NodeName, Driver: v.Driver, HealedAt: now, Input: in,
			Remedy: policy.RemedyRecycle, Finding: finding, NotBefore: w.evictFrom}
		if pvc := v.Claim(); pvc != nil {
			req.ClaimUID = pvc.UID
		}
		s.opts.Restarter.Add(req)
	}
	p, ok := s.opts.Restarter.Progress(v.PVName, v.NodeName)
	if !ok {
		p.Since = now
	}
	logger.Info("Recycling the volume on its node", "reason", reason, "finding", finding, "progress", p.String())
	w.writeRecycling(health, p)
	// Not a failing heal: a recycle takes the time its pods take to go; the recycling gauge and
	// its alert say when it takes too long.
	s.opts.Metrics.recycling(claim.Namespace, claim.Name, v.Driver, true, p.Since)
	return outcomeRecycling
}

// recycleUnstaged is the answer to a volume that its node no longer stages while it is recycled
// there: kubelet unstaged it once every pod using it there was gone. The recycle is done when no
// pod that used it on that node before the recycle is left there (the Restarter's last look
// found none): the next pod's NodeStage mounts it anew. Otherwise it stays recycling, and pending
// says so; with no recycle known it returns false.
func (w *volumeWork) recycleUnstaged(ctx context.Context) (o outcome, pending bool) {
	s, v := w.s, w.v
	if s.opts.Restarter == nil {
		return outcomeSkipped, false
	}
	p, ok := s.opts.Restarter.Progress(v.PVName, v.NodeName)
	if !ok || p.Remedy != policy.RemedyRecycle {
		return outcomeSkipped, false
	}
	if !p.Cleared {
		klog.FromContext(ctx).Info("Recycled volume not staged on its node, but pods that used it are still there", "progress", p.String())
		return outcomeRecycling, true
	}
	s.remedyDone(v, "unstaged on node "+v.NodeName+" with no pod left on it; the next pod's NodeStage mounts it anew")
	w.clearStatus()
	return outcomeSkipped, true
}

// remedyDone finishes the volume's pending remedy on its node, if any; a recycle gets its
// VolumeRecycled Event, with how it ended (how) and the time it took.
func (s *Sweeper) remedyDone(v planner.Volume, how string) {
	if s.opts.Restarter == nil {
		return
	}
	p, ok := s.opts.Restarter.Progress(v.PVName, v.NodeName)
	if !ok {
		return
	}
	s.opts.Restarter.Finish(v.PVName, v.NodeName, p.Remedy == policy.RemedyRecycle)
	if p.Remedy != policy.RemedyRecycle {
		return
	}
	claim := v.ClaimName()
	s.opts.Metrics.recycling(claim.Namespace, claim.Name, v.Driver, false, time.Time{})
	took := s.opts.Clock.Since(p.Since).Round(time.Second)
	s.volumeEvent(v, corev1.EventTypeNormal, ReasonVolumeRecycled,
		"Volume recycled: %s, %s after its recycle began (%s; %s)", how, took, p.Finding, p.String())
}
