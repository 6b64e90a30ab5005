package evict

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/policy"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// ladder is an evictor with the built-in policy, a fake clientset whose eviction reactor records
// the evicted pods (or refuses them as a PodDisruptionBudget would), a fake clock and recorder.
type ladder struct {
	e       *Evictor
	cs      *fake.Clientset
	rec     *record.FakeRecorder
	metrics *Metrics

	mu      sync.Mutex
	evicted []string
	// refuse answers 429 to the eviction of the pods it names, as often as it says.
	refuse map[string]int
}

func pod(name, node, claim, owner string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))},
		Spec: corev1.PodSpec{NodeName: node, RestartPolicy: corev1.RestartPolicyAlways, Volumes: []corev1.Volume{{Name: "data",
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if owner != "" {
		ctrl := true
		p.OwnerReferences = []metav1.OwnerReference{{Kind: owner, Name: name + "-owner", Controller: &ctrl, APIVersion: "apps/v1"}}
	}
	return p
}

func newLadder(t *testing.T, optedIn bool, containers ContainerRestarter, objects ...runtime.Object) *ladder {
	t.Helper()
	rev, err := policy.Compile(context.Background(), policy.DefaultModules(), policy.CompileOptions{EvalTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: "stock.csi.example.com"}
	if optedIn {
		sc.Labels = map[string]string{"volume-healer.io/evict-pods": "true"}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}
	cs := fake.NewClientset(append(objects, sc, ns)...)
	l := &ladder{cs: cs, rec: record.NewFakeRecorder(200), metrics: NewMetrics(prometheus.NewRegistry()), refuse: map[string]int{}}
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.refuse[ev.Name] > 0 {
			l.refuse[ev.Name]--
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		l.evicted = append(l.evicted, ev.Name)
		return true, ev, nil
	})
	l.e, err = New(Options{Client: cs, Policy: rev, Recorder: l.rec, Metrics: l.metrics,
		Clock: clocktesting.NewFakeClock(t0), Containers: containers})
	if err != nil {
		t.Fatal(err)
	}
	// The fake clientset serves the typed eviction call through its reactors; the evictor's own
	// call goes through the REST client, which the fake does not have.
	l.e.evictPod = func(ctx context.Context, p *corev1.Pod) error {
		return cs.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
	}
	return l
}

func (l *ladder) evictedPods() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.evicted, ",")
}

// events drains the recorded Events.
func (l *ladder) events() string {
	var out []string
	for {
		select {
		case e := <-l.rec.Events:
			out = append(out, e)
		default:
			return strings.Join(out, "\n")
		}
	}
}

func recycleRequest(finding string) Request {
	in := policy.Input{Trigger: policy.TriggerRestart,
		Volume:   policy.Volume{PV: "pv-1", Driver: "stock.csi.example.com", StorageClass: &policy.StorageClass{Name: "fast"}},
		Remedies: policy.Remedies{Evict: true},
		Probe:    &policy.ProbeResult{Health: []policy.Health{{Status: policy.HealthInaccessible, Reason: finding}}}}
	return Request{PV: "pv-1", Claim: types.NamespacedName{Namespace: "shop", Name: "data"}, Node: "node-a", Driver: "stock.csi.example.com",
		HealedAt: t0, Input: in, Remedy: policy.RemedyRecycle, Finding: finding}
}

