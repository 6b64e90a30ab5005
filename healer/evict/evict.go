package evict

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/volume-healer/volume-healer/policy"
)

// Event reasons.
const (
	// ReasonEvictedForStaleMount: the pod was evicted because it still saw a healed volume's
	// dead mount; on the Pod and on the claim.
	ReasonEvictedForStaleMount = "EvictedForStaleMount"
	// ReasonEvictionBlocked: the API server refused the eviction because a PodDisruptionBudget
	// would be violated; it is tried again with backoff. On the claim and on the Pod.
	ReasonEvictionBlocked = "EvictionBlocked"
	// ReasonEvictionFailed: the eviction call failed otherwise; it is tried again with backoff.
	ReasonEvictionFailed = "EvictionFailed"
	// ReasonEvictionDryRun: dry-run would have evicted the pod; on the Pod and on the claim.
	ReasonEvictionDryRun = "EvictionDryRun"
	// ReasonPodLeftOnDeadMount: the policy left the pod alone (its restart decision was leave);
	// on the Pod and on the claim, with the policy's reason.
	ReasonPodLeftOnDeadMount = "PodLeftOnDeadMount"
	// ReasonEvictionPolicyFailed: the policy failed to decide for the pod, which is left alone.
	ReasonEvictionPolicyFailed = "EvictionPolicyFailed"
	// ReasonContainersRestarted: the pod's containers that mount the volume were restarted in
	// place through the node's healer sidecar (policy action restartContainers); the pod keeps its
	// UID, name, node and IP. On the Pod and on the claim.
	ReasonContainersRestarted = "ContainersRestarted"
	// ReasonContainerRestartFailed: the sidecar could not restart the pod's containers in place
	// (no access to the container runtime, no container of the pod mounts the volume, an error,
	// a malformed answer or no answer in time); it is not tried again for that pod, and the
	// policy is asked again without that remedy. On the Pod and on the claim.
	ReasonContainerRestartFailed = "ContainerRestartFailed"
	// ReasonVolumeRecycling: the volume is recycled on its node: the pods that use it there are
	// evicted, so that kubelet unstages it and the driver's NodeStage mounts it again for their
	// replacements. On the claim, naming the pods and the finding.
	ReasonVolumeRecycling = "VolumeRecycling"
	// ReasonEvictedForRecycle: the pod was evicted to recycle its volume on its node; on the Pod
	// and on the claim.
	ReasonEvictedForRecycle = "EvictedForRecycle"
	// ReasonVolumeRecycleBlocked: a recycle cannot go on for now: a pod using the volume on the
	// node stays (a PodDisruptionBudget refused its eviction, the policy leaves it, as it does a
	// bare pod, or the eviction budget is spent). On the claim, saying which and why; the recycle
	// is tried again with backoff.
	ReasonVolumeRecycleBlocked = "VolumeRecycleBlocked"
)

// ContainerRestarter restarts, in place, the containers of a pod that mount a volume on a node,
// through that node's healer sidecar.
type ContainerRestarter interface {
	// RestartContainers returns the names of the containers stopped for kubelet to start again.
	RestartContainers(ctx context.Context, driver, node, pv, podUID string) ([]string, error)
}

// Decider is the policy engine as the evictor uses it.
type Decider interface {
	DecideRestart(ctx context.Context, in *policy.RestartInput) (policy.RestartDecision, error)
}

var _ Decider = (*policy.Engine)(nil)

// Request asks for the pods on a node that a remedy of a volume needs restarted: after a heal
// (Remedy policy.RemedyHeal), the pods that still see the dead mount; for a recycle
// (policy.RemedyRecycle), every pod that uses the volume there.
type Request struct {
	// Remedy is policy.RemedyHeal (the default when empty) or policy.RemedyRecycle.
	Remedy string
	// Finding is the probe's reason that led to the remedy (policy.FindingOf); each pod's
	// restart decision sees it.
	Finding string
	// PV is the PersistentVolume's name.
	PV string
	// Claim is the volume's PersistentVolumeClaim; its namespace is where the pods are.
	Claim types.NamespacedName
	// ClaimUID is the claim's UID, for its Events.
	ClaimUID types.UID
	// Node is the node whose pods see the dead mount.
	Node string
	// Driver is the volume's CSI driver.
	Driver string
	// HealedAt is when the heal (or the probe) found the mount repaired on the node but not in
	// the pods, or, for a recycle, when a probe last found the volume dead on the node: pods
	// created before then are restarted, pods created later are their replacements.
	HealedAt time.Time
	// Input is the volume's policy input, with the probe result that reported the dead mount;
	// each pod's restart decision sees it.
	Input policy.Input
	// NotBefore, when set, is the earliest time pods are evicted for the request: a recycle
	// right after a node plugin's restart waits until kubelet can unstage the volume again.
	NotBefore time.Time
}

