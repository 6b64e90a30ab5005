package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/test/cluster"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/realcluster"
)

// The reference driver's name in its chart, and the node plugin's DaemonSet; the same chart's
// second release as a stock driver (test/realcluster's InstallStock), and its node plugin's.
const (
	clusterDriverName = "healer.example.com"
	nodePluginDS      = "healer-refdriver-node"
	stockDriverName   = "stock.healer.example.com"
	stockNodePluginDS = "healer-refdriver-stock-node"
)

// stockReplicas is the number of pods of the StatefulSet on the stock driver's volumes, each with
// its own volume, which the policy recycles.
const stockReplicas = 2

// sharedReplicas is the number of pods of the StatefulSet whose volumes heal in place: each has
// its own volume, and their outages make the percentiles of the summary.
const sharedReplicas = 6

// sweepSample is how often the demo reads the controller's metrics to time the restart sweep.
const sweepSample = 250 * time.Millisecond

// clusterDemo is the story on a real node: kubelet, containerd and the control plane on this
// machine (test/cluster), volume-healer and the reference driver installed with their Helm charts
// (test/realcluster), three workloads on the driver's FUSE volumes, one volume's data removed,
// and the node plugin's DaemonSet restarted as an upgrade does. It shows the workloads' own
// writes failing and coming back, the lost volume reported and left alone, and what an operator
// sees. Then the same fault on a stock driver, one that serves no Healer service (the reference
// driver's chart again with node.mode=stock and rclone as its FUSE mounter): the sidecar's own
// probe finds the dead mounts and the policy recycles the volumes, the pods of a fourth workload
// evicted and replaced by pods whose volumes the driver's own NodeStage and NodePublish mount
// anew.
func clusterDemo(s *harness.Script, dir string, o options) error {
	ctx := s.Context()
	// The node's start, the images' build and helm's timings go to a file of their own.
	progress := filepath.Join(dir, "cluster.log")
	f, err := os.Create(progress)
	if err != nil {
		return err
	}
	// Registered first, it runs last: the node's cleanups log to it.
	s.Cleanup(func() { s.SetLog(nil); _ = f.Close() })
	s.SetLog(f)
	step("Starting a real node: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, containerd, kubelet")
	fmt.Printf("  (the first run builds kubelet, containerd and the CSI sidecars from the Go module proxy: hack/node.sh; progress in %s)\n", progress)
	start := time.Now()
	c, assets := cluster.StartFor(s, filepath.Join(dir, "node"))
	nodeUp := time.Since(start)
	fmt.Printf("  node %s Ready at %s, %s after the start of the demo\n", c.NodeName(), c.NodeIP, nodeUp.Round(100*time.Millisecond))
	fmt.Printf("  logs: %s (the node's components), %s (this program's clients)\n", filepath.Join(dir, "node", "logs"), filepath.Join(dir, inProcessLog))
	fmt.Println("  (the pods' logs, volume-healer's and the driver's included, stay with the node: kubectl logs while it runs, make demo-hold)")

	step("helm install volume-healer and the reference driver (deploy/helm/volume-healer, deploy/helm/healer-refdriver)")
	e := realcluster.Install(s, c, assets)
	e.OptInToPodRestarts()
	fmt.Println("  the controller, the driver's controller plugin and node plugin (driver + healer sidecar) run; the driver registered with kubelet")

	step("Four workloads write, sync and read their FUSE volumes every 100ms; a stock driver is installed meanwhile")
	begin := time.Now()
	shared := e.StatefulSet("shared", corev1.MountPropagationHostToContainer, sharedReplicas)
	private := e.Deployment("private", corev1.MountPropagationNone)
	lost := e.Deployment("lost", corev1.MountPropagationHostToContainer)
	// The stock driver's install waits for its node plugin while the first pods start.
	e.InstallStock(s)
	fmt.Printf("  helm install healer-refdriver-stock (node.mode=stock, node.mounter=rclone): driver %s serves no Healer service, its volumes are rclone mounts; registered with kubelet %s after the workloads were created\n",
		stockDriverName, time.Since(begin).Round(100*time.Millisecond))
	stock := e.StockStatefulSet("stock", stockReplicas)
	shared.WaitAllWriting(s, 3*time.Minute)
	private.WaitWriting(s, time.Time{}, 3*time.Minute, nil)
	lost.WaitWriting(s, time.Time{}, 3*time.Minute, nil)
	stock.WaitAllWriting(s, 3*time.Minute)
	ns := shared.Namespace()
	fmt.Printf("  shared:  a StatefulSet of %d pods, each with its own volume, mounted with propagation HostToContainer\n", sharedReplicas)
	fmt.Println("  private: a Deployment, propagation None, in a namespace that lets the policy restart its pods")
	fmt.Println("  lost:    a Deployment, propagation HostToContainer, whose volume is about to lose its data")
	fmt.Printf("  stock:   a StatefulSet of %d pods on the stock driver's volumes, each its own, propagation None\n", stockReplicas)
	fmt.Printf("  %d pods write, %s after they were created\n", sharedReplicas+2+stockReplicas, time.Since(begin).Round(100*time.Millisecond))
	// The stock node plugin's first start is swept (tier none, probed by the sidecar) before
	// the story restarts it.
	e.WaitStockSwept(s, 2*time.Minute)
	fmt.Printf("  the stock driver's CSIAddonsNode shows tier none, probed by the healer sidecar: %s after the workloads were created\n", time.Since(begin).Round(100*time.Millisecond))

	sharedPods, err := shared.Pods(ctx)
	if err != nil {
		return err
	}
	privatePods, err := private.Pods(ctx)
	if err != nil || len(privatePods) != 1 {
		return fmt.Errorf("the private workload's pod: %d running, %v", len(privatePods), err)
	}
	lostClaim := lost.Claims()[0]

	step("The data of PVC %s is removed from the driver's state on the node: that volume is lost for good", lostClaim)
	id, folder := e.RemoveData(s, lostClaim)
	fmt.Printf("  rm -rf %s (volume %s)\n", folder, id)

	step("kubectl rollout restart daemonset/%s: the driver's container restarts, its FUSE mounters die with it", nodePluginDS)
	// volume-healer's Events, not kubelet's and the ReplicaSet's, cut to a line's length.
	events := newEventPrinter(c.Clientset, ns)
	events.component, events.width = "volume-healer", 200
	events.skipExisting(ctx)
	at := time.Now()
	sweep := watchSweep(ctx, e, at)
	view := watchWorkloads(ctx, at, events, shared, private, lost)
	e.RolloutRestart(s)
	res := clusterRestart{at: at, sharedPods: sharedPods, privatePod: privatePods[0], privateClaim: private.Claims()[0]}
	waitErr := harness.WaitFor(ctx, 3*time.Minute, "the workloads to get their I/O back and the lost volume reported", func() (bool, string) {
		return res.observe(ctx, c.Clientset, shared, private, lostClaim)
	})
	view()
	res.sweep = sweep()
	events.print(ctx)

	broken := res.summary(ctx, c.Clientset, lost, lostClaim)
	if waitErr != nil {
		broken = append(broken, waitErr.Error())
	}
	stockBegin := time.Now()
	broken = append(broken, stockRestart(s, e, events, stock)...)
	stockStory := time.Since(stockBegin)
	// The evicted pod's volume stops needing a human with the next probe that finds it healthy
	// (the class's periodic sweep, every 10s); the lost volume needs one for good.
	want := statusWant{driver: clusterDriverName, node: c.NodeName(), volumes: map[string]bool{ns + "/" + lostClaim: true}}
	if err := operatorView(ctx, o.healerctl, c.Kubeconfig, want, 45*time.Second); err != nil {
		broken = append(broken, err.Error())
	}
	for _, b := range broken {
		fmt.Printf("  BROKEN PROMISE: %s\n", b)
	}
	fmt.Printf("\n%s since the start of the demo, %s of it the node's start (the images' build included), %s the stock driver's restart and recycle\n",
		time.Since(start).Round(time.Second), nodeUp.Round(time.Second), stockStory.Round(time.Second))
	return end(ctx, o.hold, c.Kubeconfig, "pods,pvc,events", broken)
}

