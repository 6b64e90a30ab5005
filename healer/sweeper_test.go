package healer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/volume-healer/volume-healer/api/annotations"
	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/dispatch"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
)

// fakeSidecars keeps volume health in memory and counts calls.
type fakeSidecars struct {
	mu       sync.Mutex
	caps     probe.Capabilities
	health   map[string][]probe.Health // by PV; absent = healthy
	healable map[string]bool
	// kept are the volumes the driver says it keeps alive across restarts.
	kept    map[string]bool
	probes  map[string]int
	heals   map[string]int
	refresh int
	// dead are sidecar endpoints that refuse every call; onDead runs after each refusal.
	dead   map[string]bool
	onDead func()
	// endpoints records the endpoint of every call that reached a live sidecar.
	endpoints []string
	// capsDown fails every capabilities call as an unreachable sidecar does.
	capsDown bool
	// capsGate holds the capabilities calls of a node until its channel is closed.
	capsGate map[string]chan struct{}
	// notStaged are volumes the driver says are not staged on the node.
	notStaged map[string]bool
	// staged is what ListStaged answers, and stagedErr its error.
	staged    []probe.StagedVolume
	stagedErr error
	// afterHeal is a volume's health once healed, when a heal cannot make it healthy.
	afterHeal map[string][]probe.Health
	// healFails is how many more heals of a volume fail, as a driver's heal that errors does.
	healFails map[string]int
	// healCalls counts every heal call that reached a volume, failed or not.
	healCalls map[string]int
}

// reach fails a call to a dead endpoint as an unreachable sidecar does, and records the others.
func (f *fakeSidecars) reach(t probe.Target) error {
	if f.dead[t.Endpoint] {
		if f.onDead != nil {
			f.onDead()
		}
		return fmt.Errorf("%w: connection refused", probe.ErrUnreachable)
	}
	f.endpoints = append(f.endpoints, t.Endpoint)
	return nil
}

func (f *fakeSidecars) Capabilities(ctx context.Context, t probe.Target) (*probe.Capabilities, error) {
	f.mu.Lock()
	gate := f.capsGate[t.Node]
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.capsDown {
		return nil, fmt.Errorf("%w: connection refused", probe.ErrUnreachable)
	}
	c := f.caps
	return &c, nil
}