// heal names the heal (or recycle) that caused the request, for Events and logs.
func (r Request) heal() string {
	if r.recycle() {
		return fmt.Sprintf("the recycle of volume %s on node %s (%s found at %s)", r.PV, r.Node, r.finding(), r.HealedAt.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("the heal of volume %s by %s on node %s at %s", r.PV, r.Driver, r.Node, r.HealedAt.UTC().Format(time.RFC3339))
}

// recycle reports whether the request recycles the volume.
func (r Request) recycle() bool { return r.Remedy == policy.RemedyRecycle }

// remedy is the request's remedy, heal when unset.
func (r Request) remedy() string {
	if r.Remedy == "" {
		return policy.RemedyHeal
	}
	return r.Remedy
}

func (r Request) finding() string {
	if r.Finding == "" {
		return "a dead mount"
	}
	return r.Finding
}

func (r Request) claimRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: r.Claim.Namespace, Name: r.Claim.Name, UID: r.ClaimUID}
}

// Options configure an Evictor.
type Options struct {
	// Client lists pods and evicts them. Required.
	Client kubernetes.Interface
	// Policy decides, pod by pod, whether to evict or leave alone. Required.
	Policy Decider
	// Recorder receives Events on Pods and claims. Default: none.
	Recorder record.EventRecorder
	// Metrics counts evictions. Default: none.
	Metrics *Metrics
	// DryRun logs and records (Event EvictionDryRun, metric result dry_run) what would be evicted,
	// and evicts nothing. Default false.
	DryRun bool
	// PerMinute is the most evictions in any minute, over every namespace. Default 10.
	PerMinute int
	// PerNamespacePerMinute is the most evictions in any minute in one namespace. Default 5.
	PerNamespacePerMinute int
	// BackoffBase is the first wait before a blocked or failed eviction is tried again; it
	// doubles after each further failure, up to BackoffMax. Default 5s.
	BackoffBase time.Duration
	// BackoffMax caps the wait between tries. Default 5m.
	BackoffMax time.Duration
	// CallTimeout bounds each call to the API server. Default 30s.
	CallTimeout time.Duration
	// Clock tells time for the budgets and the backoff. Default real.
	Clock clock.WithTicker
	// Reprobe asks for the request's volume to be probed again, ReprobeAfter after every pod on
	// the request's node that ran on its dead mount was evicted (or none is left there), so that
	// the volume's dead-mount flag (the StaleMountInPods status, the pods-on-dead-mount gauge)
	// clears once the replacement pods see the repaired mount, instead of at the next periodic
	// sweep. It is not called while a pod stays on the dead mount (left alone by the policy,
	// blocked, dry run). Default: none.
	Reprobe func(Request)
	// ReprobeAfter is the wait before Reprobe, for the replacement pods to start. Default 30s.
	ReprobeAfter time.Duration
	// Containers restarts a pod's containers in place, for the restart action restartContainers.
	// Default: none; the policy is then asked again with input.remedies.restartContainers false.
	Containers ContainerRestarter
}

// Progress is how far the pod restarts of one volume on one node have come, as of the last time
// the evictor handled its request.
type Progress struct {
	// PV, Node, Driver and Claim name the volume and where it is recycled.
	PV, Node, Driver string
	Claim            types.NamespacedName
	// Remedy is policy.RemedyRecycle or policy.RemedyHeal; Finding the probe's reason.
	Remedy, Finding string
	// Since is when the remedy's first request came.
	Since time.Time
	// Evicted counts the pods evicted, Restarted the pods whose containers were restarted in
	// place, since Since.
	Evicted, Restarted int
	// Waiting counts the pods that wait for the eviction budget or a retry after an error;
	// Blocked those a PodDisruptionBudget keeps; Left those the policy leaves alone (a bare pod,
	// no opt-in).
	Waiting, Blocked, Left int
	// Cleared is true when no pod that used the volume on the node before the remedy is left
	// there.
	Cleared bool
}

// String says in a few words how far the remedy has come.
func (p Progress) String() string {
	return fmt.Sprintf("%d evicted, %d restarted in place, %d waiting, %d blocked, %d left alone", p.Evicted, p.Restarted, p.Waiting, p.Blocked, p.Left)
}

