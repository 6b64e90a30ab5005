package healer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
)

// Decider is the policy engine as the sweeper uses it.
type Decider interface {
	Decide(ctx context.Context, in *policy.Input) (policy.Decision, error)
}

// Sidecars is the sidecar client as the sweeper uses it.
type Sidecars interface {
	Capabilities(ctx context.Context, t probe.Target) (*probe.Capabilities, error)
	Probe(ctx context.Context, t probe.Target, pv string) (*probe.Result, error)
	Heal(ctx context.Context, t probe.Target, pv string) (*probe.Result, error)
	ListStaged(ctx context.Context, t probe.Target) ([]probe.StagedVolume, error)
	Refresh(driver, node string)
}

// Dispatcher runs volume tasks under budgets.
type Dispatcher interface {
	Submit(tasks ...dispatch.Task)
}

// Targets finds the sidecar of a driver on a node, from the CSIAddonsNode cache.
type Targets interface {
	Target(driver, node string) (probe.Target, *csiaddonsv1alpha1.CSIAddonsNode, error)
	// Nodes lists the nodes where driver has a sidecar.
	Nodes(driver string) []string
	// Object returns the CSIAddonsNode recorded under key, usable endpoint or not.
	Object(key types.NamespacedName) (*csiaddonsv1alpha1.CSIAddonsNode, bool)
}

var (
	_ Sidecars   = (*probe.Client)(nil)
	_ Dispatcher = (*dispatch.Dispatcher)(nil)
)

// Options configure a Sweeper.
type Options struct {
	// Planner selects volumes. Required.
	Planner *planner.Planner
	// Policy decides per volume. Required.
	Policy Decider
	// Sidecars makes the calls. Required.
	Sidecars Sidecars
	// Dispatcher runs the calls under budgets. Required.
	Dispatcher Dispatcher
	// Targets resolves sidecars. Required.
	Targets Targets
	// Client patches the PVC status annotation and the CSIAddonsNode's handled marker. Required.
	Client client.Client
	// Recorder receives Events on PVCs and CSIAddonsNodes. Default: none.
	Recorder record.EventRecorder
	// Metrics records sweeps, probes and heals. Default: none.
	Metrics *Metrics
	// DryRun decides and reports without calling probe or heal. Default false.
	DryRun bool
	// RetryBase is the wait before a restart sweep that did not reach every volume of its node is
	// tried again; it doubles after each further try, up to RetryMax. Default: 5s.
	RetryBase time.Duration
	// RetryMax caps the wait between tries of an incomplete restart sweep. Default: 5m.
	RetryMax time.Duration
	// PrepareConcurrency bounds how many nodes of one sweep have their volumes decided at once
	// (each asks its sidecar for the driver's capabilities first), and how many sidecars of a
	// driver without VolumeAttachments are asked at once for their staged volumes. Default: 16.
	PrepareConcurrency int
	// Clock tells time and waits between tries. Default real.
	Clock clock.Clock
	// Restarter restarts the pods that still see a volume's dead mount after its heal (the
	// driver reports healerv1alpha1.ReasonStaleMountInPods). Default: none; the operator is told
	// on the PVC to restart them (Event VolumePodsMustRestart).
	Restarter Restarter
}

// Restarter restarts the pods on a node that still see a volume's dead mount.
type Restarter interface {
	Add(req evict.Request)
}

var _ Restarter = (*evict.Evictor)(nil)

// Defaults of Options.
const (
	defaultRetryBase = 5 * time.Second
	defaultRetryMax  = 5 * time.Minute
)

// Sweeper runs sweeps. It is safe for concurrent use: overlapping sweeps share the dispatcher,
// which never runs two calls on one volume.
type Sweeper struct {
	opts    Options
	mem     *memory
	drivers *driverTerms
}

