package integration

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/test/harness"
)

// evictFixture runs an Evictor against the suite's apiserver, on a fake clock for its budgets
// and backoff, recording its Events in the apiserver. The apiserver has no kubelet: an evicted
// pod stays with a deletionTimestamp, as it would while its containers stop.
type evictFixture struct {
	*fixture
	clock   *testingclock.FakeClock
	metrics *evict.Metrics
	reg     *prometheus.Registry
	evictor *evict.Evictor
}

func newEvictFixture(t *testing.T, name string, opts evict.Options) *evictFixture {
	t.Helper()
	f := &evictFixture{fixture: newFixture(t, name), clock: testingclock.NewFakeClock(time.Now()), reg: prometheus.NewRegistry()}
	f.metrics = evict.NewMetrics(f.reg)
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: f.Clientset.CoreV1().Events("")})
	t.Cleanup(broadcaster.Shutdown)
	engine, err := policy.NewEngine(context.Background(), policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts.Client, opts.Clock, opts.Metrics = f.Clientset, f.clock, f.metrics
	if opts.Policy == nil {
		opts.Policy = engine
	}
	opts.Recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "volume-healer"})
	e, err := evict.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.evictor = e
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("evictor: %v", err)
		}
	})
	return f
}

// optIn labels the namespace so that the built-in policy evicts its controller-owned pods.
func (f *evictFixture) optIn(ns string) {
	f.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, annotations.EvictPodsLabel)
	if _, err := f.Clientset.CoreV1().Namespaces().Patch(f.Ctx(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		f.t.Fatalf("opt namespace %s in: %v", ns, err)
	}
}

// claim creates a claim of the StorageClass class in ns and returns its request for node, healed
// at healedAt, with the policy input of a restart sweep's heal.
func (f *evictFixture) claim(ns, name, node string, healedAt time.Time) evict.Request {
	return f.claimOfClass(ns, name, node, "", healedAt)
}

func (f *evictFixture) claimOfClass(ns, name, node, class string, healedAt time.Time) evict.Request {
	f.t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if class != "" {
		pvc.Spec.StorageClassName = &class
	}
	f.Create(pvc)
	in := policy.Input{Trigger: policy.TriggerRestart, Volume: policy.Volume{PV: "pv-" + name, Driver: f.Driver,
		PVC: &policy.Claim{Namespace: ns, Name: name}}}
	if class != "" {
		in.Volume.StorageClass = &policy.StorageClass{Name: class}
	}
	return evict.Request{PV: "pv-" + name, Claim: types.NamespacedName{Namespace: ns, Name: name}, ClaimUID: pvc.UID,
		Node: node, Driver: f.Driver, HealedAt: healedAt, Input: in}
}

// pod creates a running pod on node that mounts claim, owned by a ReplicaSet when owned. It must
// be running: the API server evicts a pending pod without asking its disruption budget.
func (f *evictFixture) pod(ns, name, node, claim string, owned bool) *corev1.Pod {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "app", Image: "app", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
	if owned {
		isController := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: name + "-rs", UID: types.UID(name + "-rs-uid"), Controller: &isController}}
	}
	f.Create(p)
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := f.Clientset.CoreV1().Pods(ns).UpdateStatus(f.Ctx(), p, metav1.UpdateOptions{}); err != nil {
		f.t.Fatalf("mark pod %s/%s running: %v", ns, name, err)
	}
	return p
}

