package healer

import (
	"context"
	"errors"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
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
	// PolicyChanged returns a channel that is closed when another policy revision serves: a
	// restart sweep with volumes the policy could not decide tries again then, not only after its
	// backoff. Default: the Policy's Changed method when it has one (policy.Engine does), else
	// only the backoff.
	PolicyChanged func() <-chan struct{}
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
	// Evict says that the Restarter may evict pods (evictions are configured on, and not in dry
	// run): the policy's input.remedies.evict, and the condition of a recycle. Default false.
	Evict bool
}

// Restarter restarts the pods on a node that a remedy of a volume needs restarted: those that
// still see its dead mount after a heal, or every pod using it there for a recycle.
type Restarter interface {
	// Add queues the request.
	Add(req evict.Request)
	// Progress says how far the remedy of volume pv on node has come, if one is known.
	Progress(pv, node string) (evict.Progress, bool)
	// Finish forgets the remedy of pv on node: its volume is healthy there again, or no longer
	// staged; recycled counts a finished recycle.
	Finish(pv, node string, recycled bool)
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
	tiers   tierWrites
	// statuses writes the claims' status annotations beside the volume tasks.
	statuses statusWrites
}

// New returns a Sweeper.
func New(opts Options) (*Sweeper, error) {
	if opts.Planner == nil || opts.Policy == nil || opts.Sidecars == nil || opts.Dispatcher == nil || opts.Targets == nil || opts.Client == nil {
		return nil, errors.New("healer: Planner, Policy, Sidecars, Dispatcher, Targets and Client are required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if c, ok := opts.Policy.(interface{ Changed() <-chan struct{} }); ok && opts.PolicyChanged == nil {
		opts.PolicyChanged = c.Changed
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
	s := &Sweeper{opts: opts, mem: newMemory(), drivers: newDriverTerms()}
	s.statuses.patch = s.patchStatus
	s.statuses.guard = func(ctx context.Context, f func()) {
		defer s.survive(ctx, goroutineStatusWrite, func(any) {})
		f()
	}
	return s, nil
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