// Evictor evicts the pods named by Requests, one volume at a time, under its budgets. Add may
// be called from any goroutine, before or after Start.
type Evictor struct {
	opts   Options
	queue  workqueue.TypedRateLimitingInterface[string]
	budget *budget

	mu sync.Mutex
	// pending holds the latest request of each queued volume and node.
	pending map[string]Request
	// handled remembers the pods already evicted (or recorded by dry-run, or left alone by the
	// policy, or restarted in place), so that no pod is evicted or reported twice; entries expire
	// after an hour. A pod restarted in place is handled again for a dead mount found after its
	// restart: its new containers got a mount that a later failure killed.
	handled map[types.UID]handledPod
	// progress holds, per volume and node, how far its remedy has come, until Finish.
	progress map[string]*Progress
	// noRestart holds the pods whose containers the sidecar could not restart in place: it is
	// not tried again for them; entries expire with handled's.
	noRestart map[types.UID]time.Time
	// lastEviction holds, per volume and node (PV/node), when the evictor last evicted a pod of
	// the volume there: a pod created in the same second as a heal may be its replacement
	// (runsOnMount). Entries expire with handled's.
	lastEviction map[string]time.Time
	// evictPod evicts one pod: evict, or in tests the fake clientset's typed call, whose
	// reactors stand for the API server.
	evictPod func(ctx context.Context, pod *corev1.Pod) error
}

// handledPod is when a pod was handled and whether that evicted it. A pod the policy left alone
// keeps the reason: the policy is asked again at each report of the dead mount (its answer may
// depend on the time, as in a maintenance window), and the pod gets new Events only when the
// answer changes.
type handledPod struct {
	at      time.Time
	evicted bool
	// restarted is true when its containers were restarted in place: it no longer sees the dead
	// mount.
	restarted bool
	left      string
}

// New returns an Evictor.
func New(opts Options) (*Evictor, error) {
	if opts.Client == nil || opts.Policy == nil {
		return nil, errors.New("evict: Client and Policy are required")
	}
	if opts.PerMinute <= 0 {
		opts.PerMinute = 10
	}
	if opts.PerNamespacePerMinute <= 0 {
		opts.PerNamespacePerMinute = 5
	}
	if opts.BackoffBase <= 0 {
		opts.BackoffBase = 5 * time.Second
	}
	if opts.BackoffMax < opts.BackoffBase {
		opts.BackoffMax = max(5*time.Minute, opts.BackoffBase)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.ReprobeAfter <= 0 {
		opts.ReprobeAfter = 30 * time.Second
	}
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.BackoffBase, opts.BackoffMax),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "evictions", Clock: opts.Clock})
	e := &Evictor{
		opts:      opts,
		queue:     q,
		budget:    newBudget(opts.PerMinute, opts.PerNamespacePerMinute),
		pending:   map[string]Request{},
		handled:   map[types.UID]handledPod{},
		progress:  map[string]*Progress{},
		noRestart: map[types.UID]time.Time{},

		lastEviction: map[string]time.Time{},
	}
	e.evictPod = e.evict
	return e, nil
}

// Progress returns how far the remedy of volume pv on node has come, and whether one is known
// (a request came and Finish was not called since).
func (e *Evictor) Progress(pv, node string) (Progress, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.progress[pv+"/"+node]
	if !ok {
		return Progress{}, false
	}
	return *p, true
}

// Recycles returns the progress of every recycle not finished, for the controller's status.
func (e *Evictor) Recycles() []Progress {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Progress
	for _, p := range e.progress {
		if p.Remedy == policy.RemedyRecycle {
			out = append(out, *p)
		}
	}
	return out
}

// Finish forgets the remedy of volume pv on node, whose volume is found healthy there again (or
// no longer staged): its request, if one is still queued, is dropped, and recycled says whether
// to count a finished recycle.
func (e *Evictor) Finish(pv, node string, recycled bool) {
	key := pv + "/" + node
	e.mu.Lock()
	p, ok := e.progress[key]
	delete(e.progress, key)
	delete(e.pending, key)
	e.mu.Unlock()
	if ok && recycled && p.Remedy == policy.RemedyRecycle {
		e.opts.Metrics.recycle(RecycleRecycled)
	}
}

