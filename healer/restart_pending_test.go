package healer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
)

// handledMarker reads the restart marker recorded on the fixture's CSIAddonsNode, "" when none.
func (f *fixture) handledMarker(t *testing.T) string {
	t.Helper()
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.client.Get(context.Background(), client.ObjectKeyFromObject(f.node), &n); err != nil {
		t.Fatal(err)
	}
	return n.Annotations[annotations.HandledMarker]
}

// runAsync runs a sweep of sw in the background; the summary arrives on the channel.
func (f *fixture) runAsync(ctx context.Context) <-chan Summary {
	done := make(chan Summary, 1)
	sw := f.restart()
	go func() { done <- f.sweeper.Run(ctx, sw) }()
	return done
}

// summaryOf waits for the summary of a sweep started in the background, failing with notDone
// after 10 seconds.
func summaryOf(t *testing.T, done <-chan Summary, notDone string) Summary {
	t.Helper()
	select {
	case sum := <-done:
		return sum
	case <-time.After(10 * time.Second):
		t.Fatal(notDone)
		return Summary{}
	}
}

// waitEvents collects the recorder's Events until one contains want, failing after 10 seconds.
func (f *fixture) waitEvents(t *testing.T, want string) string {
	t.Helper()
	var seen []string
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-f.recorder.Events:
			seen = append(seen, e)
			if strings.Contains(e, want) {
				return strings.Join(seen, "\n")
			}
		case <-deadline:
			t.Fatalf("no Event containing %q within 10s; got:\n%s", want, strings.Join(seen, "\n"))
		}
	}
}

// A restart whose sidecar cannot be reached yet (starting, TokenReview down, a NetworkPolicy) must
// not be recorded as handled: its volumes were never looked at. The sweep says it is pending, is
// tried again, and is recorded only once a try reaches every volume.
func TestRestartSweepWithUnreachableSidecarIsRetriedUntilItAnswers(t *testing.T) {
	f := newFixture(t, 2, false)
	reg := prometheus.NewRegistry()
	f.sweeper.opts.Metrics = NewMetrics(reg)
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	f.sidecars.capsDown = true

	done := f.runAsync(context.Background())
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "2 of 2 volumes failed") {
		t.Errorf("the pending Event does not say why:\n%s", events)
	}
	f.waitEvents(t, ReasonRestartSweepPending) // a second try, still unreachable
	if m := f.handledMarker(t); m != "" {
		t.Fatalf("restart recorded as handled (%q) while its sidecar could not be reached", m)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.restartsPending.WithLabelValues("rbd")); got != 1 {
		t.Errorf("volume_healer_restart_sweeps_pending{driver=rbd} = %v while pending, want 1", got)
	}

	f.sidecars.set(func(s *fakeSidecars) { s.capsDown = false })
	sum := summaryOf(t, done, "the restart sweep did not finish after the sidecar answered")
	if sum.Incomplete != "" || sum.Healed != 1 || sum.Failed != 0 {
		t.Fatalf("summary %+v, want complete with v1 healed", sum)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q after the sweep completed, want %q", m, f.restart().Marker)
	}
	f.waitEvents(t, ReasonRestartSweepFinished)
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.restartsPending.WithLabelValues("rbd")); got != 0 {
		t.Errorf("volume_healer_restart_sweeps_pending{driver=rbd} = %v once complete, want 0", got)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.restartRetries.WithLabelValues("rbd")); got < 2 {
		t.Errorf("volume_healer_restart_sweep_retries_total{driver=rbd} = %v, want at least 2", got)
	}
}

// For a driver without VolumeAttachments the sidecar's list is the only list of a node's
// volumes: a list that failed is not an empty node.
func TestRestartSweepWhoseStagedListFailedIsNotEmpty(t *testing.T) {
	f := newFixture(t, 2, false)
	driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "rbd"}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)}}
	if err := f.caches.Add(driver); err != nil {
		t.Fatal(err)
	}
	f.sidecars.stagedErr = fmt.Errorf("%w: connection refused", probe.ErrUnreachable)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := f.runAsync(ctx)
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "staged volumes of rbd on node node-a could not be listed") {
		t.Errorf("the pending Event does not say why:\n%s", events)
	}
	if m := f.handledMarker(t); m != "" {
		t.Fatalf("restart recorded as handled (%q) with its node's volumes unknown", m)
	}

	f.sidecars.set(func(s *fakeSidecars) {
		s.stagedErr = nil
		s.staged = []probe.StagedVolume{{PV: "v1"}, {PV: "v2"}}
	})
	sum := summaryOf(t, done, "the restart sweep did not finish once the sidecar listed its volumes")
	if sum.Incomplete != "" || sum.Volumes != 2 || sum.Probed != 2 {
		t.Fatalf("summary %+v, want both staged volumes probed", sum)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q, want %q", m, f.restart().Marker)
	}
}