// stockRestart is the stock driver's part of the story: its node plugin's DaemonSet restarted,
// as for the reference driver, while the stock workload's pods and the Events are shown as they
// change. The driver cannot heal: realcluster's DisruptStock checks that the sidecar's probe
// found the dead mounts, each volume was recycled (VolumeRecycling, EvictedForRecycle on each pod,
// VolumeRecycled), the replacement pods write, and the restart was recorded handled only once no
// staging mount was dead; a check that fails there fails the demo. It prints the outage of the
// stock workload's pods, and returns the promises that did not hold.
func stockRestart(s *harness.Script, e *realcluster.Env, events *eventPrinter, stock *realcluster.Workload) []string {
	ctx := s.Context()
	step("kubectl rollout restart daemonset/%s: the stock driver's container restarts, its rclone mounters die with it; it cannot heal, so the policy recycles its volumes", stockNodePluginDS)
	before, err := stock.Pods(ctx)
	if err != nil {
		return []string{fmt.Sprintf("the stock workload's pods: %v", err)}
	}
	at := time.Now()
	view := watchWorkloads(ctx, at, events, stock)
	outages := e.DisruptStock(s, stock, "stock rollout restart", func() { e.RolloutRestartStock(s) })
	view()
	took := time.Since(at)
	events.print(ctx)

	step("Summary of the stock driver (no Healer service, rclone)")
	after, err := stock.Pods(ctx)
	if err != nil {
		return []string{fmt.Sprintf("the stock workload's pods: %v", err)}
	}
	var broken []string
	old := map[string]bool{}
	for _, p := range before {
		old[string(p.UID)] = true
	}
	var names []string
	for _, p := range after {
		if old[string(p.UID)] {
			broken = append(broken, fmt.Sprintf("pod %s of the stock workload is still the pod from before the restart", p.Name))
		}
		names = append(names, p.Name+" (uid "+string(p.UID)[:8]+")")
	}
	fmt.Printf("  the healer sidecar's own probe found the dead rclone mounts; the policy recycled each of the %d volumes:\n", len(stock.Claims()))
	fmt.Println("  its pods evicted through the Eviction API, kubelet unstaged it, and the driver's own NodeStage and NodePublish mounted it again for the new pods")
	fmt.Printf("  new pods writing and reading: %s\n", strings.Join(names, ", "))
	fmt.Printf("    outage, first failed write -> first good write in the new pod:  %s\n", spread(outages))
	fmt.Printf("    plugin restart -> every new pod writing, the Events and the handled restart checked: %s\n", took.Round(100*time.Millisecond))
	return broken
}