// Add queues req; a later request for the same volume and node replaces an earlier one still
// queued.
func (e *Evictor) Add(req Request) {
	key := req.PV + "/" + req.Node
	started := false
	e.mu.Lock()
	if old, ok := e.pending[key]; !ok || req.HealedAt.After(old.HealedAt) {
		e.pending[key] = req
	}
	if p, ok := e.progress[key]; !ok || p.Remedy != req.remedy() {
		e.progress[key] = &Progress{PV: req.PV, Node: req.Node, Driver: req.Driver, Claim: req.Claim,
			Remedy: req.remedy(), Finding: req.Finding, Since: req.HealedAt}
		started = req.recycle()
	}
	e.mu.Unlock()
	if started {
		e.opts.Metrics.recycle(RecycleStarted)
	}
	e.queue.Add(key)
}

// Start evicts until ctx ends.
func (e *Evictor) Start(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e.next(ctx) {
		}
	}()
	<-ctx.Done()
	e.queue.ShutDown()
	<-done
	return nil
}

// Idle reports whether no request is waiting or in progress.
func (e *Evictor) Idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.pending) == 0
}

func (e *Evictor) next(ctx context.Context) bool {
	key, shutdown := e.queue.Get()
	if shutdown {
		return false
	}
	defer e.queue.Done(key)
	e.mu.Lock()
	req, ok := e.pending[key]
	e.mu.Unlock()
	if !ok {
		e.queue.Forget(key)
		return true
	}
	if wait := req.NotBefore.Sub(e.opts.Clock.Now()); wait > 0 {
		e.queue.AddAfter(key, wait)
		return true
	}
	retry, after, cleared := e.processSurviving(ctx, req)
	if cleared && !retry && ctx.Err() == nil && e.opts.Reprobe != nil {
		e.reprobe(ctx, req)
	}
	switch {
	case ctx.Err() != nil:
	case retry:
		if after > 0 {
			e.queue.AddAfter(key, after)
		} else {
			e.queue.AddRateLimited(key)
		}
	default:
		e.queue.Forget(key)
		e.mu.Lock()
		if cur := e.pending[key]; !cur.HealedAt.After(req.HealedAt) {
			delete(e.pending, key)
		} else {
			// A newer request came in while this one ran.
			e.queue.Add(key)
		}
		e.mu.Unlock()
	}
	return true
}

// reprobe calls Options.Reprobe with req after Options.ReprobeAfter, unless ctx ends first.
func (e *Evictor) reprobe(ctx context.Context, req Request) {
	klog.FromContext(ctx).V(2).Info("No pod left on the volume's dead mount; probing it again soon",
		"pv", req.PV, "node", req.Node, "pvc", req.Claim.String(), "after", e.opts.ReprobeAfter)
	wait := e.opts.Clock.After(e.opts.ReprobeAfter)
	go func() {
		defer e.survive(ctx, goroutineReprobe, func(any) {})
		select {
		case <-wait:
			e.opts.Reprobe(req)
		case <-ctx.Done():
		}
	}()
}

// Names of the evictor's goroutines, in logs and in volume_healer_evictions_goroutine_panics_total.
const (
	goroutineWorker  = "worker"
	goroutineReprobe = "reprobe"
)

// survive is deferred by a goroutine of the evictor before its work: it recovers a panic, logs it
// with the goroutine's name, counts it and calls failed with the panic's value, so that the work
// fails alone and the controller goes on, as the dispatcher does with a task that panics. It must
// be the deferred function itself: recover stops a panic only when called there.
func (e *Evictor) survive(ctx context.Context, goroutine string, failed func(r any)) {
	r := recover()
	if r == nil {
		return
	}
	e.opts.Metrics.goroutinePanicked(goroutine)
	klog.FromContext(ctx).Error(nil, "Goroutine panicked; its work fails, the others go on", "goroutine", goroutine, "panic", r, "stack", string(debug.Stack()))
	failed(r)
}

// processSurviving is process in the worker: a request whose handling panics is dropped (not
// tried again, since it would likely panic again), and the worker goes on with the next one.
func (e *Evictor) processSurviving(ctx context.Context, req Request) (retry bool, after time.Duration, cleared bool) {
	defer e.survive(ctx, goroutineWorker, func(any) { retry, after, cleared = false, 0, false })
	return e.process(ctx, req)
}