// An incomplete restart sweep stops trying when the node plugin restarts again (the new restart
// has its own sweep) or when the controller stops (leadership lost); neither records the old
// marker.
func TestIncompleteRestartSweepStops(t *testing.T) {
	t.Run("superseded by a new restart", func(t *testing.T) {
		f := newFixture(t, 1, false)
		f.sidecars.capsDown = true
		done := f.runAsync(context.Background())
		f.waitEvents(t, ReasonRestartSweepPending)
		again := f.node.DeepCopy()
		again.Annotations[annotations.HealerRestart] = "start-3"
		f.targets.Set(again)
		sum := summaryOf(t, done, "the old restart sweep kept trying after a new restart")
		if !strings.Contains(sum.Incomplete, "restarted again") {
			t.Errorf("summary %+v, want it incomplete because of the new restart", sum)
		}
		if m := f.handledMarker(t); m != "" {
			t.Errorf("handled marker %q recorded by a sweep that never completed", m)
		}
	})
	t.Run("controller stops", func(t *testing.T) {
		f := newFixture(t, 1, false)
		f.sidecars.capsDown = true
		ctx, cancel := context.WithCancel(context.Background())
		done := f.runAsync(ctx)
		f.waitEvents(t, ReasonRestartSweepPending)
		cancel()
		sum := summaryOf(t, done, "the restart sweep kept trying after its context ended")
		if !sum.Cancelled {
			t.Errorf("summary %+v, want cancelled", sum)
		}
		if m := f.handledMarker(t); m != "" {
			t.Errorf("handled marker %q recorded by a sweep that never completed", m)
		}
	})
}

// panickingPolicy stands in for a policy engine that hits a bug on some input.
type panickingPolicy struct{}

func (panickingPolicy) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	panic("assignment to entry in nil map")
}

// A sweep whose volume preparation panics fails that node's volumes, is counted, and is not
// recorded: the restart stays pending (tried again) instead of being recorded as handled or
// crashing the controller.
func TestPanickingSweepEndsUnrecorded(t *testing.T) {
	f := newFixture(t, 1, false)
	reg := prometheus.NewRegistry()
	f.sweeper.opts.Metrics = NewMetrics(reg)
	f.sweeper.opts.Policy = panickingPolicy{}
	ctx, cancel := context.WithCancel(context.Background())
	done := f.runAsync(ctx)
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "panicked") {
		t.Errorf("the pending Event does not say the sweep panicked:\n%s", events)
	}
	cancel()
	sum := summaryOf(t, done, "the sweep did not stop after its context ended")
	if !strings.Contains(sum.Incomplete, "panicked") || sum.Failed != 1 {
		t.Errorf("summary %+v, want v1 failed and the sweep incomplete because it panicked", sum)
	}
	if m := f.handledMarker(t); m != "" {
		t.Errorf("handled marker %q recorded by a sweep that panicked", m)
	}
	if n := testutil.ToFloat64(f.sweeper.opts.Metrics.sweepPanics.WithLabelValues("restart")); n < 1 {
		t.Errorf("volume_healer_sweep_panics_total{trigger=restart} = %v, want at least 1", n)
	}
}