// evicted reports whether the pod was evicted: it is gone or terminating.
func (f *evictFixture) evicted(p *corev1.Pod) bool {
	f.t.Helper()
	got, err := f.Clientset.CoreV1().Pods(p.Namespace).Get(f.Ctx(), p.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		f.t.Fatalf("get pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return got.DeletionTimestamp != nil
}

// count returns volume_healer_evictions_total{result}.
func (f *evictFixture) count(result string) int {
	return int(f.metric("volume_healer_evictions_total", map[string]string{"result": result}))
}

// metric returns the value of the series of name with labels.
func (f *evictFixture) metric(name string, labels map[string]string) float64 {
	f.t.Helper()
	got, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	fams := map[string]*dto.MetricFamily{}
	for _, fam := range got {
		fams[fam.GetName()] = fam
	}
	v, _ := harness.MetricValue(fams, name, labels)
	return v
}

// waitEvent waits for an Event with reason on the object and returns its messages.
func (f *evictFixture) waitEvent(ns, kind, name, reason string) string {
	f.t.Helper()
	var msgs []string
	harness.Eventually(f.t, harness.EventWait, fmt.Sprintf("a %s Event on %s %s/%s", reason, kind, ns, name), func() (bool, string) {
		evs, _ := f.Events(ns, kind, name, reason)
		msgs = msgs[:0]
		for _, ev := range evs {
			msgs = append(msgs, ev.Message)
		}
		return len(evs) > 0, "none yet"
	})
	return strings.Join(msgs, "\n")
}

// TestEvictionBlockedByDisruptionBudget: a PodDisruptionBudget with maxUnavailable 0 refuses the
// eviction; the claim gets an EvictionBlocked Event naming the pod and the heal, the blocked
// metric counts it, the pod keeps running, and once the budget is gone the next try (after the
// backoff) evicts it, with an Event on the Pod and the claim naming the heal.
func TestEvictionBlockedByDisruptionBudget(t *testing.T) {
	f := newEvictFixture(t, "evpdb", evict.Options{BackoffBase: 10 * time.Second})
	f.optIn(f.AppNS)
	node := "evpdb-node"
	p := f.pod(f.AppNS, "evpdb-app", node, "evpdb-data", true)
	zero := intstr.FromInt32(0)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.AppNS, Name: "evpdb-app"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero, Selector: &metav1.LabelSelector{MatchLabels: p.Labels}},
	}
	f.Create(pdb)
	req := f.claim(f.AppNS, "evpdb-data", node, time.Now().Add(2*time.Second))
	f.evictor.Add(req)

	msg := f.waitEvent(f.AppNS, "PersistentVolumeClaim", "evpdb-data", evict.ReasonEvictionBlocked)
	if !strings.Contains(msg, "evpdb-app") || !strings.Contains(msg, "heal of volume pv-evpdb-data") {
		t.Errorf("EvictionBlocked Event = %q, want it to name the pod and the heal", msg)
	}
	if got := f.count(evict.ResultBlocked); got < 1 {
		t.Errorf("evictions_total{result=blocked} = %d, want >= 1", got)
	}
	if f.evicted(p) {
		t.Fatal("the pod was evicted although its disruption budget allows no disruption")
	}
	if got := f.count(evict.ResultEvicted); got != 0 {
		t.Errorf("evictions_total{result=evicted} = %d, want 0", got)
	}

	if err := f.Clientset.PolicyV1().PodDisruptionBudgets(f.AppNS).Delete(f.Ctx(), pdb.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The tries before the backoff has passed: none, the clock has not moved.
	time.Sleep(300 * time.Millisecond)
	if f.evicted(p) {
		t.Fatal("the blocked eviction was tried again before its backoff")
	}
	f.clock.Step(11 * time.Second)
	harness.Eventually(t, harness.EventWait, "the pod evicted after its budget was deleted", func() (bool, string) {
		return f.evicted(p), "still running"
	})
	podMsg := f.waitEvent(f.AppNS, "Pod", p.Name, evict.ReasonEvictedForStaleMount)
	claimMsg := f.waitEvent(f.AppNS, "PersistentVolumeClaim", "evpdb-data", evict.ReasonEvictedForStaleMount)
	for _, m := range []string{podMsg, claimMsg} {
		if !strings.Contains(m, "heal of volume pv-evpdb-data by "+f.Driver+" on node "+node) {
			t.Errorf("eviction Event %q does not name the heal that caused it", m)
		}
	}
}

// TestEvictionOncePerHeal: the pods on the healed node that use the claim and started before the
// heal are evicted once, however often the heal is reported; the pods of another claim or on
// another node, and a replacement started after the heal, are not.
func TestEvictionOncePerHeal(t *testing.T) {
	f := newEvictFixture(t, "evonce", evict.Options{})
	f.optIn(f.AppNS)
	node := "evonce-node"
	old1 := f.pod(f.AppNS, "evonce-a", node, "evonce-data", true)
	old2 := f.pod(f.AppNS, "evonce-b", node, "evonce-data", true)
	otherClaim := f.pod(f.AppNS, "evonce-other", node, "evonce-other", true)
	otherNode := f.pod(f.AppNS, "evonce-far", "evonce-node2", "evonce-data", true)
	// Creation times are whole seconds: the heal comes a second after the pods, the
	// replacement a second after the heal.
	time.Sleep(1100 * time.Millisecond)
	req := f.claim(f.AppNS, "evonce-data", node, time.Now())
	time.Sleep(1100 * time.Millisecond)
	replacement := f.pod(f.AppNS, "evonce-new", node, "evonce-data", true)

	f.evictor.Add(req)
	f.evictor.Add(req)
	harness.Eventually(t, harness.EventWait, "the two pods that ran on the dead mount evicted", func() (bool, string) {
		return f.evicted(old1) && f.evicted(old2), fmt.Sprintf("evicted: %d", f.count(evict.ResultEvicted))
	})
	// The heal reported again, as the next probe does while the evicted pods stop.
	later := req
	later.HealedAt = req.HealedAt.Add(500 * time.Millisecond)
	f.evictor.Add(later)
	harness.Eventually(t, harness.EventWait, "the evictor idle", func() (bool, string) { return f.evictor.Idle(), "busy" })
	if got := f.count(evict.ResultEvicted); got != 2 {
		t.Errorf("evictions_total{result=evicted} = %d, want 2: each pod once", got)
	}
	for _, p := range []*corev1.Pod{otherClaim, otherNode, replacement} {
		if f.evicted(p) {
			t.Errorf("pod %s was evicted; it does not run on the healed volume's dead mount", p.Name)
		}
	}
	if _, n := f.Events(f.AppNS, "PersistentVolumeClaim", "evonce-data", evict.ReasonEvictedForStaleMount); n != 2 {
		t.Errorf("%d %s Events on the claim, want 2", n, evict.ReasonEvictedForStaleMount)
	}
}

// TestEvictionWaitsForNotBefore: a recycle right after a node plugin's restart evicts nothing
// until its NotBefore (kubelet has not registered the restarted driver again before, and a pod
// evicted then cannot be unstaged), and evicts once the clock passes it.
func TestEvictionWaitsForNotBefore(t *testing.T) {
	f := newEvictFixture(t, "evlater", evict.Options{})
	f.optIn(f.AppNS)
	node := "evlater-node"
	old := f.pod(f.AppNS, "evlater-a", node, "evlater-data", true)
	time.Sleep(1100 * time.Millisecond) // creation times are whole seconds
	req := f.claim(f.AppNS, "evlater-data", node, time.Now())
	req.Remedy, req.Finding = policy.RemedyRecycle, "MountDisconnected"
	req.NotBefore = f.clock.Now().Add(3 * time.Second)

	f.evictor.Add(req)
	// The request is held, not dropped: the evictor stays busy with it.
	time.Sleep(500 * time.Millisecond)
	if f.evicted(old) {
		t.Fatalf("pod %s was evicted before the request's NotBefore", old.Name)
	}
	if f.evictor.Idle() {
		t.Fatal("the evictor dropped the request it must hold until its NotBefore")
	}
	f.clock.Step(3 * time.Second)
	harness.Eventually(t, harness.EventWait, "the pod on the dead mount evicted once NotBefore passed", func() (bool, string) {
		return f.evicted(old), fmt.Sprintf("evicted: %d", f.count(evict.ResultEvicted))
	})
}

// TestEvictionDryRun: dry-run evicts nothing, and records once per pod what it would evict.
func TestEvictionDryRun(t *testing.T) {
	f := newEvictFixture(t, "evdry", evict.Options{DryRun: true})
	f.optIn(f.AppNS)
	node := "evdry-node"
	p := f.pod(f.AppNS, "evdry-app", node, "evdry-data", true)
	req := f.claim(f.AppNS, "evdry-data", node, time.Now().Add(2*time.Second))
	f.evictor.Add(req)
	msg := f.waitEvent(f.AppNS, "Pod", p.Name, evict.ReasonEvictionDryRun)
	if !strings.Contains(msg, "would evict") {
		t.Errorf("dry-run Event = %q, want it to say what it would do", msg)
	}
	f.waitEvent(f.AppNS, "PersistentVolumeClaim", "evdry-data", evict.ReasonEvictionDryRun)
	req.HealedAt = req.HealedAt.Add(time.Second)
	f.evictor.Add(req)
	harness.Eventually(t, harness.EventWait, "the evictor idle", func() (bool, string) { return f.evictor.Idle(), "busy" })
	if f.evicted(p) {
		t.Error("dry-run evicted the pod")
	}
	if got := f.count(evict.ResultDryRun); got != 1 {
		t.Errorf("evictions_total{result=dry_run} = %d, want 1: each pod recorded once", got)
	}
	if got := f.count(evict.ResultEvicted); got != 0 {
		t.Errorf("evictions_total{result=evicted} = %d, want 0", got)
	}
}

// TestEvictionBudgetUnderBurst: 100 pods in 4 namespaces see dead mounts at once; no minute sees
// more evictions than the global budget (10) nor, in one namespace, than the namespace budget
// (4), and the rest follow minute by minute.
func TestEvictionBudgetUnderBurst(t *testing.T) {
	f := newEvictFixture(t, "evburst", evict.Options{PerMinute: 10, PerNamespacePerMinute: 4})
	node := "evburst-node"
	var namespaces []string
	for i := range 4 {
		ns := fmt.Sprintf("%s-ns%d", f.AppNS, i)
		f.Create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{annotations.EvictPodsLabel: "true"}}})
		namespaces = append(namespaces, ns)
	}
	var pods []*corev1.Pod
	var reqs []evict.Request
	for i := range 100 {
		pods = append(pods, f.pod(namespaces[i%4], fmt.Sprintf("app-%d", i), node, fmt.Sprintf("data-%d", i), true))
	}
	// The heal comes after every pod was created (creation times are whole seconds).
	healedAt := time.Now().Add(time.Second)
	for i, p := range pods {
		reqs = append(reqs, f.claim(p.Namespace, fmt.Sprintf("data-%d", i), node, healedAt))
	}
	for _, r := range reqs {
		f.evictor.Add(r)
	}
	// perNamespace counts the evicted pods by namespace.
	evicted := func() (int, map[string]int) {
		by := map[string]int{}
		n := 0
		for _, p := range pods {
			if f.evicted(p) {
				by[p.Namespace]++
				n++
			}
		}
		return n, by
	}
	throttled := func() int {
		return int(f.metric("volume_healer_evictions_throttled_total", nil))
	}
	for minute, want := range []int{10, 20, 30} {
		// Every pod not evicted yet is postponed by the budget before the minute is over.
		before := throttled()
		if minute == 0 {
			before = 0
		} else {
			f.clock.Step(time.Minute)
		}
		harness.Eventually(t, harness.EventWait, fmt.Sprintf("minute %d: %d pods evicted, the others postponed", minute, want), func() (bool, string) {
			return f.count(evict.ResultEvicted) == want && throttled()-before >= 100-want, fmt.Sprintf("evicted %d, postponed %d", f.count(evict.ResultEvicted), throttled()-before)
		})
		n, by := evicted()
		if n != want {
			t.Fatalf("minute %d: %d pods evicted, want %d (the global budget is 10 a minute)", minute, n, want)
		}
		for ns, c := range by {
			if c > 4*(minute+1) {
				t.Errorf("minute %d: %d pods evicted in namespace %s, over its budget of 4 a minute", minute, c, ns)
			}
		}
	}
}