// process restarts the request's pods, each as the policy decides: in place, by eviction, or not
// at all. It says whether the request must be tried again: after a backoff (after is 0) when an
// eviction was blocked or failed, or after the wait for the budget; and whether no pod it found
// stays on the dead mount (each was evicted, restarted in place, or is gone).
func (e *Evictor) process(ctx context.Context, req Request) (retry bool, after time.Duration, cleared bool) {
	logger := klog.FromContext(ctx).WithValues("pv", req.PV, "node", req.Node, "driver", req.Driver, "pvc", req.Claim.String(), "remedy", req.remedy())
	pods, err := findPods(ctx, e.opts.Client, req.Claim.Namespace, req.Claim.Name, req.Node, req.HealedAt, e.lastEvictionOf(req), e.opts.CallTimeout)
	if err != nil {
		logger.Error(err, "Cannot find the pods that still see the volume's dead mount")
		e.event(req.claimRef(), corev1.EventTypeWarning, ReasonEvictionFailed,
			"The pods on node %s that use this claim could not be listed to restart them after %s: %v", req.Node, req.heal(), err)
		return true, 0, false
	}
	if !req.recycle() {
		// A heal repaired the node's mount: only a pod that cannot receive the repaired mount
		// can still see the dead one.
		pods = slices.DeleteFunc(pods, func(p corev1.Pod) bool {
			if receivesRepairs(&p, req.Claim.Name) {
				logger.V(2).Info("Pod receives the repaired mount through its mount propagation; not restarted for it", "pod", klog.KObj(&p))
				return true
			}
			return false
		})
	}
	now := e.opts.Clock.Now()
	e.expireHandled(now)
	var scope *policy.PodScope
	// staying counts the pods that keep running on the dead mount.
	staying := 0
	var tally recycleTally
	for i := range pods {
		pod := &pods[i]
		h, ok := e.wasHandled(pod.UID)
		if ok && h.restarted && req.HealedAt.After(h.at) {
			// Its containers were restarted in place before this request's dead mount was
			// found: the mount they got has died since, so the pod sees a dead mount again.
			ok = false
		}
		if ok && h.left == "" {
			if !h.evicted && !h.restarted {
				staying++
			}
			continue
		}
		staying++ // until it is evicted or found gone
		if scope == nil {
			s, err := e.readScope(ctx, req)
			if err != nil {
				logger.Error(err, "Cannot read what the restart decision needs")
				e.event(req.claimRef(), corev1.EventTypeWarning, ReasonEvictionFailed,
					"The pods on node %s that still see this volume's dead mount after %s are left alone for now: %v", req.Node, req.heal(), err)
				return true, 0, false
			}
			scope = &s
		}
		d, err := e.decide(ctx, req, scope, pod, now)
		if err != nil {
			// Fail closed: the pod is left alone; the next report of the dead mount asks again.
			logger.Error(err, "Restart decision failed; the pod is left alone", "pod", klog.KObj(pod))
			e.opts.Metrics.eviction(ResultPolicyFailed)
			e.event(req.claimRef(), corev1.EventTypeWarning, ReasonEvictionPolicyFailed,
				"Pod %s still sees this volume's dead mount after %s; the policy failed to decide for it, so it is left alone: %v", pod.Name, req.heal(), err)
			tally.left = append(tally.left, pod.Name+" (policy failed)")
			continue
		}
		if d.Action == policy.RestartContainers {
			restarted, fallback, err := e.restartInPlace(ctx, logger, req, scope, pod, now)
			switch {
			case err != nil:
				logger.Error(err, "Restart decision failed after the restart in place failed; the pod is left alone", "pod", klog.KObj(pod))
				e.opts.Metrics.eviction(ResultPolicyFailed)
				tally.left = append(tally.left, pod.Name+" (policy failed)")
				continue
			case restarted:
				staying--
				tally.restarted++
				continue
			}
			d = fallback
		}
		if d.Action != policy.RestartEvict {
			tally.left = append(tally.left, pod.Name+" ("+d.Reason+")")
			if h.left == d.Reason {
				logger.V(2).Info("Policy still leaves the pod on the dead mount", "pod", klog.KObj(pod), "reason", d.Reason)
				continue
			}
			logger.Info("Policy leaves the pod on the dead mount", "pod", klog.KObj(pod), "reason", d.Reason)
			e.opts.Metrics.eviction(ResultLeftAlone)
			e.event(pod, corev1.EventTypeWarning, ReasonPodLeftOnDeadMount,
				"The pod still sees the dead mount of claim %s after %s, and the policy leaves it alone (%s): restart it to give it the repaired mount", req.Claim.Name, req.heal(), d.Reason)
			e.event(req.claimRef(), corev1.EventTypeWarning, ReasonPodLeftOnDeadMount,
				"Pod %s still sees this volume's dead mount after %s, and the policy leaves it alone (%s): restart it to give it the repaired mount", pod.Name, req.heal(), d.Reason)
			e.markLeft(pod.UID, now, d.Reason)
			continue
		}
		if e.opts.DryRun {
			logger.Info("Dry run: would evict the pod", "pod", klog.KObj(pod))
			e.opts.Metrics.eviction(ResultDryRun)
			e.event(pod, corev1.EventTypeNormal, ReasonEvictionDryRun,
				"Dry run: would evict this pod, which still sees the dead mount of claim %s after %s", req.Claim.Name, req.heal())
			e.event(req.claimRef(), corev1.EventTypeNormal, ReasonEvictionDryRun,
				"Dry run: would evict pod %s, which still sees this volume's dead mount after %s", pod.Name, req.heal())
			e.markHandled(pod.UID, now, false)
			continue
		}
		if wait := e.budget.wait(pod.Namespace, now); wait > 0 {
			logger.V(2).Info("Eviction budget spent; waiting", "pod", klog.KObj(pod), "wait", wait)
			e.opts.Metrics.throttle()
			after = max(after, wait)
			retry = true
			tally.budget = append(tally.budget, pod.Name)
			continue
		}
		if req.recycle() && !tally.announced {
			tally.announced = true
			e.announceRecycle(req, pods)
		}
		reason, why := ReasonEvictedForStaleMount, "the pod still saw the dead mount of claim %s after %s; its replacement gets the repaired mount"
		claimWhy := "Evicted pod %s, which still saw this volume's dead mount after %s"
		if req.recycle() {
			reason, why = ReasonEvictedForRecycle, "claim %s is recycled on this node: %s; its replacement gets a fresh mount from the driver"
			claimWhy = "Evicted pod %s for %s"
		}
		switch err := e.evictPod(ctx, pod); {
		case err == nil:
			staying--
			tally.evicted++
			e.budget.spend(pod.Namespace, now)
			e.markHandled(pod.UID, now, true)
			e.markEvicted(req, now)
			e.opts.Metrics.eviction(ResultEvicted)
			logger.Info("Evicted a pod that still saw the volume's dead mount", "pod", klog.KObj(pod))
			e.event(pod, corev1.EventTypeNormal, reason, "Evicted: "+why, req.Claim.Name, req.heal())
			e.event(req.claimRef(), corev1.EventTypeNormal, reason, claimWhy, pod.Name, req.heal())
		case apierrors.IsNotFound(err):
			// Gone already: nothing sees the dead mount through it any more.
			staying--
		case apierrors.IsTooManyRequests(err):
			retry = true
			tally.blocked = append(tally.blocked, pod.Name)
			e.opts.Metrics.eviction(ResultBlocked)
			logger.Info("Eviction blocked by a disruption budget; trying again later", "pod", klog.KObj(pod), "err", err.Error())
			e.event(req.claimRef(), corev1.EventTypeWarning, ReasonEvictionBlocked,
				"Eviction of pod %s (still on this volume's dead mount after %s) blocked, tried again later: %v", pod.Name, req.heal(), err)
			e.event(pod, corev1.EventTypeWarning, ReasonEvictionBlocked,
				"Eviction blocked, tried again later: the pod still sees the dead mount of claim %s after %s: %v", req.Claim.Name, req.heal(), err)
		default:
			if ctx.Err() != nil {
				return false, 0, false
			}
			retry = true
			tally.failed = append(tally.failed, pod.Name)
			e.opts.Metrics.eviction(ResultError)
			logger.Error(err, "Eviction failed; trying again later", "pod", klog.KObj(pod))
			e.event(req.claimRef(), corev1.EventTypeWarning, ReasonEvictionFailed,
				"Eviction of pod %s (still on this volume's dead mount after %s) failed, tried again later: %v", pod.Name, req.heal(), err)
		}
	}
	e.record(req, tally, staying == 0)
	return retry, after, staying == 0
}