// New returns a Sweeper.
func New(opts Options) (*Sweeper, error) {
	if opts.Planner == nil || opts.Policy == nil || opts.Sidecars == nil || opts.Dispatcher == nil || opts.Targets == nil || opts.Client == nil {
		return nil, errors.New("healer: Planner, Policy, Sidecars, Dispatcher, Targets and Client are required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.PrepareConcurrency <= 0 {
		opts.PrepareConcurrency = 16
	}
	if opts.RetryBase <= 0 {
		opts.RetryBase = defaultRetryBase
	}
	if opts.RetryMax < opts.RetryBase {
		opts.RetryMax = max(defaultRetryMax, opts.RetryBase)
	}
	return &Sweeper{opts: opts, mem: newMemory(), drivers: newDriverTerms()}, nil
}

// ForgetNode drops what the sweeper remembers about a driver's node plugin on a node whose
// CSIAddonsNode was deleted.
func (s *Sweeper) ForgetNode(driver, node string) { s.mem.forgetNode(driver, node) }

// Forget drops what the sweeper remembers about a deleted PersistentVolume, and its claim's
// heal-failure series.
func (s *Sweeper) Forget(pv *corev1.PersistentVolume) {
	s.mem.forget(pv.Name)
	if m := s.opts.Metrics; m != nil && pv.Spec.ClaimRef != nil {
		m.healFailing.DeletePartialMatch(prometheus.Labels{"namespace": pv.Spec.ClaimRef.Namespace, "persistentvolumeclaim": pv.Spec.ClaimRef.Name})
		m.deadMountSeen.Range(func(k, _ any) bool {
			if key := k.([3]string); key[0] == pv.Spec.ClaimRef.Namespace && key[1] == pv.Spec.ClaimRef.Name {
				m.podsOnDeadMount(key[0], key[1], key[2], false, time.Time{})
			}
			return true
		})
	}
}

// Describe sends the descriptor of the unhealthy-volumes gauge; Sweeper is a prometheus.Collector.
func (s *Sweeper) Describe(ch chan<- *prometheus.Desc) { ch <- unhealthyDesc }

// Collect reports the volumes whose last probe found them unhealthy, by driver and health status,
// computed from what the sweeper remembers when Prometheus scrapes.
func (s *Sweeper) Collect(ch chan<- prometheus.Metric) {
	for k, n := range s.mem.unhealthy() {
		ch <- prometheus.MustNewConstMetric(unhealthyDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

var unhealthyDesc = prometheus.NewDesc("volume_healer_volumes_unhealthy",
	"Volumes whose last probe found them unhealthy, by driver and health status (DEGRADED, INACCESSIBLE, DATA_LOSS).",
	[]string{"driver", "status"}, nil)

// Summary counts what a sweep did.
type Summary struct {
	// Volumes is the number of volumes the planner selected.
	Volumes int
	// Probed, Healed, Skipped, Failed count outcomes. A healed volume was probed too.
	Probed, Healed, Skipped, Failed int
	// Unhealthy counts volumes found unhealthy and left so (not healable, DATA_LOSS, policy).
	Unhealthy int
	// WouldProbe and WouldHeal count dry-run decisions.
	WouldProbe, WouldHeal int
	// Cancelled is true when the sweep stopped before every volume was handled.
	Cancelled bool
	// Incomplete says why the sweep did not decide and act on every volume it should have (a
	// sidecar that could not be reached, volumes that failed); empty when it did. A restart sweep
	// is recorded as handled only when it is complete.
	Incomplete string
	// Recorded is true when the sweep recorded its restart marker as handled on the CSIAddonsNode.
	Recorded bool
}

func (s Summary) String() string {
	out := fmt.Sprintf("%d volumes: %d probed, %d healed, %d unhealthy left alone, %d skipped, %d failed",
		s.Volumes, s.Probed, s.Healed, s.Unhealthy, s.Skipped, s.Failed)
	if s.WouldProbe+s.WouldHeal > 0 {
		out += fmt.Sprintf("; dry run: would probe %d, would heal %d", s.WouldProbe, s.WouldHeal)
	}
	if s.Incomplete != "" {
		out += "; incomplete: " + s.Incomplete
	}
	return out
}

// outcome is one volume's result in a sweep.
type outcome int

const (
	outcomeSkipped outcome = iota
	outcomeHealthy
	outcomeUnhealthy
	outcomeHealed
	outcomeFailed
	outcomeWouldProbe
	outcomeWouldHeal
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
	// ReasonManualSweepFinished reports a requested sweep's outcome on the object that asked.
	ReasonManualSweepFinished = "ManualSweepFinished"
)

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
	summary = s.attempt(ctx, sw)
	if sw.Trigger == scheduler.TriggerRestart {
		summary = s.untilComplete(ctx, sw, source, summary)
	}
	summary.Recorded = s.finish(ctx, sw, source, summary, start)
	return summary
}

// attempt plans the sweep and acts on its volumes once.
func (s *Sweeper) attempt(ctx context.Context, sw scheduler.Sweep) Summary {
	vols, skipped, planErr := s.plan(ctx, sw)
	for _, sk := range skipped {
		klog.FromContext(ctx).V(3).Info("Volume left out by the planner", "pv", sk.PV, "node", sk.Node, "reason", sk.Reason)
	}
	summary := s.submit(ctx, sw, vols)
	summary.Skipped += len(skipped)
	var why []string
	if planErr != nil {
		why = append(why, planErr.Error())
	}
	if summary.Failed > 0 {
		why = append(why, fmt.Sprintf("%d of %d volumes failed", summary.Failed, summary.Volumes))
	}
	if summary.Incomplete != "" {
		why = append(why, summary.Incomplete)
	}
	summary.Incomplete = strings.Join(why, "; ")
	return summary
}

// untilComplete tries an incomplete restart sweep again, with a doubling wait, until a try
// reaches every volume of the node. It gives up, leaving the restart unhandled, when ctx ends
// (a controller restart or a new leader sweeps it again, since its marker was never recorded),
// or when the sweep is superseded (see superseded).
func (s *Sweeper) untilComplete(ctx context.Context, sw scheduler.Sweep, source *csiaddonsv1alpha1.CSIAddonsNode, summary Summary) Summary {
	if summary.Incomplete == "" || summary.Cancelled {
		return summary
	}
	logger := klog.FromContext(ctx)
	m := s.opts.Metrics
	m.restartPending(sw.Driver, 1)
	defer m.restartPending(sw.Driver, -1)
	wait := s.opts.RetryBase
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
		logger.Info("Restart sweep incomplete; trying again", "why", summary.Incomplete, "retryIn", wait)
		if source != nil {
			s.event(source, corev1.EventTypeWarning, ReasonRestartSweepPending,
				"Restart sweep of %s on node %s is incomplete (%s); trying again in %s", sw.Driver, sw.Node, summary.Incomplete, wait)
		}
		select {
		case <-ctx.Done():
			summary.Cancelled = true
			return summary
		case <-s.opts.Clock.After(wait):
		}
		m.restartRetried(sw.Driver)
		summary = s.attempt(ctx, sw)
		if summary.Incomplete == "" || summary.Cancelled {
			logger.Info("Restart sweep complete", "tries", try)
			return summary
		}
		wait = min(2*wait, s.opts.RetryMax)
	}
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

// tally adds up the outcomes of a sweep's volumes as their tasks end.
type tally struct {
	mu      sync.Mutex
	summary Summary
	// notes say why the sweep is incomplete beyond failed volumes.
	notes []string
}

func (t *tally) note(why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.notes = append(t.notes, why)
}

func (t *tally) add(o outcome) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch o {
	case outcomeSkipped:
		t.summary.Skipped++
	case outcomeHealthy:
		t.summary.Probed++
	case outcomeUnhealthy:
		t.summary.Probed++
		t.summary.Unhealthy++
	case outcomeHealed:
		t.summary.Probed++
		t.summary.Healed++
	case outcomeFailed:
		t.summary.Failed++
	case outcomeWouldProbe:
		t.summary.WouldProbe++
	case outcomeWouldHeal:
		t.summary.WouldHeal++
	}
}

// submit decides each volume's action and hands the volumes to act on to the dispatcher, node by
// node, and waits until every task has ended. Nodes are prepared concurrently (at most
// Options.PrepareConcurrency at once): a node whose sidecar does not answer its capabilities call
// holds up its own volumes only, and a node's volumes go to the dispatcher as soon as its
// capabilities are known.
func (s *Sweeper) submit(ctx context.Context, sw scheduler.Sweep, vols []planner.Volume) Summary {
	t := &tally{summary: Summary{Volumes: len(vols)}}
	var tasks, prepared sync.WaitGroup
	slots := make(chan struct{}, s.opts.PrepareConcurrency)
	for _, group := range byNode(vols) {
		if ctx.Err() != nil {
			break
		}
		slots <- struct{}{}
		prepared.Add(1)
		go func() {
			defer prepared.Done()
			defer func() { <-slots }()
			batch := s.prepareNode(ctx, sw, group, t, &tasks)
			// The node's volumes as one batch: the dispatcher orders them among themselves and
			// among the other nodes' lanes.
			s.opts.Dispatcher.Submit(batch...)
		}()
	}
	// Every task is counted in tasks once prepared is done, so the wait below sees them all.
	prepared.Wait()
	tasks.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	summary := t.summary
	summary.Cancelled = ctx.Err() != nil
	if len(t.notes) > 0 {
		summary.Incomplete = strings.Join(t.notes, "; ")
	}
	return summary
}

// prepareNode decides the actions of one node's volumes and returns their tasks, each counted in
// tasks until its Done. A panic while preparing fails the node's remaining volumes, not the sweep.
func (s *Sweeper) prepareNode(ctx context.Context, sw scheduler.Sweep, vols []planner.Volume, t *tally, tasks *sync.WaitGroup) (batch []dispatch.Task) {
	batch = make([]dispatch.Task, 0, len(vols))
	next := 0
	defer func() {
		if r := recover(); r != nil {
			s.opts.Metrics.sweepPanicked(sw.Trigger)
			klog.FromContext(ctx).Error(nil, "Preparing a volume panicked; the node's remaining volumes fail",
				"pv", vols[next].PVName, "node", vols[next].NodeName, "panic", r, "stack", string(debug.Stack()))
			for range vols[next:] {
				t.add(outcomeFailed)
			}
			t.note(fmt.Sprintf("preparing volume %s panicked: %v", vols[next].PVName, r))
		}
	}()
	if _, _, err := s.opts.Targets.Target(vols[0].Driver, vols[0].NodeName); err != nil {
		t.note(fmt.Sprintf("no usable sidecar of %s on node %s: %v", vols[0].Driver, vols[0].NodeName, err))
	}
	for ; next < len(vols); next++ {
		v := vols[next]
		if ctx.Err() != nil {
			return batch
		}
		w, task, o := s.prepare(ctx, sw, v)
		if w == nil {
			t.add(o)
			continue
		}
		w.tally, w.tasks = t, tasks
		task.Run, task.Done = w.run, w.done
		tasks.Add(1)
		batch = append(batch, task)
	}
	return batch
}

// nothingToDo reports whether a task's error says that there is nothing to act on, rather than
// that acting failed: the volume is not staged on the node, or the driver does not implement the
// call.
func nothingToDo(err error) bool {
	return err != nil && (errors.Is(err, probe.ErrNotStaged) || errors.Is(err, probe.ErrUnsupported))
}

// byNode splits vols by driver and node, keeping the planner's order within and between nodes.
// The planner sorts by node, so a node's volumes are usually one run of vols, handed out as a
// part of vols rather than copied; only when a driver and node come back after another's (a
// sweep over several drivers) are the groups gathered in new slices.
func byNode(vols []planner.Volume) [][]planner.Volume {
	var groups [][]planner.Volume
	seen := map[[2]string]bool{}
	start := 0
	for i := range vols {
		if i > start && (vols[i].Driver != vols[start].Driver || vols[i].NodeName != vols[start].NodeName) {
			groups = append(groups, vols[start:i:i])
			start = i
		}
		if i == start {
			key := [2]string{vols[i].Driver, vols[i].NodeName}
			if seen[key] {
				return byNodeGathered(vols)
			}
			seen[key] = true
		}
	}
	if start < len(vols) {
		groups = append(groups, vols[start:len(vols):len(vols)])
	}
	return groups
}

// byNodeGathered is byNode for volumes whose drivers and nodes are not in runs.
func byNodeGathered(vols []planner.Volume) [][]planner.Volume {
	index := map[[2]string]int{}
	var groups [][]planner.Volume
	for _, v := range vols {
		key := [2]string{v.Driver, v.NodeName}
		i, ok := index[key]
		if !ok {
			i = len(groups)
			index[key] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], v)
	}
	return groups
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
		if err := trigger.RecordHandled(ctx, s.opts.Client, sw); err != nil {
			logger.Error(err, "Restart sweep finished but its marker could not be recorded; it will run again")
			return false
		}
		return true
	}
	return false
}

