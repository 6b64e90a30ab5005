package realcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/test/harness"
)

// FaultKind is one way the soak breaks the node.
type FaultKind string

// The faults the soak injects.
const (
	// FaultDriverKill kills the node plugin's driver container (kill -9 of its first process):
	// every mounter of the container dies with it, kubelet restarts the container.
	FaultDriverKill FaultKind = "driver-kill"
	// FaultRollout restarts the node plugin's DaemonSet (kubectl rollout restart).
	FaultRollout FaultKind = "rollout-restart"
	// FaultMounterKill kills the FUSE daemon of one volume (kill -9).
	FaultMounterKill FaultKind = "mounter-kill"
	// FaultMounterStop stops the FUSE daemon of one volume (SIGSTOP) and lets it go on (SIGCONT)
	// a few seconds later: shorter than the driver's stat timeout the mount only stalls, longer
	// a probe finds it hung and the volume is healed.
	FaultMounterStop FaultKind = "mounter-stop"
	// FaultStagingUnmount detaches one volume's staging mount behind the driver's back (umount
	// -l on the node): the pods' bind mounts still work, the driver's checks find the staging
	// mount gone, and the heal starts the mounter again.
	FaultStagingUnmount FaultKind = "staging-unmount"
	// FaultControllerKill kills the controller's container (kill -9 of its first process).
	FaultControllerKill FaultKind = "controller-kill"
	// FaultBrokenPolicy stores a policy that does not compile (the install has no webhook to
	// refuse it), kills one volume's mounter once the controller rejected it, and stores the good
	// one back once the workloads recovered: the controller heals with the last good policy.
	FaultBrokenPolicy FaultKind = "broken-policy"
)

// FaultKinds are every kind the soak injects, in the order its summary prints them.
var FaultKinds = []FaultKind{FaultDriverKill, FaultRollout, FaultMounterKill, FaultMounterStop, FaultStagingUnmount, FaultControllerKill, FaultBrokenPolicy}

// SoakOptions configure a soak. The zero value of each field takes the default it documents.
type SoakOptions struct {
	// Seed chooses the faults, their order and their targets; the same seed on the same
	// workloads replays the same faults. Required (the caller prints it).
	Seed uint64
	// Duration is how long faults are injected; no fault starts after it. Default: 4m.
	Duration time.Duration
	// Faults caps the number of faults; 0: no cap.
	Faults int
	// RecoveryBound is how long every workload may take to write and read its volume again
	// once a fault is injected (a stopped mounter continued, a killed container restarted by
	// kubelet, whose crash-loop back-off grows with each kill). Default: 3m, TestRealNode's
	// bound: a periodic sweep of the class every 10s, a heal within the controller's
	// timeouts.heal (45s), an eviction and a new pod started on a loaded 2-core node; after a
	// controller kill, the killed process's Lease expiring (60s).
	RecoveryBound time.Duration
}

func (o *SoakOptions) defaults() {
	if o.Duration == 0 {
		o.Duration = 4 * time.Minute
	}
	if o.RecoveryBound == 0 {
		o.RecoveryBound = 3 * time.Minute
	}
}

// fault is one injected fault.
type fault struct {
	n    int
	kind FaultKind
	at   time.Time
	// claim is the volume a mounter fault targets; "" for the faults that hit every volume or none.
	claim string
	// broken are the claims whose volume the fault may leave dead: their pods may be evicted.
	broken map[string]bool
	// mustFail says that the workloads of the broken claims must see failed tries: the fault
	// kills their mounts.
	mustFail bool
	// staging is the staging mount a FaultStagingUnmount detached: recovered once it is back.
	staging string
	// restart says that the fault restarts the node plugin: the sweep of that restart must not
	// be recorded handled while a staging mount is dead.
	restart bool
}

func (f *fault) String() string {
	if f.claim != "" {
		return fmt.Sprintf("#%d %s of %s", f.n, f.kind, f.claim)
	}
	return fmt.Sprintf("#%d %s", f.n, f.kind)
}