// clusterRestart is what the rollout restart of the node plugin showed.
type clusterRestart struct {
	at time.Time
	// sharedPods and privatePod are the workloads' pods when the node plugin restarted.
	sharedPods   []corev1.Pod
	privatePod   corev1.Pod
	privateClaim string
	// outages are the shared pods' own, by pod name.
	outages map[string]realcluster.Outage
	// replacement is the private workload's new pod and writing the time of its first good try.
	replacement string
	writing     time.Time
	// dataLoss tells whether the lost volume's PVC has its Event.
	dataLoss bool
	sweep    sweepTimes
}

// observe reads what the workloads saw since the restart, and says whether the story is over:
// every shared pod's writes failed and came back, the private pod was replaced by one that
// writes, the lost volume was reported.
func (r *clusterRestart) observe(ctx context.Context, cs kubernetes.Interface, shared, private *realcluster.Workload, lostClaim string) (bool, string) {
	var waiting []string
	r.outages = map[string]realcluster.Outage{}
	for _, p := range r.sharedPods {
		o, err := shared.Outage(ctx, p.Name, r.at)
		if err != nil {
			waiting = append(waiting, err.Error())
			continue
		}
		r.outages[p.Name] = o
		if o.Resumed.IsZero() {
			waiting = append(waiting, p.Name+" not writing again")
		}
	}
	if r.writing.IsZero() {
		pods, err := private.Pods(ctx)
		if err == nil {
			for _, p := range pods {
				if p.UID == r.privatePod.UID {
					continue
				}
				if t, err := private.FirstWrite(ctx, p.Name, r.at); err == nil && !t.IsZero() {
					r.replacement, r.writing = p.Name, t
				}
			}
		}
		if r.writing.IsZero() {
			waiting = append(waiting, "no replacement of "+r.privatePod.Name+" writing")
		}
	}
	if !r.dataLoss {
		r.dataLoss = pvcEvent(ctx, cs, shared.Namespace(), "PersistentVolumeClaim", lostClaim, healer.ReasonVolumeDataLoss, r.at)
		if !r.dataLoss {
			waiting = append(waiting, "no "+healer.ReasonVolumeDataLoss+" Event on "+lostClaim)
		}
	}
	return len(waiting) == 0, strings.Join(waiting, ", ")
}