// plan selects the sweep's volumes from the caches, asking the sidecars only for drivers whose
// volumes have no VolumeAttachment.
func (s *Sweeper) plan(ctx context.Context, sw scheduler.Sweep) ([]planner.Volume, []planner.Skipped, error) {
	p := s.opts.Planner
	switch sw.Trigger {
	case scheduler.TriggerRestart:
		if p.AttachRequired(sw.Driver) {
			vols, skipped := p.NodeVolumes(sw.Driver, sw.Node)
			return vols, skipped, nil
		}
		return s.staged(ctx, sw.Driver, sw.Node, nil)
	default:
		if sw.PV != "" {
			driver, ok := p.PVDriver(sw.PV)
			if !ok || p.AttachRequired(driver) {
				vols, skipped := p.PVVolumes(sw.PV)
				return vols, skipped, nil
			}
			return s.stagedOnNodes(ctx, driver, func(pv string) bool { return pv == sw.PV })
		}
		if sw.StorageClass == "" && sw.Driver != "" && sw.Node != "" {
			if p.AttachRequired(sw.Driver) {
				vols, skipped := p.NodeVolumes(sw.Driver, sw.Node)
				return vols, skipped, nil
			}
			return s.staged(ctx, sw.Driver, sw.Node, nil)
		}
		vols, skipped := p.ClassVolumes(sw.StorageClass)
		inClass := func(pv string) bool { return p.InClass(pv, sw.StorageClass) }
		var errs []error
		for _, driver := range p.ClassDrivers(sw.StorageClass) {
			v, sk, err := s.stagedOnNodes(ctx, driver, inClass)
			vols, skipped = append(vols, v...), append(skipped, sk...)
			if err != nil {
				errs = append(errs, err)
			}
		}
		if sw.Node != "" || sw.Driver != "" {
			vols = filterVolumes(vols, func(v planner.Volume) bool {
				return (sw.Node == "" || v.NodeName == sw.Node) && (sw.Driver == "" || v.Driver == sw.Driver)
			})
		}
		return vols, skipped, errors.Join(errs...)
	}
}