// A recycle evicts every pod on the node that uses the claim, and no other: not the claim's pod
// on another node, not the node's pod of another claim.
func TestRecycleEvictsOnlyThePodsOfTheClaimOnTheNode(t *testing.T) {
	l := newLadder(t, true, nil,
		pod("web-1", "node-a", "data", "ReplicaSet"), pod("db-0", "node-a", "data", "StatefulSet"),
		pod("web-2", "node-b", "data", "ReplicaSet"), pod("cache-1", "node-a", "other", "ReplicaSet"))
	req := recycleRequest("MountGone")
	l.e.Add(req)
	retry, _, cleared := l.e.process(context.Background(), req)
	if retry || !cleared {
		t.Fatalf("process = retry %t, cleared %t; want every pod evicted at once", retry, cleared)
	}
	if got := l.evictedPods(); got != "db-0,web-1" && got != "web-1,db-0" {
		t.Fatalf("evicted %q, want web-1 and db-0 only", got)
	}
	events := l.events()
	for _, want := range []string{ReasonVolumeRecycling + " Recycling the volume on node node-a (MountGone)", ReasonEvictedForRecycle + " Evicted pod web-1"} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %q:\n%s", want, events)
		}
	}
	p, ok := l.e.Progress("pv-1", "node-a")
	if !ok || p.Evicted != 2 || !p.Cleared || p.Remedy != policy.RemedyRecycle {
		t.Errorf("progress = %+v, %t; want 2 evicted, cleared", p, ok)
	}
	if got := testutil.ToFloat64(l.metrics.recycles.WithLabelValues(RecycleStarted)); got != 1 {
		t.Errorf("recycles started = %v, want 1", got)
	}
	if got := testutil.ToFloat64(l.metrics.evictions.WithLabelValues(ResultEvicted)); got != 2 {
		t.Errorf("evictions evicted = %v, want 2", got)
	}
	l.e.Finish("pv-1", "node-a", true)
	if got := testutil.ToFloat64(l.metrics.recycles.WithLabelValues(RecycleRecycled)); got != 1 {
		t.Errorf("recycles recycled = %v, want 1", got)
	}
	if _, ok := l.e.Progress("pv-1", "node-a"); ok {
		t.Error("progress still known after Finish")
	}
}

// A PodDisruptionBudget that refuses the eviction (429) blocks the recycle: Events
// EvictionBlocked and VolumeRecycleBlocked, the blocked metrics, a retry with backoff, and the
// eviction made on the retry once the budget allows it.
func TestRecycleBlockedByADisruptionBudget(t *testing.T) {
	l := newLadder(t, true, nil, pod("db-0", "node-a", "data", "StatefulSet"))
	l.refuse["db-0"] = 1
	req := recycleRequest("MountGone")
	l.e.Add(req)
	retry, after, cleared := l.e.process(context.Background(), req)
	if !retry || after != 0 || cleared {
		t.Fatalf("process = retry %t after %s cleared %t; want a retry with backoff", retry, after, cleared)
	}
	events := l.events()
	for _, want := range []string{ReasonEvictionBlocked, ReasonVolumeRecycleBlocked + " The recycle of the volume on node node-a (MountGone) cannot finish while these pods use it there; evictions refused by a PodDisruptionBudget: db-0"} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %q:\n%s", want, events)
		}
	}
	if p, _ := l.e.Progress("pv-1", "node-a"); p.Blocked != 1 || p.Cleared {
		t.Errorf("progress = %+v, want 1 blocked", p)
	}
	if got := testutil.ToFloat64(l.metrics.recycles.WithLabelValues(RecycleBlocked)); got != 1 {
		t.Errorf("recycles blocked = %v, want 1", got)
	}
	if got := testutil.ToFloat64(l.metrics.evictions.WithLabelValues(ResultBlocked)); got != 1 {
		t.Errorf("evictions blocked = %v, want 1", got)
	}
	retry, _, cleared = l.e.process(context.Background(), req)
	if retry || !cleared || l.evictedPods() != "db-0" {
		t.Fatalf("retry: process = retry %t cleared %t, evicted %q; want db-0 evicted", retry, cleared, l.evictedPods())
	}
	if p, _ := l.e.Progress("pv-1", "node-a"); p.Blocked != 0 || p.Evicted != 1 {
		t.Errorf("progress after the retry = %+v, want 1 evicted, none blocked", p)
	}
}

// A publish target that is no longer a mount recycles without the opt-in label, but a bare pod
// is never evicted: it stays, with Events, and the recycle is not cleared.
func TestRecycleOfAnUnmountedPublishTargetLeavesABarePod(t *testing.T) {
	l := newLadder(t, false, nil, pod("web-1", "node-a", "data", "ReplicaSet"), pod("debug", "node-a", "data", ""))
	req := recycleRequest("PublishTargetNotMounted")
	l.e.Add(req)
	_, _, cleared := l.e.process(context.Background(), req)
	if l.evictedPods() != "web-1" || cleared {
		t.Fatalf("evicted %q, cleared %t; want web-1 evicted and the bare pod left", l.evictedPods(), cleared)
	}
	events := l.events()
	for _, want := range []string{ReasonPodLeftOnDeadMount, ReasonVolumeRecycleBlocked, "debug (NoController)"} {
		if !strings.Contains(events, want) {
			t.Errorf("events lack %q:\n%s", want, events)
		}
	}
}