// SoakReport is what a soak saw.
type SoakReport struct {
	Seed uint64
	// Faults counts the faults injected, by kind.
	Faults map[FaultKind]int
	// Heals and Evictions count the controller's VolumeHealed and EvictedForStaleMount Events
	// in the workloads' namespace; Replaced the workloads' pods that went away.
	Heals, Evictions, Replaced int
	// Violations are the broken invariants, Leaks the counts that grew; both must be empty.
	Violations, Leaks []string
	// Slowest is the fault after which the workloads took longest to write again, and how long.
	Slowest         string
	SlowestRecovery time.Duration
	// Layers is the most dead mounts kept under live ones on publish targets at a quiet point:
	// each heal of a mounted volume stacks its new mount over the dead one, which goes when
	// kubelet unpublishes the target (driverkit.Repair).
	Layers int
	// Memory says how the controller's and the sidecar's resident memory went over the soak.
	Memory string
	// Wall is the time from the first fault to the end of the last one's recovery.
	Wall time.Duration
}

// String prints the report as the soak's summary.
func (r *SoakReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak summary (seed %d, %s):\n", r.Seed, r.Wall.Round(time.Second))
	total := 0
	for _, k := range FaultKinds {
		fmt.Fprintf(&b, "  faults %-16s %d\n", k, r.Faults[k])
		total += r.Faults[k]
	}
	fmt.Fprintf(&b, "  faults total %d; heals %d; evictions %d; pods replaced %d\n", total, r.Heals, r.Evictions, r.Replaced)
	fmt.Fprintf(&b, "  slowest recovery %s after %s\n", r.SlowestRecovery.Round(100*time.Millisecond), r.Slowest)
	fmt.Fprintf(&b, "  memory: %s\n", r.Memory)
	fmt.Fprintf(&b, "  dead mounts stacked under live ones on publish targets, at most %d\n", r.Layers)
	fmt.Fprintf(&b, "  violations %d", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "\n    %s", v)
	}
	fmt.Fprintf(&b, "\n  leaks %d", len(r.Leaks))
	for _, l := range r.Leaks {
		fmt.Fprintf(&b, "\n    %s", l)
	}
	return b.String()
}

// Soak injects faults at random (seeded by o.Seed) into the node that runs the workloads, one at
// a time: after each, it waits until every workload writes and reads its volume again (within
// o.RecoveryBound) and the controller is idle, then samples the node's mounts, mounters, the
// components' file descriptors and memory. Invariants are checked every second meanwhile
// (invariants.go). Every fault is logged with its time and kind. The workloads must write when
// Soak starts; their pods with HostToContainer propagation must keep their pod.
func (e *Env) Soak(t harness.TB, workloads []*Workload, o SoakOptions) *SoakReport {
	t.Helper()
	o.defaults()
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	r := &SoakReport{Seed: o.Seed, Faults: map[FaultKind]int{}}
	var claims []string
	for _, w := range workloads {
		claims = append(claims, w.claims...)
	}
	inv := e.startInvariants(t, workloads)
	leaks := newLeakWatch(e)
	// The quiet point before the first fault is the baseline.
	e.waitQuiet(t)
	leaks.sample(t, "before the first fault", len(claims))

	begin := time.Now()
	// The summary is printed however the soak ends, a fault that did not recover included.
	defer func() {
		r.Wall = time.Since(begin)
		inv.stop()
		r.Violations = inv.violations()
		r.Replaced = inv.replaced()
		r.Leaks = leaks.verdict()
		r.Memory = leaks.memoryReport()
		r.Layers = leaks.layers()
		r.Heals = e.countEvents(t, "PersistentVolumeClaim", healer.ReasonVolumeHealed, begin)
		r.Evictions = e.countEvents(t, "Pod", evict.ReasonEvictedForStaleMount, begin)
		t.Logf("%s", r)
	}()
	var deck []FaultKind
	for n := 1; time.Since(begin) < o.Duration && (o.Faults == 0 || n <= o.Faults); n++ {
		// Every kind once in a shuffled deck, then the next deck: a short run covers every kind.
		if len(deck) == 0 {
			deck = slices.Clone(FaultKinds)
			rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		f := &fault{n: n, kind: deck[0], broken: map[string]bool{}}
		deck = deck[1:]
		switch f.kind {
		case FaultMounterKill, FaultMounterStop, FaultStagingUnmount, FaultBrokenPolicy:
			f.claim = claims[rng.IntN(len(claims))]
			f.broken[f.claim] = true
			f.mustFail = f.kind == FaultMounterKill || f.kind == FaultBrokenPolicy
		case FaultDriverKill, FaultRollout:
			for _, c := range claims {
				f.broken[c] = true
			}
			f.mustFail, f.restart = true, true
		}
		stop := 3*time.Second + time.Duration(rng.IntN(6))*time.Second
		before := e.podsOf(t, workloads)
		f.at = time.Now()
		inv.begin(f)
		t.Logf("soak: fault %s at %s", f, f.at.Format(time.RFC3339Nano))
		r.Faults[f.kind]++
		end := e.inject(t, f, stop)
		if injected := time.Since(f.at); injected > time.Second {
			t.Logf("soak: fault %s injected in %s", f, injected.Round(100*time.Millisecond))
		}
		took, last := e.waitRecovered(t, inv, workloads, f, before, o.RecoveryBound)
		end()
		t.Logf("soak: fault %s: every workload writes and reads again %s after it (last waited for: %s)", f, took.Round(100*time.Millisecond), last)
		if took > r.SlowestRecovery {
			r.SlowestRecovery, r.Slowest = took, fmt.Sprintf("%s (last waited for: %s)", f, last)
		}
		e.checkEvents(t, inv, workloads, f, before)
		e.waitQuiet(t)
		inv.end()
		leaks.sample(t, "after fault "+f.String(), len(claims))
	}
	return r
}

// inject breaks the node as f says (a stopped mounter goes on after stop) and returns what
// ends the fault once the workloads recovered.
func (e *Env) inject(t harness.TB, f *fault, stop time.Duration) (end func()) {
	t.Helper()
	switch f.kind {
	case FaultDriverKill:
		e.KillDriverContainer(t)
	case FaultRollout:
		e.RolloutRestart(t)
	case FaultMounterKill:
		e.signalMounter(t, f.claim, syscall.SIGKILL)
	case FaultMounterStop:
		pid := e.signalMounter(t, f.claim, syscall.SIGSTOP)
		select {
		case <-time.After(stop):
		case <-t.Context().Done():
		}
		// A probe that found the mount hung may have healed it already: its mounter is gone.
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("SIGCONT %d: %v", pid, err)
		}
		t.Logf("soak: fault %s: mounter %d continued after %s", f, pid, stop)
	case FaultStagingUnmount:
		f.staging = stagingMountOf(e.volumeHandle(t, f.claim))
		if f.staging == "" {
			t.Fatalf("no staging mount of claim %s on the node", f.claim)
		}
		if err := unix.Unmount(f.staging, unix.MNT_DETACH); err != nil {
			t.Fatalf("umount -l %s: %v", f.staging, err)
		}
		t.Logf("soak: fault %s: detached %s", f, f.staging)
	case FaultControllerKill:
		e.KillControllerContainer(t)
	case FaultBrokenPolicy:
		good := e.setPolicy(t, "package volumehealer\n\ndecision := {\n")
		e.waitPolicyRejected(t, true)
		e.signalMounter(t, f.claim, syscall.SIGKILL)
		return func() {
			e.setPolicy(t, good)
			e.waitPolicyRejected(t, false)
		}
	}
	return func() {}
}