// TestEvictionByDefaultPolicy: with the built-in policy, the controller-owned pods of a claim
// whose StorageClass opted in are evicted, once however often the heal is reported; a bare pod on
// the same claim, and the pods of a claim
// whose StorageClass and namespace did not opt in, are left alone, each with an Event that says
// why and tells the operator to restart it.
func TestEvictionByDefaultPolicy(t *testing.T) {
	f := newEvictFixture(t, "evpol", evict.Options{})
	node := "evpol-node"
	optedIn := "evpol-opted-in"
	f.Create(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: optedIn, Labels: map[string]string{annotations.EvictPodsLabel: "true"}}, Provisioner: f.Driver})
	f.Create(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "evpol-plain"}, Provisioner: f.Driver})
	t.Cleanup(func() {
		for _, sc := range []string{optedIn, "evpol-plain"} {
			if err := f.Clientset.StorageV1().StorageClasses().Delete(context.Background(), sc, metav1.DeleteOptions{}); err != nil {
				t.Errorf("delete StorageClass %s: %v", sc, err)
			}
		}
	})
	rs := f.pod(f.AppNS, "evpol-rs", node, "evpol-in", true)
	bare := f.pod(f.AppNS, "evpol-bare", node, "evpol-in", false)
	plain := f.pod(f.AppNS, "evpol-plain", node, "evpol-out", true)
	healedAt := time.Now().Add(2 * time.Second)
	in := f.claimOfClass(f.AppNS, "evpol-in", node, optedIn, healedAt)
	f.evictor.Add(in)
	f.evictor.Add(f.claimOfClass(f.AppNS, "evpol-out", node, "evpol-plain", healedAt))

	harness.Eventually(t, harness.EventWait, "the ReplicaSet's pod evicted", func() (bool, string) { return f.evicted(rs), "still running" })
	// The next probe reports the same dead mount while the evicted pod terminates.
	in.HealedAt = healedAt.Add(time.Second)
	f.evictor.Add(in)
	harness.Eventually(t, harness.EventWait, "the evictor idle", func() (bool, string) { return f.evictor.Idle(), "busy" })
	for _, p := range []*corev1.Pod{bare, plain} {
		if f.evicted(p) {
			t.Errorf("pod %s was evicted; the built-in policy leaves it alone", p.Name)
		}
	}
	if msg := f.waitEvent(f.AppNS, "Pod", bare.Name, evict.ReasonPodLeftOnDeadMount); !strings.Contains(msg, "NoController") || !strings.Contains(msg, "restart it") {
		t.Errorf("bare pod's Event = %q, want the policy's reason NoController and what to do", msg)
	}
	if msg := f.waitEvent(f.AppNS, "PersistentVolumeClaim", "evpol-out", evict.ReasonPodLeftOnDeadMount); !strings.Contains(msg, "NotOptedIn") || !strings.Contains(msg, plain.Name) {
		t.Errorf("claim's Event = %q, want the pod and the policy's reason NotOptedIn", msg)
	}
	if got := f.count(evict.ResultEvicted); got != 1 {
		t.Errorf("evictions_total{result=evicted} = %d, want 1: the ReplicaSet's pod, once", got)
	}
	if got := f.count(evict.ResultLeftAlone); got != 2 {
		t.Errorf("evictions_total{result=left_alone} = %d, want 2: each pod left alone once, however often reported", got)
	}
	if _, n := f.Events(f.AppNS, "Pod", rs.Name, evict.ReasonEvictedForStaleMount); n != 1 {
		t.Errorf("%d %s Events on pod %s, want 1", n, evict.ReasonEvictedForStaleMount, rs.Name)
	}
}