// stagedOnNodes asks every sidecar of driver which volumes it has staged (see staged), at most
// Options.PrepareConcurrency nodes at once, as the nodes of a sweep are prepared: a sidecar that
// does not answer holds up its own node only, not every node after it. The volumes come back in
// the order of the nodes.
func (s *Sweeper) stagedOnNodes(ctx context.Context, driver string, keep func(pv string) bool) ([]planner.Volume, []planner.Skipped, error) {
	nodes := s.opts.Targets.Nodes(driver)
	type answer struct {
		vols    []planner.Volume
		skipped []planner.Skipped
		err     error
	}
	answers := make([]answer, len(nodes))
	slots := make(chan struct{}, s.opts.PrepareConcurrency)
	var wg sync.WaitGroup
	for i, node := range nodes {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			a := &answers[i]
			a.vols, a.skipped, a.err = s.staged(ctx, driver, node, keep)
		}()
	}
	wg.Wait()
	var vols []planner.Volume
	var skipped []planner.Skipped
	var errs []error
	for _, a := range answers {
		vols, skipped = append(vols, a.vols...), append(skipped, a.skipped...)
		if a.err != nil {
			errs = append(errs, a.err)
		}
	}
	return vols, skipped, errors.Join(errs...)
}

// staged asks the sidecar of driver on node which volumes it has staged, restricted to the PVs
// that keep accepts when keep is set. Drivers without VolumeAttachments have no other list of a
// node's volumes: when the sidecar cannot answer, the error says that the node's volumes are
// unknown, and a restart sweep is not complete.
func (s *Sweeper) staged(ctx context.Context, driver, node string, keep func(pv string) bool) ([]planner.Volume, []planner.Skipped, error) {
	target, _, err := s.opts.Targets.Target(driver, node)
	var staged []probe.StagedVolume
	if err == nil {
		staged, err = s.opts.Sidecars.ListStaged(ctx, target)
		s.opts.Metrics.callError(driver, err)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot list staged volumes", "driver", driver, "node", node)
		return nil, nil, fmt.Errorf("the staged volumes of %s on node %s could not be listed: %w", driver, node, err)
	}
	// The sidecar names the PVs it has read lately; the others are mapped here, by handle.
	var unnamed []string
	for _, v := range staged {
		if v.PV == "" && v.VolumeID != "" {
			unnamed = append(unnamed, v.VolumeID)
		}
	}
	byHandle := s.opts.Planner.PVNamesByHandle(driver, unnamed)
	var names []string
	for _, v := range staged {
		pv := v.PV
		if pv == "" {
			pv = byHandle[v.VolumeID]
		}
		if pv != "" && (keep == nil || keep(pv)) {
			names = append(names, pv)
		}
	}
	vols, skipped := s.opts.Planner.StagedVolumes(driver, node, names)
	return vols, skipped, nil
}