// summary prints what the restart showed and returns the promises that did not hold.
func (r *clusterRestart) summary(ctx context.Context, cs kubernetes.Interface, lost *realcluster.Workload, lostClaim string) []string {
	step("Summary")
	var broken []string
	ns := lost.Namespace()
	var outages, resumed []time.Duration
	for _, p := range r.sharedPods {
		o := r.outages[p.Name]
		switch {
		case o.FirstFailure.IsZero():
			broken = append(broken, fmt.Sprintf("the writes of %s did not fail: the restart did not reach its volume", p.Name))
		case o.Resumed.IsZero():
			broken = append(broken, fmt.Sprintf("the writes of %s did not come back (%s)", p.Name, o.Failure))
		default:
			outages = append(outages, o.Resumed.Sub(o.FirstFailure))
			resumed = append(resumed, o.Resumed.Sub(r.at))
		}
	}
	fmt.Printf("  the %d pods of shared (HostToContainer), each on its own volume, kept their containers; p50 / p99 / max:\n", len(r.sharedPods))
	fmt.Printf("    outage, first failed write -> first good write:  %s\n", spread(outages))
	fmt.Printf("    plugin restart -> first good write:              %s\n", spread(resumed))
	fmt.Printf("  plugin restart -> first probe that found a dead mount: %s, -> last heal: %s (the controller's metrics as read, each up to %s earlier)\n",
		since(r.at, r.sweep.firstDead), since(r.at, r.sweep.lastHeal), r.sweep.late.Round(10*time.Millisecond))
	fmt.Printf("  probes that found a dead mount: %d (the lost volume's again at each periodic sweep), heal calls: %d\n", r.sweep.dead, r.sweep.heals)
	if r.sweep.firstDead.IsZero() || r.sweep.lastHeal.IsZero() {
		broken = append(broken, "the controller's metrics show no probe that found a dead mount, or no heal")
	}
	for _, p := range r.sharedPods {
		if !pvcEvent(ctx, cs, ns, "PersistentVolumeClaim", "data-"+p.Name, healer.ReasonVolumeHealed, r.at) {
			broken = append(broken, fmt.Sprintf("no %s Event on the PVC of %s", healer.ReasonVolumeHealed, p.Name))
		}
	}

	private := r.privatePod
	if r.writing.IsZero() {
		broken = append(broken, fmt.Sprintf("the private workload's pod %s was not replaced by one that writes", private.Name))
	} else {
		fmt.Printf("  private (propagation None): pod %s evicted, its replacement %s writes %s after the plugin restart\n",
			private.Name, r.replacement, r.writing.Sub(r.at).Round(100*time.Millisecond))
	}
	if !pvcEvent(ctx, cs, ns, "PersistentVolumeClaim", r.privateClaim, healer.ReasonVolumePodsMustRestart, r.at) {
		broken = append(broken, fmt.Sprintf("no %s Event on the private workload's PVC", healer.ReasonVolumePodsMustRestart))
	}
	if !pvcEvent(ctx, cs, ns, "Pod", private.Name, evict.ReasonEvictedForStaleMount, r.at) {
		broken = append(broken, fmt.Sprintf("no %s Event on pod %s", evict.ReasonEvictedForStaleMount, private.Name))
	}

	healedLost := pvcEvent(ctx, cs, ns, "PersistentVolumeClaim", lostClaim, healer.ReasonVolumeHealed, r.at)
	switch {
	case !r.dataLoss:
		broken = append(broken, fmt.Sprintf("the lost volume of %s was not reported (no %s Event)", lostClaim, healer.ReasonVolumeDataLoss))
	case healedLost:
		broken = append(broken, fmt.Sprintf("the lost volume of %s was healed: its data is gone, a heal hides that", lostClaim))
	default:
		still := "its pod's I/O fails"
		if pods, err := lost.Pods(ctx); err == nil && len(pods) == 1 {
			if ok, failure, err := lost.PodState(ctx, pods[0].Name); err == nil && !ok {
				still = fmt.Sprintf("pod %s still fails (%s)", pods[0].Name, failure)
			}
		}
		fmt.Printf("  lost: data lost, left alone (not healed), %s; Event %s on PVC %s for a human\n", still, healer.ReasonVolumeDataLoss, lostClaim)
	}
	return broken
}

// pvcEvent tells whether the object kind/name in namespace has an Event of reason at or after since.
func pvcEvent(ctx context.Context, cs kubernetes.Interface, namespace, kind, name, reason string, since time.Time) bool {
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
	list, err := cs.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return false
	}
	for _, ev := range list.Items {
		last := ev.LastTimestamp.Time
		if ev.EventTime.After(last) {
			last = ev.EventTime.Time
		}
		// Event times are whole seconds.
		if !last.Before(since.Truncate(time.Second)) {
			return true
		}
	}
	return false
}