// policyBound is how long the controller may take to load a policy change: its informer's
// watch delivers the ConfigMap within a second, and compiling the policy takes well under one.
const policyBound = 30 * time.Second

// waitPolicyRejected waits until the controller reports that the newest policy set is rejected
// (the last good revision serving), or that it loaded.
func (e *Env) waitPolicyRejected(t harness.TB, rejected bool) {
	t.Helper()
	want := map[bool]float64{true: 1, false: 0}[rejected]
	harness.Eventually(t, policyBound, fmt.Sprintf("volume_healer_policy_rejected %g", want), func() (bool, string) {
		fams, err := e.ControllerMetrics(t.Context())
		if err != nil {
			return false, err.Error()
		}
		v, ok := harness.MetricValue(fams, "volume_healer_policy_rejected", nil)
		return ok && v == want, fmt.Sprintf("%g (exposed: %t)", v, ok)
	})
}

// policyConfigMap is the chart's site policy ConfigMap and its key.
const (
	policyConfigMap = "volume-healer-policy"
	policyKey       = "policy.rego"
)

// setPolicy stores rego as the site policy and returns the policy it replaced.
func (e *Env) setPolicy(t harness.TB, rego string) string {
	t.Helper()
	cms := e.c.Clientset.CoreV1().ConfigMaps(healerNS)
	cm, err := cms.Get(t.Context(), policyConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%v", err)
	}
	old := cm.Data[policyKey]
	cm.Data[policyKey] = rego
	if _, err := cms.Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("store the policy: %v", err)
	}
	return old
}