// Without the opt-in label, a recycle for a dead mount evicts nothing.
func TestRecycleWithoutOptInEvictsNothing(t *testing.T) {
	l := newLadder(t, false, nil, pod("web-1", "node-a", "data", "ReplicaSet"))
	req := recycleRequest("MountGone")
	l.e.Add(req)
	if _, _, cleared := l.e.process(context.Background(), req); cleared || l.evictedPods() != "" {
		t.Fatalf("evicted %q, cleared %t; want nothing evicted", l.evictedPods(), cleared)
	}
	if events := l.events(); !strings.Contains(events, "web-1 (NotOptedIn)") {
		t.Errorf("events do not say why web-1 stays:\n%s", events)
	}
}

// fakeContainers answers RestartContainers with err, or the container "app".
type fakeContainers struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (f *fakeContainers) RestartContainers(_ context.Context, driver, node, pv, podUID string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%s %s %s %s", driver, node, pv, podUID))
	if f.err != nil {
		return nil, f.err
	}
	return []string{"app"}, nil
}

func (f *fakeContainers) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func healRequest(at time.Time) Request {
	in := policy.Input{Trigger: policy.TriggerRestart,
		Volume:   policy.Volume{PV: "pv-1", Driver: "healer.csi.example.com", StorageClass: &policy.StorageClass{Name: "fast"}},
		Remedies: policy.Remedies{Heal: true, RestartContainers: true, Evict: true},
		Probe:    &policy.ProbeResult{Health: []policy.Health{{Status: policy.HealthInaccessible, Reason: "StaleMountInPods"}}, Healable: true}}
	return Request{PV: "pv-1", Claim: types.NamespacedName{Namespace: "shop", Name: "data"}, Node: "node-a", Driver: "healer.csi.example.com",
		HealedAt: at, Input: in, Remedy: policy.RemedyHeal, Finding: "StaleMountInPods"}
}

// After a heal, a pod on the stale mount has its containers restarted in place where the sidecar
// can: no eviction, the pod keeps its place.
func TestHealRestartsContainersInPlace(t *testing.T) {
	c := &fakeContainers{}
	l := newLadder(t, true, c, pod("web-1", "node-a", "data", "ReplicaSet"))
	req := healRequest(t0)
	l.e.Add(req)
	retry, _, cleared := l.e.process(context.Background(), req)
	if retry || !cleared || l.evictedPods() != "" {
		t.Fatalf("process = retry %t cleared %t evicted %q; want the pod restarted in place, not evicted", retry, cleared, l.evictedPods())
	}
	if c.count() != 1 || c.calls[0] != "healer.csi.example.com node-a pv-1 uid-web-1" {
		t.Errorf("sidecar calls = %v, want one for pod uid-web-1's containers on pv-1", c.calls)
	}
	if events := l.events(); !strings.Contains(events, ReasonContainersRestarted+" Restarted containers app in place") {
		t.Errorf("events lack %s:\n%s", ReasonContainersRestarted, events)
	}
	if got := testutil.ToFloat64(l.metrics.evictions.WithLabelValues(ResultContainersRestarted)); got != 1 {
		t.Errorf("evictions containers_restarted = %v, want 1", got)
	}
}