// sweepTimes is what the controller's metrics showed of the restart sweep.
type sweepTimes struct {
	// firstDead is when a probe first found a dead mount, lastHeal when the last heal call ended,
	// each as seen by a read of the metrics; zero when none.
	firstDead, lastHeal time.Time
	// dead and heals count the probes that found a dead mount, and the heal calls.
	dead, heals int
	// late is the longest time between the read that saw firstDead or lastHeal and the read
	// before it: how much earlier the probe or heal may have been.
	late time.Duration
}

// watchSweep reads the controller's probe and heal counters every sweepSample from now on, and
// prints when probes find dead mounts and heals end; the returned function stops it and says
// what it saw.
func watchSweep(ctx context.Context, e *realcluster.Env, at time.Time) (stop func() sweepTimes) {
	ctx, cancel := context.WithCancel(ctx)
	read := func() (dead, heals float64, ok bool) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		fams, err := e.ControllerMetrics(ctx)
		if err != nil {
			return 0, 0, false
		}
		return harness.MetricSum(fams, "volume_healer_probes_total", map[string]string{"result": "unhealthy"}),
			harness.MetricSum(fams, "volume_healer_heals_total", nil), true
	}
	baseDead, baseHeals, _ := read()
	var st sweepTimes
	// healLate is st.late's part for the last heal seen so far.
	var healLate time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		previous := time.Now()
		for ctx.Err() == nil {
			dead, heals, ok := read()
			now := time.Now()
			if ok && (int(dead-baseDead) != st.dead || int(heals-baseHeals) != st.heals) {
				if int(dead-baseDead) > st.dead && st.firstDead.IsZero() {
					st.firstDead = now
					st.late = max(st.late, now.Sub(previous))
				}
				if int(heals-baseHeals) > st.heals {
					st.lastHeal, healLate = now, now.Sub(previous)
				}
				st.dead, st.heals = int(dead-baseDead), int(heals-baseHeals)
				fmt.Printf("  %7s  %-8s %d probes found a dead mount, %d heal calls ended\n", "+"+now.Sub(at).Round(100*time.Millisecond).String(), "healer", st.dead, st.heals)
			}
			if ok {
				previous = now
			}
			select {
			case <-ctx.Done():
			case <-time.After(sweepSample):
			}
		}
	}()
	return func() sweepTimes {
		cancel()
		wg.Wait()
		st.late = max(st.late, healLate)
		return st
	}
}

// watchWorkloads prints a line whenever what a workload's pods do changes, and the new Events of
// the workloads' namespace, until the returned function is called.
func watchWorkloads(ctx context.Context, at time.Time, events *eventPrinter, ws ...*realcluster.Workload) (stop func()) {
	last := map[string]string{}
	pass := func(ctx context.Context) {
		for _, w := range ws {
			state := podsState(ctx, w)
			if state != "" && state != last[w.Name()] {
				last[w.Name()] = state
				fmt.Printf("  %7s  %-8s %s\n", "+"+time.Since(at).Round(100*time.Millisecond).String(), w.Name(), state)
			}
		}
		events.print(ctx)
	}
	watching, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for watching.Err() == nil {
			pass(watching)
			select {
			case <-watching.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	// A last look once the story is over shows where each workload ended.
	return func() { cancel(); wg.Wait(); pass(ctx) }
}

// podsState says in a few words what the workload's running pods do now: for one pod its
// name and the outcome of its latest try, for several how many write and how many fail; "" when
// it cannot be read.
func podsState(ctx context.Context, w *realcluster.Workload) string {
	pods, err := w.Pods(ctx)
	if err != nil {
		return ""
	}
	if len(pods) == 0 {
		return "no running pod"
	}
	var writing, starting int
	var failures []string
	for _, p := range pods {
		ok, failure, err := w.PodState(ctx, p.Name)
		switch {
		case err != nil:
			// Its output cannot be read now (kubelet busy): say nothing rather than guess.
			return ""
		case ok:
			writing++
		case failure == "starting":
			starting++
		default:
			failures = append(failures, failure)
		}
	}
	if len(pods) == 1 {
		p := pods[0].Name
		switch {
		case writing == 1:
			return "pod " + p + ": writes and reads"
		case starting == 1:
			return "pod " + p + ": starting"
		}
		return "pod " + p + ": " + failures[0]
	}
	out := fmt.Sprintf("%d pods: %d write and read", len(pods), writing)
	if len(failures) > 0 {
		out += fmt.Sprintf(", %d fail (%s)", len(failures), failures[0])
	}
	if starting > 0 {
		out += fmt.Sprintf(", %d starting", starting)
	}
	return out
}