// podsOf returns the running pods of the workloads by UID.
func (e *Env) podsOf(t harness.TB, workloads []*Workload) map[types.UID]corev1.Pod {
	t.Helper()
	out := map[types.UID]corev1.Pod{}
	for _, w := range workloads {
		pods, err := w.Pods(t.Context())
		if err != nil {
			t.Fatalf("%v", err)
		}
		for _, p := range pods {
			out[p.UID] = p
		}
	}
	return out
}

// podClaim is the claim of the workload pod's volume.
func podClaim(p *corev1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// waitRecovered waits, for at most bound from now (the fault injected), until the controller
// leads (after a controller kill) and every claim of the workloads has a running pod whose
// latest try succeeded and, for the claims f broke, whose pod saw the fault (a failed try after
// it, then a successful one) or replaced the pod that did. It returns how long that took after
// f began and what it waited for last (the slowest part of the recovery). A pod of a
// HostToContainer workload must not be replaced: it sees the healed mount in place.
func (e *Env) waitRecovered(t harness.TB, inv *invariants, workloads []*Workload, f *fault, before map[types.UID]corev1.Pod, bound time.Duration) (time.Duration, string) {
	t.Helper()
	ctx := t.Context()
	last := "nothing"
	harness.Eventually(t, bound, fmt.Sprintf("every workload to write and read its volume again after fault %s", f), func() (bool, string) {
		ok, state := e.recovered(ctx, inv, workloads, f, before)
		if !ok {
			last = state
		}
		return ok, state
	})
	took := time.Since(f.at)
	if f.restart {
		// The restart's sweep is recorded handled on the node's one CSIAddonsNode.
		e.WaitOneCSIAddonsNode(t, bound)
	}
	return took, last
}

// recovered is waitRecovered's condition.
func (e *Env) recovered(ctx context.Context, inv *invariants, workloads []*Workload, f *fault, before map[types.UID]corev1.Pod) (bool, string) {
	if f.kind == FaultControllerKill {
		// The killed process did not give its Lease up: the new one leads once it expired
		// (config.leaderElection.leaseDuration, 60s in the chart, then a retryPeriod of 5s).
		fams, err := e.ControllerMetrics(ctx)
		if err != nil {
			return false, err.Error()
		}
		if v, _ := harness.MetricValue(fams, "volume_healer_leader", nil); v != 1 {
			return false, "the restarted controller to lead (volume_healer_leader 0: the killed process's Lease has not expired)"
		}
	}
	if f.staging != "" && !slices.ContainsFunc(driverMounts(), func(m *mountinfo.Info) bool { return m.Mountpoint == f.staging }) {
		return false, "the staging mount " + f.staging + " is not back"
	}
	for _, w := range workloads {
		pods, err := w.Pods(ctx)
		if err != nil {
			return false, err.Error()
		}
		if len(pods) != len(w.claims) {
			return false, fmt.Sprintf("%s: %d running pods of %d", w.name, len(pods), len(w.claims))
		}
		for _, p := range pods {
			_, old := before[p.UID]
			if !old && w.propagation == corev1.MountPropagationHostToContainer {
				inv.violate("fault %s: pod %s of the HostToContainer workload %s was replaced; it must see the healed mount in place", f, p.Name, w.name)
			}
			tries, err := w.tries(ctx, p.Name)
			if err != nil {
				return false, err.Error()
			}
			if len(tries) == 0 || !tries[len(tries)-1].OK {
				return false, fmt.Sprintf("pod %s: last try %s", p.Name, lastTry(tries))
			}
			if old && f.mustFail && f.broken[podClaim(&p)] {
				o, err := w.outageOf(ctx, p.Name, f.at)
				if err != nil {
					return false, err.Error()
				}
				if o.firstFailure == nil || o.resumed == nil {
					return false, fmt.Sprintf("pod %s has not seen the fault yet (no failed try after it and a successful one after that)", p.Name)
				}
			}
		}
	}
	return true, ""
}

// healerPVCReasons are the Events by which the controller reports what it found or did with a
// claim's volume.
var healerPVCReasons = []string{healer.ReasonVolumeHealed, healer.ReasonVolumePodsMustRestart, healer.ReasonVolumeHealFailed,
	healer.ReasonVolumeDataLoss, healer.ReasonVolumeUnhealthy}

// eventBound is how long after the workloads recovered the controller's Event may take to be
// listed: it is written as the heal returns, before or while the workload retries.
const eventBound = time.Minute

// checkEvents checks that each claim whose pod failed a try after f has an Event of the
// controller since f: no workload left failing without an Event.
func (e *Env) checkEvents(t harness.TB, inv *invariants, workloads []*Workload, f *fault, before map[types.UID]corev1.Pod) {
	t.Helper()
	ctx := t.Context()
	for _, p := range before {
		w := workloadOf(workloads, &p)
		o, err := w.outageOf(ctx, p.Name, f.at)
		if err != nil {
			// The pod was evicted and its output went with it: the eviction has its own Event.
			continue
		}
		if o.firstFailure == nil {
			continue
		}
		claim := podClaim(&p)
		if err := harness.WaitFor(ctx, eventBound, "an Event of the controller on PVC "+claim, func() (bool, string) {
			n := 0
			for _, reason := range healerPVCReasons {
				n += e.eventsSince(t, "PersistentVolumeClaim", claim, reason, f.at)
			}
			return n > 0, "none since the fault"
		}); err != nil {
			inv.violate("fault %s: pod %s failed (%s: %s) and PVC %s has no Event of the controller: %v", f, p.Name, o.firstFailure.Op, o.firstFailure.Err, claim, err)
		}
	}
}

func workloadOf(workloads []*Workload, p *corev1.Pod) *Workload {
	for _, w := range workloads {
		if w.selector.Matches(labels.Set(p.Labels)) {
			return w
		}
	}
	return workloads[0]
}

// eventsSince counts the Events of reason on kind/name (any name when "") in the workloads'
// namespace last seen at or after since, each Event by its count.
func (e *Env) eventsSince(t harness.TB, kind, name, reason string, since time.Time) int {
	t.Helper()
	sel := map[string]string{"involvedObject.kind": kind, "reason": reason}
	if name != "" {
		sel["involvedObject.name"] = name
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		parts = append(parts, k+"="+sel[k])
	}
	list, err := e.c.Clientset.CoreV1().Events(appsNS).List(t.Context(), metav1.ListOptions{FieldSelector: strings.Join(parts, ",")})
	if err != nil {
		return 0
	}
	n := 0
	for _, ev := range list.Items {
		last := ev.LastTimestamp.Time
		if ev.EventTime.After(last) {
			last = ev.EventTime.Time
		}
		if !last.Before(since.Truncate(time.Second)) {
			n += int(max(ev.Count, 1))
		}
	}
	return n
}

// countEvents counts the Events of reason on objects of kind since.
func (e *Env) countEvents(t harness.TB, kind, reason string, since time.Time) int {
	return e.eventsSince(t, kind, "", reason, since)
}

// quietBound is how long the controller may take to be idle after the workloads recovered: an
// eviction's reprobe (remediation.reprobeAfter, 30s) and the class's next periodic sweep (10s),
// each with a probe bounded by timeouts.probe (10s).
const quietBound = 90 * time.Second

// deadMountGauge has a series for each claim whose volume was repaired while running pods still
// see its dead mount; it goes when a probe finds the volume healthy, once they were evicted.
const deadMountGauge = "volume_healer_pods_on_dead_mount_since_timestamp_seconds"

// waitQuiet waits until nothing is in flight: no workload pod terminating, the controller's
// dispatcher without calls in flight or queued, no restart sweep pending, and no claim with pods
// on a dead mount. A workload may write again while a pod with propagation None is still to be
// evicted: a detached staging mount's heal stops the old mounter, which that pod still uses, and
// its next try fails; the eviction belongs to the fault, not to the quiet time after it.
func (e *Env) waitQuiet(t harness.TB) {
	t.Helper()
	ctx := t.Context()
	harness.Eventually(t, quietBound, "the node and the controller to be quiet", func() (bool, string) {
		pods, err := e.c.Clientset.CoreV1().Pods(appsNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
				return false, fmt.Sprintf("pod %s is %s", p.Name, p.Status.Phase)
			}
		}
		fams, err := e.ControllerMetrics(ctx)
		if err != nil {
			return false, err.Error()
		}
		inFlight := harness.MetricSum(fams, "volume_healer_dispatch_in_flight", nil)
		queued := harness.MetricSum(fams, "volume_healer_dispatch_queued", nil)
		pending := harness.MetricSum(fams, "volume_healer_restart_sweeps_pending", nil)
		dead := 0
		if f := fams[deadMountGauge]; f != nil {
			dead = len(f.GetMetric())
		}
		return inFlight == 0 && queued == 0 && pending == 0 && dead == 0,
			fmt.Sprintf("in flight %g, queued %g, restart sweeps pending %g, claims with pods on a dead mount %d", inFlight, queued, pending, dead)
	})
}