func (f *fakeSidecars) set(change func(*fakeSidecars)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

func (f *fakeSidecars) Probe(_ context.Context, t probe.Target, pv string) (*probe.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.reach(t); err != nil {
		return nil, err
	}
	if f.notStaged[pv] {
		return nil, fmt.Errorf("%w: rpc error: code = FailedPrecondition", probe.ErrNotStaged)
	}
	f.probes[pv]++
	return &probe.Result{Health: f.health[pv], Healable: f.healable[pv], Kept: f.kept[pv]}, nil
}

func (f *fakeSidecars) Heal(_ context.Context, t probe.Target, pv string) (*probe.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.reach(t); err != nil {
		return nil, err
	}
	if f.healCalls != nil {
		f.healCalls[pv]++
	}
	if f.healFails[pv] > 0 {
		f.healFails[pv]--
		return nil, fmt.Errorf("%w: the mounter did not start", probe.ErrUnreachable)
	}
	f.heals[pv]++
	if f.healable[pv] && !hasStatus(f.health[pv], "DATA_LOSS") {
		delete(f.health, pv)
		if after, ok := f.afterHeal[pv]; ok {
			f.health[pv] = after
		}
	}
	return &probe.Result{Health: f.health[pv], Healable: true}, nil
}

func (f *fakeSidecars) ListStaged(context.Context, probe.Target) ([]probe.StagedVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.staged, f.stagedErr
}

func (f *fakeSidecars) Refresh(string, string) { f.refresh++ }

func hasStatus(hs []probe.Health, s string) bool {
	for _, h := range hs {
		if h.Status == s {
			return true
		}
	}
	return false
}

type fixture struct {
	sweeper  *Sweeper
	sidecars *fakeSidecars
	client   client.Client
	recorder *record.FakeRecorder
	node     *csiaddonsv1alpha1.CSIAddonsNode
	targets  *TargetMap
	caches   planner.Caches
}

// newFixture builds a node with volumes v1..vN of driver rbd on node-a, all attached and bound,
// behind fake sidecars, with the real default policy and the real dispatcher.
func newFixture(t *testing.T, n int, dryRun bool) *fixture {
	t.Helper()
	return newFixtureDispatching(t, n, dryRun, dispatch.Options{Global: 4, PerDriver: 4, PerNode: 2, BackoffBase: time.Millisecond, BackoffMax: 4 * time.Millisecond, MaxAttempts: 2})
}

// newFixtureDispatching is newFixture with a dispatcher of those options.
func newFixtureDispatching(t *testing.T, n int, dryRun bool, dopts dispatch.Options) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := csiaddonsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	caches := planner.NewLocalCaches()
	node := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-a-rbd", Annotations: map[string]string{
			annotations.HealerRestart: "start-2", annotations.Endpoint: "127.0.0.1:9070",
		}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{Name: "rbd", NodeID: "node-a"}},
	}
	objs := []client.Object{node}
	for i := 1; i <= n; i++ {
		name := "v" + string(rune('0'+i))
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeSpec{
				ClaimRef:               &corev1.ObjectReference{Namespace: "app", Name: "claim-" + name},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "rbd", VolumeHandle: "h-" + name}},
			},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
		}
		va := &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: "va-" + name},
			Spec:       storagev1.VolumeAttachmentSpec{Attacher: "rbd", NodeName: "node-a", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
			Status:     storagev1.VolumeAttachmentStatus{Attached: true},
		}
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "claim-" + name}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: name}}
		for _, err := range []error{caches.Add(pv), caches.Add(va), caches.Add(pvc)} {
			if err != nil {
				t.Fatal(err)
			}
		}
		objs = append(objs, pvc.DeepCopy())
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	engine, err := policy.NewEngine(ctx, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatch.New(dopts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.Start(ctx) }()
	targets := NewTargetMap()
	targets.Set(node)
	sc := &fakeSidecars{
		caps:     probe.Capabilities{Driver: "rbd", Probe: true, Heal: true},
		health:   map[string][]probe.Health{},
		healable: map[string]bool{},
		probes:   map[string]int{},
		heals:    map[string]int{},
	}
	recorder := record.NewFakeRecorder(100)
	s, err := New(Options{
		Planner: planner.New(caches), Policy: engine, Sidecars: sc, Dispatcher: d,
		Targets: targets, Client: c, Recorder: recorder, DryRun: dryRun,
		RetryBase: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{sweeper: s, sidecars: sc, client: c, recorder: recorder, node: node, targets: targets, caches: caches}
}

func (f *fixture) restart() scheduler.Sweep {
	return scheduler.Sweep{Trigger: scheduler.TriggerRestart, Driver: "rbd", Node: "node-a",
		Source: client.ObjectKeyFromObject(f.node), Marker: trigger.RestartMarker(f.node), Fired: time.Now()}
}

func (f *fixture) events() string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

func TestRestartSweepHealsExactlyTheBrokenHealableVolumes(t *testing.T) {
	f := newFixture(t, 5, false)
	gone := []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = gone, true  // rbd-nbd died: healable
	f.sidecars.health["v2"], f.sidecars.healable["v2"] = gone, false // krbd: not healable
	f.sidecars.health["v3"], f.sidecars.healable["v3"] = []probe.Health{{Status: "DATA_LOSS", Reason: "DataLoss"}}, true
	f.sidecars.healable["v4"], f.sidecars.healable["v5"] = true, true // healthy

	ctx := context.Background()
	sum := f.sweeper.Run(ctx, f.restart())
	if sum.Volumes != 5 || sum.Probed != 5 || sum.Healed != 1 || sum.Unhealthy != 2 || sum.Failed != 0 {
		t.Fatalf("summary = %+v, want 5 probed, 1 healed, 2 unhealthy left alone", sum)
	}
	for pv, want := range map[string]int{"v1": 1, "v2": 0, "v3": 0, "v4": 0, "v5": 0} {
		if got := f.sidecars.heals[pv]; got != want {
			t.Errorf("heals of %s = %d, want %d", pv, got, want)
		}
	}
	if f.sidecars.probes["v1"] != 2 {
		t.Errorf("v1 probed %d times, want 2 (before and after the heal)", f.sidecars.probes["v1"])
	}
	want := `
# HELP volume_healer_volumes_unhealthy Volumes whose last probe found them unhealthy, by driver and health status (DEGRADED, INACCESSIBLE, DATA_LOSS).
# TYPE volume_healer_volumes_unhealthy gauge
volume_healer_volumes_unhealthy{driver="rbd",status="DATA_LOSS"} 1
volume_healer_volumes_unhealthy{driver="rbd",status="INACCESSIBLE"} 1
`
	if err := testutil.CollectAndCompare(f.sweeper, strings.NewReader(want)); err != nil {
		t.Errorf("unhealthy volumes gauge: %v", err)
	}
	events := f.events()
	for _, want := range []string{ReasonRestartSweepStarted, ReasonVolumeHealed, ReasonVolumeDataLoss, ReasonVolumeUnhealthy, ReasonRestartSweepFinished} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %s:\n%s", want, events)
		}
	}

	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.client.Get(ctx, client.ObjectKeyFromObject(f.node), &n); err != nil {
		t.Fatal(err)
	}
	if n.Annotations[annotations.HandledMarker] != "start-2" {
		t.Errorf("handled marker = %q, want start-2", n.Annotations[annotations.HandledMarker])
	}
	var pvc corev1.PersistentVolumeClaim
	if err := f.client.Get(ctx, client.ObjectKey{Namespace: "app", Name: "claim-v2"}, &pvc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pvc.Annotations[annotations.VolumeStatus], `"result":"unhealthy"`) {
		t.Errorf("claim-v2 status = %q, want unhealthy", pvc.Annotations[annotations.VolumeStatus])
	}
	if err := f.client.Get(ctx, client.ObjectKey{Namespace: "app", Name: "claim-v4"}, &pvc); err != nil {
		t.Fatal(err)
	}
	if _, ok := pvc.Annotations[annotations.VolumeStatus]; ok {
		t.Error("a healthy volume got a status annotation: a sweep would write every PVC")
	}
}