// recycleTally is what one handling of a request did with its pods.
type recycleTally struct {
	evicted, restarted            int
	blocked, left, budget, failed []string
	// announced is true once the recycle's VolumeRecycling Event of this handling was recorded.
	announced bool
}

// announceRecycle records, on the claim, that the volume is recycled on its node, naming the pods
// that use it there and the finding.
func (e *Evictor) announceRecycle(req Request, pods []corev1.Pod) {
	names := make([]string, 0, len(pods))
	for i := range pods {
		names = append(names, pods[i].Name)
	}
	e.event(req.claimRef(), corev1.EventTypeNormal, ReasonVolumeRecycling,
		"Recycling the volume on node %s (%s): evicting the pods that use it there (%s), so that kubelet unstages it and driver %s mounts it again for their replacements",
		req.Node, req.finding(), strings.Join(names, ", "), req.Driver)
}

// record keeps the request's progress and, for a recycle that cannot go on, tells the operator
// once per change of what holds it.
func (e *Evictor) record(req Request, t recycleTally, cleared bool) {
	key := req.PV + "/" + req.Node
	e.mu.Lock()
	p, ok := e.progress[key]
	if !ok {
		e.mu.Unlock()
		return
	}
	p.Evicted += t.evicted
	p.Restarted += t.restarted
	before := [3]int{p.Blocked, p.Left, p.Waiting}
	p.Blocked, p.Left, p.Waiting = len(t.blocked), len(t.left), len(t.budget)+len(t.failed)
	p.Cleared = cleared
	changed := before != [3]int{p.Blocked, p.Left, p.Waiting}
	e.mu.Unlock()
	if !req.recycle() || !changed || len(t.blocked)+len(t.left)+len(t.budget) == 0 {
		return
	}
	e.opts.Metrics.recycle(RecycleBlocked)
	var parts []string
	if len(t.blocked) > 0 {
		parts = append(parts, "evictions refused by a PodDisruptionBudget: "+strings.Join(t.blocked, ", "))
	}
	if len(t.left) > 0 {
		parts = append(parts, "left alone by the policy, with its reason: "+strings.Join(t.left, ", "))
	}
	if len(t.budget) > 0 {
		parts = append(parts, "waiting for the eviction budget: "+strings.Join(t.budget, ", "))
	}
	e.event(req.claimRef(), corev1.EventTypeWarning, ReasonVolumeRecycleBlocked,
		"The recycle of the volume on node %s (%s) cannot finish while these pods use it there; %s", req.Node, req.finding(), strings.Join(parts, "; "))
}