func filterVolumes(vols []planner.Volume, keep func(planner.Volume) bool) []planner.Volume {
	out := vols[:0]
	for _, v := range vols {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

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
	// restartPods hands pods found on the volume's dead mount to the Restarter.
	restartPods bool
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
	o, err := w.s.act(klog.NewContext(ctx, w.logger()), w.v, w.target, w.caps, w.in, w.action, w.restartPods)
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
		w.tally.add(outcomeSkipped)
		return
	}
	if r.Err != nil {
		w.s.failed(w.sweepCtx, w.v, r.Err)
		w.tally.add(outcomeFailed)
		return
	}
	w.mu.Lock()
	o := w.last
	w.mu.Unlock()
	w.tally.add(o)
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
	state := s.mem.get(v.PVName)
	if sw.Trigger == scheduler.TriggerSchedule && s.opts.Clock.Now().Before(state.recheckAt) {
		if base.V(3).Enabled() {
			volumeLogger().V(3).Info("Driver asked to check again later", "recheckAt", state.recheckAt)
		}
		return nil, dispatch.Task{}, outcomeSkipped
	}

	driver := driverTermOf(s.drivers, caps, addonsNode)
	w.in = v.PolicyInput(driver.info, policy.Trigger(sw.Trigger))
	in := &w.in
	if in.Driver.Name == driver.info.Name {
		in.Terms.Driver = driver.term
	}
	if in.Node == nil {
		in.Node = &policy.Node{Name: v.NodeName}
	}
	in.History = state.history
	d, err := s.opts.Policy.Decide(ctx, in)
	if err != nil {
		// Fail closed: the policy governs this volume and cannot say what to do with it, so the
		// volume is left alone (skipped, never decided by the built-in policy) and the operator
		// is told on its PVC; volume_healer_policy_evaluation_errors_total counts it.
		volumeLogger().Error(err, "Policy evaluation failed; the volume is left alone")
		s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumePolicyFailed,
			"The policy failed on this volume, which is left alone until the policy is fixed: %v", err)
		return nil, dispatch.Task{}, outcomeSkipped
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
	w.target, w.caps, w.action, w.restartPods = target, caps, action, !sw.AfterEviction
	return w, t, outcomeSkipped
}