func TestHealThatPodsCannotSeeAsksForTheirRestart(t *testing.T) {
	f := newFixture(t, 1, false)
	f.sweeper.opts.Metrics = NewMetrics(prometheus.NewRegistry())
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountDisconnected"}}, true
	f.sidecars.afterHeal = map[string][]probe.Health{"v1": {{Status: "INACCESSIBLE", Reason: healerv1alpha1.ReasonStaleMountInPods, Message: "1 process in 1 mount namespace"}}}
	restarter := &recordingRestarter{}
	f.sweeper.opts.Restarter = restarter

	sum := f.sweeper.Run(context.Background(), f.restart())
	if sum.Healed != 0 || sum.Unhealthy != 1 || sum.Failed != 0 {
		t.Fatalf("summary = %+v, want the volume unhealthy, neither healed nor failed", sum)
	}
	if f.sidecars.heals["v1"] != 1 {
		t.Errorf("heals = %d, want 1: a second heal cannot reach the pods either", f.sidecars.heals["v1"])
	}
	events := f.events()
	if !strings.Contains(events, ReasonVolumePodsMustRestart) || !strings.Contains(events, "restart the pods on node node-a") {
		t.Errorf("events lack %s telling the operator to restart the pods:\n%s", ReasonVolumePodsMustRestart, events)
	}
	if strings.Contains(events, ReasonVolumeHealed) {
		t.Errorf("a heal that running pods cannot see was reported healed:\n%s", events)
	}
	var pvc corev1.PersistentVolumeClaim
	if err := f.client.Get(context.Background(), client.ObjectKey{Namespace: "app", Name: "claim-v1"}, &pvc); err != nil {
		t.Fatal(err)
	}
	if st := pvc.Annotations[annotations.VolumeStatus]; !strings.Contains(st, `"result":"unhealthy"`) || !strings.Contains(st, healerv1alpha1.ReasonStaleMountInPods) {
		t.Errorf("claim-v1 status = %q, want unhealthy with %s", st, healerv1alpha1.ReasonStaleMountInPods)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.heals.WithLabelValues("rbd", "pods_must_restart")); got != 1 {
		t.Errorf("heals_total{result=pods_must_restart} = %v, want 1", got)
	}
	since := testutil.ToFloat64(f.sweeper.opts.Metrics.deadMountSince.WithLabelValues("app", "claim-v1", "rbd"))
	if now := float64(time.Now().Unix()); since < now-60 || since > now+1 {
		t.Errorf("pods_on_dead_mount_since_timestamp_seconds = %v, want the heal's time, about %v", since, now)
	}
	// A later sweep finds the volume healthy (the pods were restarted): the series goes away.
	f.sidecars.health["v1"], f.sidecars.afterHeal = nil, nil
	f.sweeper.Run(context.Background(), f.restart())
	if n := testutil.CollectAndCount(f.sweeper.opts.Metrics.deadMountSince); n != 0 {
		t.Errorf("%d pods_on_dead_mount series after the volume was found healthy, want 0", n)
	}
	want := evict.Request{PV: "v1", Claim: types.NamespacedName{Namespace: "app", Name: "claim-v1"}, ClaimUID: pvc.UID, Node: "node-a", Driver: "rbd"}
	if len(restarter.reqs) != 1 {
		t.Fatalf("restart requests = %+v, want one for the claim's pods on node-a", restarter.reqs)
	}
	got := restarter.reqs[0]
	if got.HealedAt.IsZero() {
		t.Errorf("restart request %+v has no heal time: every pod would be a replacement", got)
	}
	got.HealedAt = time.Time{}
	if p := got.Input.Probe; got.Input.Volume.PV != "v1" || p == nil || len(p.Health) != 1 || p.Health[0].Reason != healerv1alpha1.ReasonStaleMountInPods {
		t.Errorf("restart request's policy input = %+v, want volume v1 with the probe that found the dead mount", got.Input)
	}
	if got.PV != want.PV || got.Claim != want.Claim || got.ClaimUID != want.ClaimUID || got.Node != want.Node || got.Driver != want.Driver {
		t.Errorf("restart request = %+v, want %+v", got, want)
	}
}