// One node whose sidecar does not answer its capabilities call holds up its own volumes only:
// the other nodes' volumes of the same sweep are probed meanwhile.
func TestSlowNodeDoesNotHoldUpTheOthers(t *testing.T) {
	f := newFixture(t, 1, false)
	// A second node, node-b, with volume w1, whose sidecar hangs on capabilities.
	nodeB := f.node.DeepCopy()
	nodeB.Name, nodeB.Spec.Driver.NodeID = "node-b-rbd", "node-b"
	nodeB.Annotations[annotations.Endpoint] = "127.0.0.1:9080"
	f.targets.Set(nodeB)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "w1"},
		Spec: corev1.PersistentVolumeSpec{
			ClaimRef:               &corev1.ObjectReference{Namespace: "app", Name: "claim-w1"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "rbd", VolumeHandle: "h-w1"}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-w1"},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: "rbd", NodeName: "node-b", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
		Status:     storagev1.VolumeAttachmentStatus{Attached: true},
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "claim-w1"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "w1"}}
	for _, obj := range []runtime.Object{pv, va, pvc} {
		if err := f.caches.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	gate := make(chan struct{})
	f.sidecars.capsGate = map[string]chan struct{}{"node-b": gate}

	p := f.sweeper.opts.Planner
	slow, _ := p.NodeVolumes("rbd", "node-b")
	fast, _ := p.NodeVolumes("rbd", "node-a")
	if len(slow) != 1 || len(fast) != 1 {
		t.Fatalf("planned %d volumes on node-b and %d on node-a, want 1 and 1", len(slow), len(fast))
	}
	sw := scheduler.Sweep{Trigger: scheduler.TriggerManual, Driver: "rbd"}
	done := make(chan Summary, 1)
	go func() { done <- f.sweeper.submit(context.Background(), sw, append(slow, fast...), nil) }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		f.sidecars.mu.Lock()
		probed := f.sidecars.probes["v1"]
		f.sidecars.mu.Unlock()
		if probed > 0 {
			break
		}
		if time.Now().After(deadline) {
			close(gate)
			t.Fatal("node-a's volume was not probed while node-b's sidecar held its capabilities call")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(gate)
	sum := summaryOf(t, done, "the sweep did not end after node-b answered")
	if sum.Probed != 2 || sum.Failed != 0 {
		t.Errorf("summary %+v, want both volumes probed once node-b answered", sum)
	}
}

// failingFor is a policy that fails at run time on one volume's input (a division by zero on that
// namespace, say) and decides the others with the wrapped policy; fixed ends the failure.
type failingFor struct {
	pv    string
	next  Decider
	fixed *atomic.Bool
}

func (f failingFor) Decide(ctx context.Context, in *policy.Input) (policy.Decision, error) {
	if in.Volume.PV == f.pv && (f.fixed == nil || !f.fixed.Load()) {
		return policy.Decision{}, errors.New("eval_conflict_error: division by zero at policy.rego:7")
	}
	return f.next.Decide(ctx, in)
}

// A policy that fails on one volume's input fails closed for that volume only: it is left alone
// (never decided by the built-in policy) with a Warning Event on its PVC saying why, and the other
// volumes are decided and healed. The policy could not decide the volume, so the restart is not
// handled: it stays pending, and is recorded once the policy decides every volume.
func TestPolicyRuntimeFailureKeepsTheRestartPending(t *testing.T) {
	f := newFixture(t, 2, false)
	gone := []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}
	for _, pv := range []string{"v1", "v2"} {
		f.sidecars.health[pv], f.sidecars.healable[pv] = gone, true
	}
	var fixed atomic.Bool
	f.sweeper.opts.Policy = failingFor{pv: "v1", next: f.sweeper.opts.Policy, fixed: &fixed}
	done := f.runAsync(context.Background())
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "Warning "+ReasonVolumePolicyFailed) || !strings.Contains(events, "division by zero") {
		t.Errorf("no %s Event naming the policy's error:\n%s", ReasonVolumePolicyFailed, events)
	}
	if !strings.Contains(events, "1 volume(s) not decided by the policy") {
		t.Errorf("the pending Event does not say that the policy decided nothing for v1:\n%s", events)
	}
	if m := f.handledMarker(t); m != "" {
		t.Fatalf("restart recorded as handled (%q) while the policy could not decide v1", m)
	}
	if f.sidecars.calls("v1") != 0 {
		t.Errorf("v1 was called though the policy failed on it")
	}

	fixed.Store(true)
	sum := summaryOf(t, done, "the restart sweep did not finish after the policy was fixed")
	if sum.Incomplete != "" {
		t.Fatalf("summary %+v, want complete", sum)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q, want the restart recorded once the policy decides", m)
	}
}