// act probes, asks the policy again with the probe result, heals if it says so, and probes again
// to confirm. Pods found on the volume's dead mount are handed to the Restarter when restartPods
// is set. Errors are classified for the dispatcher.
func (s *Sweeper) act(ctx context.Context, v planner.Volume, target probe.Target, caps *probe.Capabilities, in policy.Input, action policy.Action, restartPods bool) (outcome, error) {
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
	if action == policy.ActionProbe {
		res, err := s.probe(ctx, v, target)
		if err != nil {
			return outcomeFailed, err
		}
		if res.Healthy() {
			s.clearStatus(ctx, v)
			return outcomeHealthy, nil
		}
		if res.Has(string(policy.HealthDataLoss)) {
			s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumeDataLoss, "Driver %s reports data loss on node %s: %s; not healed automatically, restore from a snapshot or replica", v.Driver, v.NodeName, describe(res.Health))
		}
		if res.HasReason(healerv1alpha1.ReasonStaleMountInPods) {
			s.podsMustRestart(v, res, s.opts.Clock.Now(), in, restartPods)
		}
		in.Probe = &policy.ProbeResult{Healthy: false, Health: policyHealth(res.Health), Healable: res.Healable, RecheckAfterSeconds: int64(res.RecheckAfter / time.Second)}
		in.History = s.mem.get(pv).history
		d, err := s.opts.Policy.Decide(ctx, &in)
		if err != nil {
			logger.Error(err, "Policy evaluation with the probe result failed; the volume is left alone")
			s.writeStatus(ctx, v, StatusUnhealthy, res.Health, "")
			s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumePolicyFailed,
				"Volume is unhealthy on node %s (%s); the policy failed on it, so it is left alone until the policy is fixed: %v", v.NodeName, describe(res.Health), err)
			return outcomeUnhealthy, nil
		}
		logger.V(2).Info("Decision after probe", "action", d.Action, "reason", d.Reason)
		if d.Action != policy.ActionHeal || !caps.Heal || !res.Healable || !s.mem.get(pv).offeredForHealing(gen) {
			s.writeStatus(ctx, v, StatusUnhealthy, res.Health, "")
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
		s.mem.recordFailure(pv)
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
		s.mem.recordFailure(pv)
		s.count(v.Driver, false, "pods_must_restart")
		s.writeStatus(ctx, v, StatusUnhealthy, healed.Health, "")
		s.setFailing(v, true)
		s.podsMustRestart(v, healed, start, in, restartPods)
		return outcomeUnhealthy, nil
	}
	if !confirm.Healthy() || !healed.Healthy() {
		s.mem.recordFailure(pv)
		s.count(v.Driver, false, "failed")
		return outcomeFailed, fmt.Errorf("volume still unhealthy after heal: %s", describe(confirm.Health))
	}
	s.mem.recordHeal(pv, s.opts.Clock.Now())
	s.count(v.Driver, false, "healed")
	s.writeStatus(ctx, v, StatusHealed, nil, "")
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
	in.Probe = &policy.ProbeResult{Healthy: false, Health: policyHealth(res.Health), Healable: res.Healable, RecheckAfterSeconds: int64(res.RecheckAfter / time.Second)}
	req := evict.Request{PV: v.PVName, Claim: claim, Node: v.NodeName, Driver: v.Driver, HealedAt: healedAt, Input: in}
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
		s.mem.recordFailure(v.PVName)
		s.count(v.Driver, true, errorResult(err))
		s.opts.Metrics.callError(v.Driver, err)
		return nil, dispatchError(err)
	}
	s.mem.recordProbe(v.PVName, v.Driver, s.opts.Clock.Now(), res, s.mem.generation(v.Driver, v.NodeName))
	result := "healthy"
	if !res.Healthy() {
		result = "unhealthy"
	}
	s.count(v.Driver, true, result)
	return res, nil
}