// recordingRestarter records the restart requests of a sweep; progress, when set, answers
// Progress (keyed pv/node), and Finish records and forgets.
type recordingRestarter struct {
	mu       sync.Mutex
	reqs     []evict.Request
	progress map[string]evict.Progress
	finished []string
}

func (r *recordingRestarter) Add(req evict.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	if r.progress == nil {
		r.progress = map[string]evict.Progress{}
	}
	if _, ok := r.progress[req.PV+"/"+req.Node]; !ok {
		r.progress[req.PV+"/"+req.Node] = evict.Progress{PV: req.PV, Node: req.Node, Remedy: req.Remedy, Finding: req.Finding, Since: req.HealedAt}
	}
}

func (r *recordingRestarter) Progress(pv, node string) (evict.Progress, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.progress[pv+"/"+node]
	return p, ok
}

func (r *recordingRestarter) Finish(pv, node string, recycled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.progress, pv+"/"+node)
	r.finished = append(r.finished, fmt.Sprintf("%s/%s recycled=%t", pv, node, recycled))
}

// set replaces the progress of pv on node.
func (r *recordingRestarter) set(p evict.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.progress == nil {
		r.progress = map[string]evict.Progress{}
	}
	r.progress[p.PV+"/"+p.Node] = p
}

func (r *recordingRestarter) finishes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.finished...)
}

func (r *recordingRestarter) requests() []evict.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]evict.Request(nil), r.reqs...)
}