// TestEvictionAsksForAReprobe: once every pod on the healed node's dead mount was evicted, the
// volume is probed again after ReprobeAfter, so that its dead-mount flag clears when the
// replacement pods see the repaired mount; while the policy leaves a pod on the dead mount, it
// is not.
func TestEvictionAsksForAReprobe(t *testing.T) {
	reprobes := make(chan evict.Request, 4)
	f := newEvictFixture(t, "evre", evict.Options{ReprobeAfter: time.Minute, Reprobe: func(req evict.Request) { reprobes <- req }})
	f.optIn(f.AppNS)
	node := "evre-node"
	a := f.pod(f.AppNS, "evre-a", node, "evre-data", true)
	b := f.pod(f.AppNS, "evre-b", node, "evre-data", true)
	bare := f.pod(f.AppNS, "evre-bare", node, "evre-kept", false)
	// A claim with a pod the policy leaves alone listed before one it evicts: the first stays.
	mixedBare := f.pod(f.AppNS, "evre-mixed-a", node, "evre-mixed", false)
	mixedOwned := f.pod(f.AppNS, "evre-mixed-b", node, "evre-mixed", true)
	healedAt := time.Now().Add(2 * time.Second)
	f.evictor.Add(f.claim(f.AppNS, "evre-data", node, healedAt))
	f.evictor.Add(f.claim(f.AppNS, "evre-kept", node, healedAt))
	f.evictor.Add(f.claim(f.AppNS, "evre-mixed", node, healedAt))
	harness.Eventually(t, harness.EventWait, "the owned pods evicted and the evictor idle", func() (bool, string) {
		return f.evicted(a) && f.evicted(b) && f.evicted(mixedOwned) && f.evictor.Idle(), "not yet"
	})
	f.waitEvent(f.AppNS, "Pod", bare.Name, evict.ReasonPodLeftOnDeadMount)
	f.waitEvent(f.AppNS, "Pod", mixedBare.Name, evict.ReasonPodLeftOnDeadMount)
	select {
	case req := <-reprobes:
		t.Fatalf("re-probe of %s before ReprobeAfter", req.PV)
	case <-time.After(200 * time.Millisecond):
	}
	f.clock.Step(time.Minute)
	select {
	case req := <-reprobes:
		if req.PV != "pv-evre-data" || req.Node != node {
			t.Errorf("re-probe of %s on %s, want pv-evre-data on %s", req.PV, req.Node, node)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no re-probe after every pod on the dead mount was evicted")
	}
	select {
	case req := <-reprobes:
		t.Errorf("re-probe of %s, which has a pod the policy left on the dead mount", req.PV)
	case <-time.After(200 * time.Millisecond):
	}
}

// windowPolicy leaves every pod alone, for the reason OutsideMaintenanceWindow, until open is
// set; then the built-in policy decides, as the maintenance-window example policy does.
type windowPolicy struct {
	open    atomic.Bool
	builtin evict.Decider
}

func (w *windowPolicy) DecideRestart(ctx context.Context, in *policy.RestartInput) (policy.RestartDecision, error) {
	if !w.open.Load() {
		return policy.RestartDecision{Action: policy.RestartLeave, Reason: "OutsideMaintenanceWindow"}, nil
	}
	return w.builtin.DecideRestart(ctx, in)
}

// TestEvictionLeftAloneIsAskedAgain: a pod the policy left alone is asked about again at each
// report of the dead mount, with one Event while the answer stays the same, and is evicted once
// the policy says so (a maintenance window opening).
func TestEvictionLeftAloneIsAskedAgain(t *testing.T) {
	engine, err := policy.NewEngine(context.Background(), policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	window := &windowPolicy{builtin: engine}
	f := newEvictFixture(t, "evwin", evict.Options{Policy: window})
	f.optIn(f.AppNS)
	node := "evwin-node"
	p := f.pod(f.AppNS, "evwin-rs", node, "evwin-data", true)
	healedAt := time.Now().Add(2 * time.Second)
	req := f.claim(f.AppNS, "evwin-data", node, healedAt)
	f.evictor.Add(req)
	if msg := f.waitEvent(f.AppNS, "Pod", p.Name, evict.ReasonPodLeftOnDeadMount); !strings.Contains(msg, "OutsideMaintenanceWindow") {
		t.Errorf("pod's Event = %q, want the policy's reason", msg)
	}
	// The next probe reports the dead mount again, still outside the window.
	req.HealedAt = healedAt.Add(time.Second)
	f.evictor.Add(req)
	harness.Eventually(t, harness.EventWait, "the evictor idle", func() (bool, string) { return f.evictor.Idle(), "busy" })
	if f.evicted(p) {
		t.Fatal("the pod was evicted outside the maintenance window")
	}
	window.open.Store(true)
	req.HealedAt = healedAt.Add(2 * time.Second)
	f.evictor.Add(req)
	harness.Eventually(t, harness.EventWait, "the pod evicted once the window opened", func() (bool, string) { return f.evicted(p), "still running" })
	// The API server shows the pod evicted as soon as it accepts the eviction, a moment before
	// the evictor counts it.
	harness.Eventually(t, harness.EventWait, "the eviction counted", func() (bool, string) {
		return f.count(evict.ResultEvicted) > 0, "evictions_total{result=evicted} = 0"
	})
	harness.Eventually(t, harness.EventWait, "the evictor idle", func() (bool, string) { return f.evictor.Idle(), "busy" })
	if got := f.count(evict.ResultLeftAlone); got != 1 {
		t.Errorf("evictions_total{result=left_alone} = %d, want 1: one decision to leave, however often repeated", got)
	}
	if got := f.count(evict.ResultEvicted); got != 1 {
		t.Errorf("evictions_total{result=evicted} = %d, want 1", got)
	}
	if _, n := f.Events(f.AppNS, "Pod", p.Name, evict.ReasonPodLeftOnDeadMount); n != 1 {
		t.Errorf("%d %s Events on the pod, want 1", n, evict.ReasonPodLeftOnDeadMount)
	}
}