// A sidecar that cannot restart the containers (no runtime access, the pod does not use the
// volume there, a garbage answer, no answer in time) gets an error Event; the policy is asked
// again without that remedy and evicts the opted-in pod; the sidecar is not asked again for it.
func TestContainerRestartFailureFallsBackToEviction(t *testing.T) {
	for name, err := range map[string]error{
		"unimplemented":       errors.New("not supported by the driver: rpc error: code = Unimplemented desc = no CRI socket"),
		"failed precondition": errors.New("volume not staged on the node: rpc error: code = FailedPrecondition"),
		"garbage":             errors.New("malformed response: the answer names no container it stopped"),
		"hung":                errors.New("call timed out: rpc error: code = DeadlineExceeded"),
	} {
		t.Run(name, func(t *testing.T) {
			c := &fakeContainers{err: err}
			l := newLadder(t, true, c, pod("web-1", "node-a", "data", "ReplicaSet"))
			req := healRequest(t0)
			l.e.Add(req)
			if _, _, cleared := l.e.process(context.Background(), req); !cleared || l.evictedPods() != "web-1" {
				t.Fatalf("cleared %t, evicted %q; want web-1 evicted after the failed restart", cleared, l.evictedPods())
			}
			events := l.events()
			if !strings.Contains(events, ReasonContainerRestartFailed) || !strings.Contains(events, err.Error()) {
				t.Errorf("events lack %s with the error:\n%s", ReasonContainerRestartFailed, events)
			}
			if got := testutil.ToFloat64(l.metrics.evictions.WithLabelValues(ResultRestartFailed)); got != 1 {
				t.Errorf("evictions restart_failed = %v, want 1", got)
			}
			// A later report for the same pod (the eviction did not take yet) does not try the
			// sidecar again.
			l.e.handled = map[types.UID]handledPod{}
			later := healRequest(t0.Add(time.Minute))
			l.e.process(context.Background(), later)
			if c.count() != 1 {
				t.Errorf("sidecar asked %d times, want once: a failed restart is not retried for the pod", c.count())
			}
		})
	}
}

// restartAlways is a policy that always answers restartContainers.
type restartAlways struct{ asked []policy.RestartInput }

func (r *restartAlways) DecideRestart(_ context.Context, in *policy.RestartInput) (policy.RestartDecision, error) {
	r.asked = append(r.asked, *in)
	return policy.RestartDecision{Action: policy.RestartContainers, Reason: "Always"}, nil
}

// A policy that asks for a container restart where none is possible (a recycle) gets no restart
// and no eviction: the pod is left alone, with a reason saying so, and the policy was asked again
// with input.remedies.restartContainers false.
func TestRestartContainersWhereNonePossibleLeavesThePod(t *testing.T) {
	c := &fakeContainers{}
	l := newLadder(t, true, c, pod("web-1", "node-a", "data", "ReplicaSet"))
	pol := &restartAlways{}
	l.e.opts.Policy = pol
	req := recycleRequest("MountGone")
	req.Input.Remedies.RestartContainers = true
	l.e.Add(req)
	l.e.process(context.Background(), req)
	if c.count() != 0 || l.evictedPods() != "" {
		t.Fatalf("sidecar calls %d, evicted %q; want neither", c.count(), l.evictedPods())
	}
	if len(pol.asked) != 2 || pol.asked[0].Remedies.RestartContainers || pol.asked[0].Remedy != policy.RemedyRecycle || pol.asked[0].Finding != "MountGone" {
		t.Errorf("policy asked %+v; want twice, with remedy recycle, finding MountGone and restartContainers false", pol.asked)
	}
	if events := l.events(); !strings.Contains(events, "RestartContainersNotPossible") {
		t.Errorf("events do not say why the pod stays:\n%s", events)
	}
}

// A pod whose containers were restarted in place got a live mount then; a later failure of the
// node plugin kills that mount too, and its heal must restart the pod's containers again. The
// same heal reported again restarts nothing more.
func TestLaterHealRestartsContainersAgain(t *testing.T) {
	c := &fakeContainers{}
	l := newLadder(t, true, c, pod("web-1", "node-a", "data", "ReplicaSet"))
	first := healRequest(t0)
	l.e.Add(first)
	if _, _, cleared := l.e.process(context.Background(), first); !cleared || c.count() != 1 {
		t.Fatalf("first heal: cleared %t, %d sidecar calls; want the pod restarted once", cleared, c.count())
	}
	if _, _, cleared := l.e.process(context.Background(), first); !cleared || c.count() != 1 {
		t.Fatalf("first heal again: cleared %t, %d sidecar calls; want no second restart for the same heal", cleared, c.count())
	}
	clk := l.e.opts.Clock.(*clocktesting.FakeClock)
	clk.Step(10 * time.Minute)
	second := healRequest(clk.Now())
	l.e.Add(second)
	retry, _, cleared := l.e.process(context.Background(), second)
	if retry || !cleared || c.count() != 2 || l.evictedPods() != "" {
		t.Fatalf("second heal: retry %t cleared %t, %d sidecar calls, evicted %q; want the pod's containers restarted again, not evicted", retry, cleared, c.count(), l.evictedPods())
	}
}