// A controller that starts while the configured policy is broken and no accepted copy exists
// decides nothing: a restart sweep in that time is not recorded as handled. Once the policy is
// fixed, the pending sweep runs at once, not at its next backoff step, and is recorded.
func TestRestartSweepWaitsForADecidablePolicy(t *testing.T) {
	f := newFixture(t, 1, false)
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	// Only the policy's change can bring the next try within the test's time.
	f.sweeper.opts.RetryBase, f.sweeper.opts.RetryMax = time.Hour, time.Hour
	engine := f.sweeper.opts.Policy.(*policy.Engine)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	broken := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: policy.DefaultPolicyNamespace, Name: "site-policy", Labels: map[string]string{annotations.PolicyLabel: annotations.PolicyLabelValue}},
		Data:       map[string]string{"policy.rego": "package volumehealer\n\ndecision := {\"action\": \"probe\", \"reason\": \n"},
	}
	cs := k8sfake.NewClientset(broken)
	src, err := policy.NewConfigMapSource(cs, engine, policy.ConfigMapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	if err := src.Watch(factory); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	go func() { _ = src.Start(ctx) }()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return src.HasSynced(), nil
	}); err != nil {
		t.Fatal("the policy ConfigMaps were not read")
	}

	done := f.runAsync(ctx)
	f.waitEvents(t, ReasonRestartSweepPending)
	if m := f.handledMarker(t); m != "" {
		t.Fatalf("restart recorded as handled (%q) while no policy could decide", m)
	}
	if f.sidecars.calls("v1") != 0 {
		t.Errorf("v1 was called while no policy could decide")
	}

	if err := cs.CoreV1().ConfigMaps(broken.Namespace).Delete(ctx, broken.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sum := summaryOf(t, done, "the pending restart sweep did not run when the policy was fixed")
	if sum.Incomplete != "" || sum.Healed != 1 {
		t.Fatalf("summary %+v, want complete with v1 healed", sum)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q, want the restart recorded", m)
	}
}

// calls counts the probes and heals that reached pv.
func (f *fakeSidecars) calls(pv string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.probes[pv] + f.heals[pv]
}

// A volume the driver says is not staged on the node (unstaged since the planner saw it) is
// nothing to act on: skipped, no failure reported, and the restart is complete.
func TestNotStagedVolumeDoesNotKeepTheRestartPending(t *testing.T) {
	f := newFixture(t, 2, false)
	f.sidecars.notStaged = map[string]bool{"v1": true}
	f.sidecars.health["v2"], f.sidecars.healable["v2"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	done := make(chan Summary, 1)
	go func() { done <- f.sweeper.Run(context.Background(), f.restart()) }()
	sum := summaryOf(t, done, "the restart sweep kept trying for a volume that is not staged")
	if sum.Incomplete != "" || sum.Healed != 1 || sum.Skipped != 1 || sum.Failed != 0 {
		t.Fatalf("summary %+v, want v2 healed, v1 skipped, complete", sum)
	}
	if events := f.events(); strings.Contains(events, ReasonVolumeHealFailed) {
		t.Errorf("a not-staged volume was reported as failed:\n%s", events)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q, want the restart recorded", m)
	}
}

// A CSIAddonsNode that names no usable healer endpoint (the csi-addons sidecar recreated it
// without the healer sidecar's annotations) is not a deleted one: the restart stays pending, with
// an Event saying why, until the endpoint is back and a try completes.
func TestRestartSweepWithoutUsableEndpointStaysPending(t *testing.T) {
	f := newFixture(t, 1, false)
	f.sweeper.opts.Metrics = NewMetrics(prometheus.NewRegistry())
	recreated := f.node.DeepCopy()
	delete(recreated.Annotations, annotations.Endpoint)
	recreated.Annotations[annotations.CSIAddonsPod] = "pod-uid-1"
	recreated.Spec.Driver.EndPoint = "pod://csi-rbdplugin-x:9070"
	f.targets.Set(recreated)
	sw := f.restart()
	sw.Marker = trigger.RestartMarker(recreated)

	done := make(chan Summary, 1)
	go func() { done <- f.sweeper.Run(context.Background(), sw) }()
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "no usable sidecar of rbd on node node-a") {
		t.Errorf("the pending Event does not say that the node has no usable sidecar:\n%s", events)
	}
	events = f.waitEvents(t, ReasonRestartSweepPending) // tried again, not given up
	if strings.Contains(events, ReasonRestartSweepStopped) {
		t.Fatalf("the sweep stopped although its CSIAddonsNode exists:\n%s", events)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.restartsPending.WithLabelValues("rbd")); got != 1 {
		t.Errorf("volume_healer_restart_sweeps_pending{driver=rbd} = %v while pending, want 1", got)
	}

	back := recreated.DeepCopy()
	back.Annotations[annotations.Endpoint] = "127.0.0.1:9070"
	f.targets.Set(back)
	sum := summaryOf(t, done, "the restart sweep did not finish once the endpoint was back")
	if sum.Incomplete != "" || sum.Probed != 1 {
		t.Fatalf("summary %+v, want complete with v1 probed", sum)
	}
	if m := f.handledMarker(t); m != sw.Marker {
		t.Errorf("handled marker %q, want %q", m, sw.Marker)
	}
}