// failed reports a volume whose task ended in an error after the dispatcher's retries.
func (s *Sweeper) failed(ctx context.Context, v planner.Volume, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	klog.FromContext(ctx).Error(err, "Volume not healed", "pv", v.PVName, "node", v.NodeName, "driver", v.Driver)
	s.writeStatus(ctx, v, StatusHealFailed, nil, err.Error())
	s.setFailing(v, true)
	s.volumeEvent(v, corev1.EventTypeWarning, ReasonVolumeHealFailed, "Volume on node %s not healed: %v", v.NodeName, err)
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

func driverInfo(caps *probe.Capabilities, n *csiaddonsv1alpha1.CSIAddonsNode) policy.DriverInfo {
	d := policy.DriverInfo{
		Name: caps.Driver,
		Healer: policy.HealerCapabilities{
			Probe: caps.Probe, Heal: caps.Heal, ListVolumes: caps.ListVolumes, Attributes: caps.Attributes,
		},
		IdentityCapabilities: []string{},
	}
	if n != nil {
		d.IdentityCapabilities = append(d.IdentityCapabilities, n.Status.Capabilities...)
	}
	if d.Healer.Attributes == nil {
		d.Healer.Attributes = map[string]string{}
	}
	return d
}

// driverTerms remembers the driver part of the policy input, with its Rego form, for each
// capability answer and CSIAddonsNode: every volume of a node shares it. Entries are keyed by the
// objects themselves, which the capability cache and the target map replace rather than change,
// and the cache (policy.TermCache) is emptied when it outgrows maxDriverTerms, which bounds what
// replaced objects keep alive.
type driverTerms = policy.TermCache[driverKey, driverTerm]

// maxDriverTerms is more than the node plugins of the largest clusters Kubernetes supports.
const maxDriverTerms = 16384

type driverKey struct {
	caps *probe.Capabilities
	node *csiaddonsv1alpha1.CSIAddonsNode
}

type driverTerm struct {
	info policy.DriverInfo
	term policy.Term
}

func newDriverTerms() *driverTerms { return policy.NewTermCache[driverKey, driverTerm](maxDriverTerms) }

// driverTermOf returns the driver part of the input; its maps and slices are shared: read-only.
func driverTermOf(t *driverTerms, caps *probe.Capabilities, n *csiaddonsv1alpha1.CSIAddonsNode) driverTerm {
	return t.Get(driverKey{caps, n}, func() driverTerm {
		d := driverTerm{info: driverInfo(caps, n)}
		d.term = policy.DriverTerm(&d.info)
		return d
	})
}

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

func (s *Sweeper) observe(op string, start time.Time) {
	if m := s.opts.Metrics; m != nil {
		m.callDuration.WithLabelValues(op).Observe(s.opts.Clock.Since(start).Seconds())
	}
}

func (s *Sweeper) count(driver string, isProbe bool, result string) {
	m := s.opts.Metrics
	if m == nil {
		return
	}
	if isProbe {
		m.probes.WithLabelValues(driver, result).Inc()
		return
	}
	m.heals.WithLabelValues(driver, result).Inc()
}

func (s *Sweeper) setFailing(v planner.Volume, failing bool) {
	m := s.opts.Metrics
	claim := v.ClaimName()
	if m == nil || claim.Name == "" {
		return
	}
	if failing {
		m.healFailing.WithLabelValues(claim.Namespace, claim.Name, v.Driver).Set(1)
		return
	}
	m.healFailing.DeleteLabelValues(claim.Namespace, claim.Name, v.Driver)
	m.podsOnDeadMount(claim.Namespace, claim.Name, v.Driver, false, time.Time{})
}

// volumeEvent records an Event on the volume's PVC, or on the PV when no claim is known.
func (s *Sweeper) volumeEvent(v planner.Volume, eventType, reason, format string, args ...any) {
	var obj runtime.Object
	if pvc := v.Claim(); pvc != nil {
		obj = pvc
	} else {
		obj = v.Objects().PV
	}
	s.event(obj, eventType, reason, format, args...)
}

func (s *Sweeper) event(obj runtime.Object, eventType, reason, format string, args ...any) {
	if s.opts.Recorder != nil {
		s.opts.Recorder.Eventf(obj, eventType, reason, format, args...)
	}
}