// decide asks the policy for the pod's restart decision.
func (e *Evictor) decide(ctx context.Context, req Request, scope *policy.PodScope, pod *corev1.Pod, now time.Time) (policy.RestartDecision, error) {
	in := scope.Input(req.Input, pod, now)
	in.Remedy = req.remedy()
	if req.Finding != "" || req.recycle() {
		in.Finding = req.Finding
	}
	if e.cannotRestart(req, pod.UID) {
		in.Remedies.RestartContainers = false
	}
	return e.opts.Policy.DecideRestart(ctx, &in)
}

// cannotRestart reports whether the pod's containers are not to be restarted in place: the
// remedy is a recycle (a container restart does not remount a dead staging mount), the node's
// sidecar does not offer it, there is no way to call it, or it already failed for the pod.
func (e *Evictor) cannotRestart(req Request, uid types.UID) bool {
	if req.recycle() || !req.Input.Remedies.RestartContainers || e.opts.Containers == nil {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, failed := e.noRestart[uid]
	return failed
}

// restartInPlace restarts the pod's containers through the node's sidecar when it can. When it
// cannot (see cannotRestart) or the call fails, the pod is never tried again that way, and the
// policy is asked again with input.remedies.restartContainers false: fallback is its answer,
// which is never restartContainers (that would be leave, with a reason saying so).
func (e *Evictor) restartInPlace(ctx context.Context, logger klog.Logger, req Request, scope *policy.PodScope, pod *corev1.Pod, now time.Time) (restarted bool, fallback policy.RestartDecision, _ error) {
	if !e.cannotRestart(req, pod.UID) {
		names, err := e.opts.Containers.RestartContainers(ctx, req.Driver, req.Node, req.PV, string(pod.UID))
		if err == nil {
			e.markRestarted(pod.UID, now)
			e.opts.Metrics.eviction(ResultContainersRestarted)
			logger.Info("Restarted the pod's containers in place", "pod", klog.KObj(pod), "containers", names)
			e.event(pod, corev1.EventTypeNormal, ReasonContainersRestarted,
				"Restarted containers %s in place: they still saw the dead mount of claim %s after %s; kubelet starts them with the repaired mount", strings.Join(names, ", "), req.Claim.Name, req.heal())
			e.event(req.claimRef(), corev1.EventTypeNormal, ReasonContainersRestarted,
				"Restarted containers %s of pod %s in place: they still saw this volume's dead mount after %s", strings.Join(names, ", "), pod.Name, req.heal())
			return true, policy.RestartDecision{}, nil
		}
		if ctx.Err() != nil {
			return false, policy.RestartDecision{}, ctx.Err()
		}
		e.mu.Lock()
		e.noRestart[pod.UID] = now
		e.mu.Unlock()
		e.opts.Metrics.eviction(ResultRestartFailed)
		logger.Error(err, "The sidecar could not restart the pod's containers in place; asking the policy again without that remedy", "pod", klog.KObj(pod))
		e.event(pod, corev1.EventTypeWarning, ReasonContainerRestartFailed,
			"The node's healer sidecar could not restart this pod's containers in place (not tried again for this pod; the policy decides again without it): %v", err)
		e.event(req.claimRef(), corev1.EventTypeWarning, ReasonContainerRestartFailed,
			"The healer sidecar on node %s could not restart the containers of pod %s in place (not tried again for this pod; the policy decides again without it): %v", req.Node, pod.Name, err)
	}
	d, err := e.decide(ctx, req, scope, pod, now)
	if err != nil {
		return false, policy.RestartDecision{}, err
	}
	if d.Action == policy.RestartContainers {
		d = policy.RestartDecision{Action: policy.RestartLeave, Reason: "RestartContainersNotPossible"}
	}
	return false, d, nil
}

// readScope reads the namespace, StorageClass and disruption budgets that the restart decisions
// of the request's pods share, under the call timeout.
func (e *Evictor) readScope(ctx context.Context, req Request) (policy.PodScope, error) {
	ctx, cancel := context.WithTimeout(ctx, e.opts.CallTimeout)
	defer cancel()
	sc := ""
	if req.Input.Volume.StorageClass != nil {
		sc = req.Input.Volume.StorageClass.Name
	}
	return policy.ReadPodScope(ctx, e.opts.Client, req.Claim.Namespace, sc)
}

// evict asks the API server to evict the pod, with the pod's UID as precondition so that a pod
// recreated under the same name is not evicted for its predecessor.
func (e *Evictor) evict(ctx context.Context, pod *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(ctx, e.opts.CallTimeout)
	defer cancel()
	uid := pod.UID
	eviction := &policyv1.Eviction{
		TypeMeta:      metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"},
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	// The typed client's EvictV1 retries a 429 by itself, up to ten times after the Retry-After
	// the API server sends: the worker would wait minutes on one blocked pod, and the block would
	// be neither reported nor counted. The request is the same, without those retries: the
	// evictor's backoff tries again.
	err := e.opts.Client.CoreV1().RESTClient().Post().
		Namespace(pod.Namespace).Resource("pods").Name(pod.Name).SubResource("eviction").
		Body(eviction).MaxRetries(0).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

func (e *Evictor) wasHandled(uid types.UID) (handledPod, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h, ok := e.handled[uid]
	return h, ok
}

// lastEvictionOf returns when the evictor last evicted a pod of req's volume on req's node, or
// the zero time.
func (e *Evictor) lastEvictionOf(req Request) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastEviction[req.PV+"/"+req.Node]
}

// markEvicted records that a pod of req's volume on req's node was evicted at now.
func (e *Evictor) markEvicted(req Request, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lastEviction[req.PV+"/"+req.Node] = now
}

// markRestarted records that the pod's containers were restarted in place.
func (e *Evictor) markRestarted(uid types.UID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handled[uid] = handledPod{at: now, restarted: true}
}

func (e *Evictor) markHandled(uid types.UID, now time.Time, evicted bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handled[uid] = handledPod{at: now, evicted: evicted}
}

// markLeft records that the policy left the pod alone for reason.
func (e *Evictor) markLeft(uid types.UID, now time.Time, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handled[uid] = handledPod{at: now, left: reason}
}

// expireHandled forgets pods handled over an hour ago: an evicted pod is gone by then.
func (e *Evictor) expireHandled(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for uid, h := range e.handled {
		if now.Sub(h.at) > time.Hour {
			delete(e.handled, uid)
		}
	}
	for uid, at := range e.noRestart {
		if now.Sub(at) > time.Hour {
			delete(e.noRestart, uid)
		}
	}
	for key, at := range e.lastEviction {
		if now.Sub(at) > time.Hour {
			delete(e.lastEviction, key)
		}
	}
	// The progress of a heal's pod restarts is kept an hour after its request was handled,
	// unless Finish came first; a recycle's is kept until Finish, which its volume's next
	// probes call.
	for key, p := range e.progress {
		if _, queued := e.pending[key]; !queued && p.Remedy != policy.RemedyRecycle && now.Sub(p.Since) > time.Hour {
			delete(e.progress, key)
		}
	}
}

func (e *Evictor) event(obj runtime.Object, eventType, reason, format string, args ...any) {
	if e.opts.Recorder != nil {
		e.opts.Recorder.Eventf(obj, eventType, reason, format, args...)
	}
}