// A pending restart sweep stops, unrecorded and with an Event saying why, only when its
// CSIAddonsNode is really gone (the API server says NotFound) or its Node is.
func TestPendingRestartSweepStopsWhenItsObjectOrNodeIsGone(t *testing.T) {
	t.Run("CSIAddonsNode deleted", func(t *testing.T) {
		f := newFixture(t, 1, false)
		f.sidecars.capsDown = true
		done := f.runAsync(context.Background())
		f.waitEvents(t, ReasonRestartSweepPending)
		f.targets.Delete(client.ObjectKeyFromObject(f.node))
		if err := f.client.Delete(context.Background(), f.node.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		sum := summaryOf(t, done, "the sweep kept trying after its CSIAddonsNode was deleted")
		if !strings.Contains(sum.Incomplete, "was deleted") {
			t.Errorf("summary %+v, want it stopped because its CSIAddonsNode was deleted", sum)
		}
		f.waitEvents(t, ReasonRestartSweepStopped)
	})
	t.Run("Node gone", func(t *testing.T) {
		f := newFixture(t, 1, false)
		nodeGone := make(chan struct{})
		f.targets.SetNodeExists(func(node string) bool {
			select {
			case <-nodeGone:
				return node != "node-a"
			default:
				return true
			}
		})
		f.sidecars.capsDown = true
		done := f.runAsync(context.Background())
		f.waitEvents(t, ReasonRestartSweepPending)
		close(nodeGone)
		sum := summaryOf(t, done, "the sweep kept trying after its Node was gone")
		if !strings.Contains(sum.Incomplete, "Node node-a is gone") {
			t.Errorf("summary %+v, want it stopped because its Node is gone", sum)
		}
		events := f.waitEvents(t, ReasonRestartSweepStopped)
		if !strings.Contains(events, "Node node-a is gone") {
			t.Errorf("the stop Event does not say that the Node is gone:\n%s", events)
		}
		if m := f.handledMarker(t); m != "" {
			t.Errorf("handled marker %q recorded by a sweep that never completed", m)
		}
	})
}

// slowStaged answers ListStaged only once every expected call is in flight, or after its timeout
// (an unreachable sidecar's call timing out), and remembers how many calls were in flight at once.
type slowStaged struct {
	*fakeSidecars
	want    int
	timeout time.Duration
	mu      sync.Mutex
	calls   int // in flight
	most    int
	all     chan struct{}
}

func (s *slowStaged) ListStaged(ctx context.Context, t probe.Target) ([]probe.StagedVolume, error) {
	s.mu.Lock()
	s.calls++
	s.most = max(s.most, s.calls)
	if s.calls == s.want {
		close(s.all)
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.calls--
		s.mu.Unlock()
	}()
	select {
	case <-s.all:
	case <-time.After(s.timeout):
		return nil, fmt.Errorf("%w: ListStagedVolumes timed out", probe.ErrTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if t.Node == "node-a" {
		return []probe.StagedVolume{{PV: "v1"}}, nil
	}
	return nil, nil
}

// A sweep of a driver without VolumeAttachments asks its node plugins for their staged volumes
// concurrently: N sidecars that each take a timeout to answer cost about one timeout, not N.
func TestStagedVolumesOfManyNodesAreListedConcurrently(t *testing.T) {
	f := newFixture(t, 1, false)
	driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "rbd"}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)}}
	if err := f.caches.Add(driver); err != nil {
		t.Fatal(err)
	}
	const nodes = 8
	for i := 1; i < nodes; i++ {
		n := f.node.DeepCopy()
		n.Name = fmt.Sprintf("node-%c-rbd", 'a'+i)
		n.Spec.Driver.NodeID = fmt.Sprintf("node-%c", 'a'+i)
		n.Annotations[annotations.Endpoint] = fmt.Sprintf("127.0.0.%d:9070", i+1)
		f.targets.Set(n)
	}
	const timeout = 2 * time.Second
	slow := &slowStaged{fakeSidecars: f.sidecars, want: nodes, timeout: timeout, all: make(chan struct{})}
	f.sweeper.opts.Sidecars = slow

	start := time.Now()
	sum := f.sweeper.Run(context.Background(), scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "v1", Marker: "now"})
	elapsed := time.Since(start)
	if slow.most != nodes {
		t.Errorf("at most %d ListStagedVolumes calls in flight at once, want all %d", slow.most, nodes)
	}
	if elapsed >= timeout {
		t.Errorf("the sweep took %s: it waited for the sidecars one after another (each timing out after %s)", elapsed, timeout)
	}
	if sum.Volumes != 1 || sum.Probed != 1 || sum.Incomplete != "" {
		t.Errorf("summary %+v, want v1 found on node-a and probed", sum)
	}
}