func TestNotHealableVolumeIsNotOfferedAgainUntilRestart(t *testing.T) {
	f := newFixture(t, 1, false)
	f.sidecars.health["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}
	ctx := context.Background()
	f.sweeper.Run(ctx, f.restart())
	// Later probes answer healable, but the driver's "not healable" stands until its node plugin
	// restarts (its capabilities may then have changed).
	f.sidecars.healable["v1"] = true
	manual := scheduler.Sweep{Trigger: scheduler.TriggerManual, Driver: "rbd", Node: "node-a"}
	if sum := f.sweeper.Run(ctx, manual); sum.Unhealthy != 1 || f.sidecars.heals["v1"] != 0 {
		t.Fatalf("manual sweep: summary %+v, heals %d; want the volume left unhealthy, not healed", sum, f.sidecars.heals["v1"])
	}
	if sum := f.sweeper.Run(ctx, f.restart()); sum.Healed != 1 || f.sidecars.heals["v1"] != 1 {
		t.Fatalf("after a restart: summary %+v, heals %d; want one heal", sum, f.sidecars.heals["v1"])
	}
}

// A driver answers "not healable" while the node's mounts work and only pods with propagation
// None still see a dead mount (StaleMountInPods alone): no heal can reach those pods. That answer
// says nothing of the driver's ability to heal: when the mounter dies again once the pods were
// replaced, the volume must be healed, without waiting for a node plugin restart.
func TestStaleMountInPodsAloneDoesNotStopLaterHeals(t *testing.T) {
	f := newFixture(t, 1, false)
	restarter := &recordingRestarter{}
	f.sweeper.opts.Restarter = restarter
	ctx := context.Background()
	stale := []probe.Health{{Status: "INACCESSIBLE", Reason: healerv1alpha1.ReasonStaleMountInPods, Message: "1 process in 1 mount namespace"}}
	// The heal: the node's mount repaired, a None pod still on the dead one.
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountDisconnected"}}, true
	f.sidecars.afterHeal = map[string][]probe.Health{"v1": stale}
	if sum := f.sweeper.Run(ctx, f.restart()); sum.Unhealthy != 1 || f.sidecars.heals["v1"] != 1 {
		t.Fatalf("first sweep: summary %+v, heals %d; want one heal that leaves pods on the dead mount", sum, f.sidecars.heals["v1"])
	}
	// Before the pod is gone, a periodic probe gets the driver's answer for that state: not
	// healable (ProbeVolume says so when StaleMountInPods is all it found).
	f.sidecars.set(func(s *fakeSidecars) { s.health["v1"], s.healable["v1"], s.afterHeal = stale, false, nil })
	manual := scheduler.Sweep{Trigger: scheduler.TriggerManual, Driver: "rbd", Node: "node-a"}
	if sum := f.sweeper.Run(ctx, manual); sum.Unhealthy != 1 || f.sidecars.heals["v1"] != 1 {
		t.Fatalf("sweep while the pod still sees the dead mount: summary %+v, heals %d; want it unhealthy and no heal", sum, f.sidecars.heals["v1"])
	}
	// The pod was replaced; the new mounter dies: the staging mount is dead and healable again.
	f.sidecars.set(func(s *fakeSidecars) {
		s.health["v1"], s.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountDisconnected"}}, true
	})
	if sum := f.sweeper.Run(ctx, manual); sum.Healed != 1 || f.sidecars.heals["v1"] != 2 {
		t.Fatalf("sweep after the mounter died again: summary %+v, heals %d; want the volume healed a second time", sum, f.sidecars.heals["v1"])
	}
}

func TestDryRunCallsNothing(t *testing.T) {
	f := newFixture(t, 3, true)
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	sum := f.sweeper.Run(context.Background(), f.restart())
	if sum.WouldProbe != 3 || sum.Probed != 0 {
		t.Fatalf("summary = %+v, want 3 would-probe and nothing probed", sum)
	}
	if len(f.sidecars.probes)+len(f.sidecars.heals) != 0 {
		t.Fatalf("dry run made calls: probes %v heals %v", f.sidecars.probes, f.sidecars.heals)
	}
	if !strings.Contains(f.events(), "would probe 3") {
		t.Error("the sweep's Event does not report what a dry run would have done")
	}
}

func TestCancelledRestartSweepIsNotRecordedAsHandled(t *testing.T) {
	f := newFixture(t, 2, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sum := f.sweeper.Run(ctx, f.restart())
	if !sum.Cancelled {
		t.Fatalf("summary = %+v, want cancelled", sum)
	}
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.client.Get(context.Background(), client.ObjectKeyFromObject(f.node), &n); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Annotations[annotations.HandledMarker]; ok {
		t.Error("a cancelled restart sweep was recorded as handled: the next leader would not repeat it")
	}
}

// A node plugin that dies mid-sweep and comes back at a new address: the retries of the calls
// that failed must reach the new sidecar, or the replacement's restart sweep, which joins those
// retries, would never call it.
func TestRetryReachesTheReplacementSidecar(t *testing.T) {
	f := newFixture(t, 1, false)
	gone := []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = gone, true
	f.sidecars.dead = map[string]bool{"127.0.0.1:9070": true}
	moved := f.node.DeepCopy()
	moved.Annotations[annotations.Endpoint] = "127.0.0.1:9071"
	f.sidecars.onDead = func() { f.targets.Set(moved) }

	sum := f.sweeper.Run(context.Background(), f.restart())
	if sum.Healed != 1 || sum.Failed != 0 {
		t.Fatalf("summary = %+v, want v1 healed through the new sidecar", sum)
	}
	for _, e := range f.sidecars.endpoints {
		if e != "127.0.0.1:9071" {
			t.Errorf("a call went to %s, want every call after the move at 127.0.0.1:9071", e)
		}
	}
	if f.sidecars.heals["v1"] != 1 {
		t.Errorf("heals of v1 = %d, want 1", f.sidecars.heals["v1"])
	}
}

// A sweep was calling a volume when its node plugin went down: the call failed, and the volume
// backs off (20s here). The plugin's replacement registers at a new address, and its
// restart sweep heals the volume at once: the failure was the gone plugin's, not the new one's.
func TestRestartSweepIsNotHeldByFailuresOfTheGonePlugin(t *testing.T) {
	f := newFixtureDispatching(t, 1, false, dispatch.Options{BackoffBase: 20 * time.Second, BackoffMax: time.Hour, MaxAttempts: 1})
	gone := []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = gone, true
	f.sidecars.dead = map[string]bool{"127.0.0.1:9070": true}
	// The sidecar still answers its capabilities, then goes away before the probe.
	if sum := f.sweeper.Run(context.Background(), scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "v1"}); sum.Failed != 1 {
		t.Fatalf("summary of the sweep through the sidecar going away = %+v, want v1 failed", sum)
	}

	moved := f.node.DeepCopy()
	moved.Annotations[annotations.Endpoint] = "127.0.0.1:9071"
	moved.Annotations[annotations.HealerRestart] = "start-3"
	f.targets.Set(moved)
	f.node = moved
	sw := f.restart()
	sw.Fired = time.Now()
	start := time.Now()
	sum := f.sweeper.Run(context.Background(), sw)
	if sum.Healed != 1 {
		t.Fatalf("restart sweep summary after %s = %+v, want v1 healed at once, not after the backoff its failure through the gone sidecar earned",
			time.Since(start).Round(time.Millisecond), sum)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the restart sweep healed v1 after %s, want at once", took.Round(time.Millisecond))
	}
}

// The probe that follows the eviction of the pods on a volume's dead mount (a manual sweep of the
// PV, marked AfterEviction) restarts no pods while the evicted ones still stop, and clears the
// dead-mount flag once the replacement pods see the repaired mount.
func TestProbeAfterEvictionClearsTheDeadMountFlag(t *testing.T) {
	f := newFixture(t, 1, false)
	f.sweeper.opts.Metrics = NewMetrics(prometheus.NewRegistry())
	restarter := &recordingRestarter{}
	f.sweeper.opts.Restarter = restarter
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountDisconnected"}}, true
	f.sidecars.afterHeal = map[string][]probe.Health{"v1": {{Status: "INACCESSIBLE", Reason: healerv1alpha1.ReasonStaleMountInPods}}}
	f.sweeper.Run(context.Background(), f.restart())
	if len(restarter.reqs) != 1 {
		t.Fatalf("restart requests = %+v, want one after the heal", restarter.reqs)
	}
	reprobe := scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "v1", AfterEviction: true}

	// The evicted pods still stop: the driver still sees processes on the dead mount, and
	// answers, as driverkit's ProbeVolume does when that is all it finds, not healable.
	f.sidecars.set(func(s *fakeSidecars) { s.healable["v1"] = false })
	if sum := f.sweeper.Run(context.Background(), reprobe); sum.Probed != 1 {
		t.Fatalf("summary %+v, want v1 probed", sum)
	}
	if len(restarter.reqs) != 1 {
		t.Errorf("the probe after the eviction asked to restart pods again: %+v", restarter.reqs[1:])
	}
	if n := testutil.CollectAndCount(f.sweeper.opts.Metrics.deadMountSince); n != 1 {
		t.Errorf("%d pods_on_dead_mount series while pods still see the dead mount, want 1", n)
	}

	// The replacements see the repaired mount. The informer shows the claim's status annotation.
	var pvc corev1.PersistentVolumeClaim
	if err := f.client.Get(context.Background(), client.ObjectKey{Namespace: "app", Name: "claim-v1"}, &pvc); err != nil {
		t.Fatal(err)
	}
	if err := f.caches.Add(pvc.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	f.sidecars.set(func(s *fakeSidecars) { s.health["v1"] = nil })
	if sum := f.sweeper.Run(context.Background(), reprobe); sum.Probed != 1 {
		t.Fatalf("summary %+v, want v1 probed", sum)
	}
	if n := testutil.CollectAndCount(f.sweeper.opts.Metrics.deadMountSince); n != 0 {
		t.Errorf("%d pods_on_dead_mount series after the probe found the volume healthy, want 0", n)
	}
	if err := f.client.Get(context.Background(), client.ObjectKey{Namespace: "app", Name: "claim-v1"}, &pvc); err != nil {
		t.Fatal(err)
	}
	if st, ok := pvc.Annotations[annotations.VolumeStatus]; ok {
		t.Errorf("claim-v1 status = %q after the probe found it healthy, want none", st)
	}
}

// The probe after an eviction restarts no pods it finds on a dead mount (the evicted ones may
// still stop), but when the volume broke again since (its new mounter died) and the sweep heals
// it, the replacement pods with propagation None are on the mount that heal replaced: they must
// be handed to the Restarter like after any heal, or they stay on it until a periodic sweep.
func TestHealAfterEvictionRestartsThePodsItLeavesOnTheDeadMount(t *testing.T) {
	f := newFixture(t, 1, false)
	restarter := &recordingRestarter{}
	f.sweeper.opts.Restarter = restarter
	ctx := context.Background()
	stale := []probe.Health{{Status: "INACCESSIBLE", Reason: healerv1alpha1.ReasonStaleMountInPods}}
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountDisconnected"}}, true
	f.sidecars.afterHeal = map[string][]probe.Health{"v1": stale}
	f.sweeper.Run(ctx, f.restart())
	if len(restarter.reqs) != 1 {
		t.Fatalf("restart requests = %+v, want one after the first heal", restarter.reqs)
	}
	// The pods were evicted; before the probe that follows, the new mounter died.
	f.sidecars.set(func(s *fakeSidecars) {
		s.health["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountDisconnected"}}
	})
	reprobe := scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "v1", AfterEviction: true}
	if sum := f.sweeper.Run(ctx, reprobe); sum.Unhealthy != 1 || f.sidecars.heals["v1"] != 2 {
		t.Fatalf("probe after the eviction: summary %+v, heals %d; want a second heal that leaves pods on the dead mount", sum, f.sidecars.heals["v1"])
	}
	if len(restarter.reqs) != 2 {
		t.Fatalf("restart requests = %d, want a second one for the pods the second heal left on the dead mount", len(restarter.reqs))
	}
	if first, second := restarter.reqs[0].HealedAt, restarter.reqs[1].HealedAt; second.Before(first) {
		t.Errorf("second restart request's heal time %s is before the first's %s", second, first)
	}
}
