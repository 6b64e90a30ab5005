package realcluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/moby/sys/mountinfo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// invariantPeriod is how often the soak's invariants are checked.
const invariantPeriod = time.Second

// invariants checks, every invariantPeriod while a soak runs, what must hold at every moment:
//
//   - A restart's sweep is not recorded handled while a volume of that restart is dead: when the
//     node's CSIAddonsNode gets a new handled marker during a fault that restarted the node
//     plugin, and that marker covers the running pod's restart marker, no staging mount of the
//     driver on the node answers ENOTCONN.
//   - The controller's calls in flight never exceed its budgets: the sum of
//     volume_healer_dispatch_in_flight never exceeds the global budget nor, the node being the
//     only one, the per-node budget; each driver's never exceeds the per-driver budget.
//   - Nothing is evicted that did not use a dead volume: a workload pod that goes away (deleted
//     or evicted) must use a claim that the fault under way broke.
//
// Violations are collected, logged when found, and fail the soak at its end.
type invariants struct {
	e         *Env
	t         harness.TB
	cl        client.Client
	workloads []*Workload
	cancel    context.CancelFunc
	done      chan struct{}
	stopOnce  sync.Once

	mu   sync.Mutex
	cur  *fault
	list []string
	// handledAtBegin is the handled marker when the fault under way began.
	handledAtBegin string
	// judged are the pods whose going away was judged; pods the workload pods seen running.
	judged map[types.UID]bool
	pods   map[types.UID]*corev1.Pod
	// maxInFlight is the most calls in flight seen, budgets the budgets read.
	maxInFlight float64
	budgets     string
	// markersChecked counts the new handled markers checked against the staging mounts.
	markersChecked int
}

func (e *Env) startInvariants(t harness.TB, workloads []*Workload) *invariants {
	t.Helper()
	scheme, err := controlplane.NewScheme()
	if err != nil {
		t.Fatalf("%v", err)
	}
	cl, err := client.New(e.c.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("%v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	inv := &invariants{e: e, t: t, cl: cl, workloads: workloads, cancel: cancel, done: make(chan struct{}),
		judged: map[types.UID]bool{}, pods: map[types.UID]*corev1.Pod{}}
	inv.checkPods(ctx)
	go func() {
		defer close(inv.done)
		tick := time.NewTicker(invariantPeriod)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			inv.checkPods(ctx)
			inv.checkBudgets(ctx)
			inv.checkMarker(ctx)
		}
	}()
	return inv
}

// stop ends the checks and waits for the last one; a second call does nothing.
func (inv *invariants) stop() {
	inv.stopOnce.Do(inv.stopChecks)
}

func (inv *invariants) stopChecks() {
	inv.cancel()
	<-inv.done
	inv.t.Logf("soak: invariants: %d new handled markers checked against the staging mounts; most calls in flight %g (budgets %s)",
		inv.markersChecked, inv.maxInFlight, inv.budgets)
}

// begin notes the fault under way and the handled marker at its start.
func (inv *invariants) begin(f *fault) {
	handled, _, _ := inv.addonsNode(inv.t.Context())
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.cur, inv.handledAtBegin = f, handled
}

// end notes that the fault's effects are over: the workloads write and the controller is idle.
func (inv *invariants) end() {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	inv.cur = nil
}

func (inv *invariants) current() *fault {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.cur
}

// violate records a violation once.
func (inv *invariants) violate(format string, args ...any) {
	v := time.Now().UTC().Format(time.TimeOnly) + " " + fmt.Sprintf(format, args...)
	msg := fmt.Sprintf(format, args...)
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if slices.ContainsFunc(inv.list, func(s string) bool { return strings.HasSuffix(s, " "+msg) }) {
		return
	}
	inv.list = append(inv.list, v)
	inv.t.Logf("soak: VIOLATION %s", v)
}

func (inv *invariants) violations() []string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return slices.Clone(inv.list)
}

// replaced counts the workload pods that went away.
func (inv *invariants) replaced() int {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return len(inv.judged)
}

// checkPods judges every workload pod that went away since the last check against the claims
// the fault under way broke.
func (inv *invariants) checkPods(ctx context.Context) {
	list, err := inv.e.c.Clientset.CoreV1().Pods(appsNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	present := map[types.UID]bool{}
	var gone []*corev1.Pod
	for i := range list.Items {
		p := &list.Items[i]
		present[p.UID] = true
		if p.DeletionTimestamp == nil {
			inv.pods[p.UID] = p
			continue
		}
		gone = append(gone, p)
	}
	for uid, p := range inv.pods {
		if !present[uid] {
			gone = append(gone, p)
		}
	}
	f := inv.current()
	for _, p := range gone {
		if inv.judged[p.UID] {
			continue
		}
		inv.mu.Lock()
		inv.judged[p.UID] = true
		inv.mu.Unlock()
		claim := podClaim(p)
		switch {
		case f == nil:
			inv.violate("pod %s (claim %s) went away while no fault was under way", p.Name, claim)
		case !f.broken[claim]:
			inv.violate("pod %s (claim %s) went away during fault %s, which broke no volume of it", p.Name, claim, f)
		default:
			inv.t.Logf("soak: fault %s: pod %s (claim %s) went away", f, p.Name, claim)
		}
	}
}

// checkBudgets reads the controller's calls in flight and budgets; a scrape that fails (the
// controller restarting) checks nothing.
func (inv *invariants) checkBudgets(ctx context.Context) {
	fams, err := inv.e.ControllerMetrics(ctx)
	if err != nil {
		return
	}
	global, okG := harness.MetricValue(fams, "volume_healer_dispatch_budget", map[string]string{"scope": "global"})
	perDriver, okD := harness.MetricValue(fams, "volume_healer_dispatch_budget", map[string]string{"scope": "driver"})
	perNode, okN := harness.MetricValue(fams, "volume_healer_dispatch_budget", map[string]string{"scope": "node"})
	if !okG || !okD || !okN {
		inv.violate("the controller does not expose volume_healer_dispatch_budget for the global, driver and node scopes")
		return
	}
	total := 0.0
	if fam := fams["volume_healer_dispatch_in_flight"]; fam != nil {
		for _, m := range fam.GetMetric() {
			v := m.GetGauge().GetValue()
			total += v
			if v > perDriver {
				inv.violate("%g calls in flight for one driver, over its budget of %g", v, perDriver)
			}
		}
	}
	// One node: its calls are every call.
	if limit := min(global, perNode); total > limit {
		inv.violate("%g calls in flight on the one node, over the budget of %g (global %g, per node %g)", total, limit, global, perNode)
	}
	inv.mu.Lock()
	inv.maxInFlight = max(inv.maxInFlight, total)
	inv.budgets = fmt.Sprintf("global %g, per driver %g, per node %g", global, perDriver, perNode)
	inv.mu.Unlock()
}

// addonsNode returns the handled marker of the node's CSIAddonsNode of the driver and the
// restart marker's parts it must cover (the csi-addons sidecar's pod, the healer sidecar's
// start).
func (inv *invariants) addonsNode(ctx context.Context) (handled, pod, healerRestart string) {
	var list csiaddonsv1alpha1.CSIAddonsNodeList
	if err := inv.cl.List(ctx, &list, client.InNamespace(driverNS)); err != nil {
		return "", "", ""
	}
	for _, o := range list.Items {
		if o.Spec.Driver.Name == driverName && o.Spec.Driver.NodeID == inv.e.c.NodeName() {
			a := o.Annotations
			return a[annotations.HandledMarker], a[annotations.CSIAddonsPod], a[annotations.HealerRestart]
		}
	}
	return "", "", ""
}

// checkMarker checks, during a fault that restarted the node plugin, that a newly recorded
// handled marker of the running pod's restart comes with no dead staging mount.
func (inv *invariants) checkMarker(ctx context.Context) {
	f := inv.current()
	if f == nil || !f.restart {
		return
	}
	handled, pod, restart := inv.addonsNode(ctx)
	inv.mu.Lock()
	before := inv.handledAtBegin
	inv.mu.Unlock()
	if handled == "" || handled == before || pod == "" || restart == "" ||
		!strings.Contains(handled, pod) || !strings.Contains(handled, restart) {
		return
	}
	dead := deadStagingMounts()
	inv.mu.Lock()
	inv.handledAtBegin = handled
	inv.markersChecked++
	inv.mu.Unlock()
	if len(dead) > 0 {
		inv.violate("fault %s: restart %q recorded handled while staging mounts are dead: %s", f, handled, strings.Join(dead, "; "))
	}
}

// kubeletDir is the node's kubelet root, where the driver stages and publishes volumes.
const kubeletDir = "/var/lib/kubelet"

// stagingDir holds the driver's staging paths (kubelet's layout for CSI volumes).
const stagingDir = kubeletDir + "/plugins/kubernetes.io/csi/" + driverName

// statBound bounds one stat of a mount: the reference driver's chart answers a stat of a hung
// mount within its statTimeout (5s); a stat of a mount whose mounter is stopped waits until it
// goes on.
const statBound = 2 * time.Second

// deadStagingMounts lists the driver's staging mounts on the node that answer ENOTCONN (their
// mounter is gone), each with its error.
func deadStagingMounts() []string {
	var dead []string
	for _, m := range driverMounts() {
		if !strings.HasPrefix(m.Mountpoint, stagingDir+"/") {
			continue
		}
		errc := make(chan error, 1)
		go func() {
			var st syscall.Stat_t
			errc <- syscall.Stat(m.Mountpoint, &st)
		}()
		select {
		case err := <-errc:
			if errors.Is(err, syscall.ENOTCONN) {
				dead = append(dead, fmt.Sprintf("%s: %v", m.Mountpoint, err))
			}
		case <-time.After(statBound):
			// Hung, not dead: a stopped mounter's mount.
		}
	}
	return dead
}

// driverMounts lists the FUSE mounts under the kubelet root: the reference driver's staging and
// publish mounts.
func driverMounts() []*mountinfo.Info {
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !strings.HasPrefix(m.FSType, "fuse") || !strings.HasPrefix(m.Mountpoint, kubeletDir+"/"), false
	})
	if err != nil {
		return nil
	}
	return mounts
}

// stagingMountOf returns the driver's staging mount point of the volume handle on the node; ""
// when there is none. The mount's source names the volume (the mounter's --fsname).
func stagingMountOf(handle string) string {
	for _, m := range driverMounts() {
		if strings.HasPrefix(m.Mountpoint, stagingDir+"/") && strings.Contains(m.Source, ":"+handle+":") {
			return m.Mountpoint
		}
	}
	return ""
}

// component is a process of the product on the node whose resources the soak watches.
type component struct {
	name, ns, selector, container string
}

var watched = []component{
	{"controller", healerNS, controllerPods, "controller"},
	{"sidecar", driverNS, nodePluginPods, "healer-sidecar"},
	{"driver", driverNS, nodePluginPods, "refdriver"},
}

// quietPoint is what the soak counts on the node at one quiet point.
type quietPoint struct {
	what string
	// mounts are the driver's FUSE mount points on the node, layers the mounts stacked under
	// another at the same point: a heal stacks the new mount on every publish target over the
	// dead one (driverkit.Repair), which stays until the target is unpublished.
	mounts, layers, mounters int
	// pid, fds and rss of each component by name.
	pid, fds map[string]int
	rss      map[string]int
	// goroutines of the controller, from its metrics.
	goroutines float64
}

// Leak tolerances, above the first quiet point. A component's file descriptors vary by the
// HTTP/2 and gRPC connections it keeps open at the moment (to the API server, to the sidecar,
// kubelet's to the driver, the ones an idle pool keeps or closed) and by the epoll and pipe
// descriptors of its runtime: a few either way from one quiet point to the next. Ten more than
// the baseline is a leak; one descriptor lost per fault exceeds it within a long soak.
// Goroutines vary likewise with those connections (two or three per connection) and the
// informers' watches.
const (
	fdTolerance        = 10
	goroutineTolerance = 30
	// The resident memory of one process may grow by rssGrowth of its first quiet point plus
	// rssSlack while the Go heap settles (GOGC doubles the live heap before collecting).
	rssGrowth = 0.5
	rssSlack  = 16 << 20
)

// mountSettle bounds how long, at a quiet point, the node's mounts and mounters may take to come
// back to the baseline: kubelet's volume manager reconciles every 100ms and unmounts a deleted
// pod's volumes within seconds of the pod going away.
const mountSettle = 30 * time.Second

// leakWatch compares the quiet points of a soak.
type leakWatch struct {
	e      *Env
	points []quietPoint
	leaks  []string
}

func newLeakWatch(e *Env) *leakWatch { return &leakWatch{e: e} }

// sample counts the node's mounts and mounters and the components' descriptors, memory and
// the controller's goroutines; the mounts and mounters must come back to the first point's
// (and the mounters to one per volume) within mountSettle.
func (l *leakWatch) sample(t harness.TB, what string, volumes int) {
	t.Helper()
	ctx := t.Context()
	q := quietPoint{what: what, pid: map[string]int{}, fds: map[string]int{}, rss: map[string]int{}}
	want := -1
	if len(l.points) > 0 {
		want = l.points[0].mounts
	}
	err := harness.WaitFor(ctx, mountSettle, "the node's mounts and mounters at the quiet point "+what, func() (bool, string) {
		all := driverMounts()
		points := map[string]bool{}
		for _, m := range all {
			points[m.Mountpoint] = true
		}
		q.mounts, q.layers, q.mounters = len(points), len(all)-len(points), len(mounterPIDs())
		return q.mounters == volumes && (want < 0 || q.mounts == want),
			fmt.Sprintf("%d FUSE mount points under %s (baseline %d), %d mounters for %d volumes", q.mounts, kubeletDir, want, q.mounters, volumes)
	})
	if err != nil {
		l.leaks = append(l.leaks, err.Error())
		t.Logf("soak: LEAK %v", err)
	}
	for _, c := range watched {
		_, id := l.e.runningContainer(ctx, t, c.ns, c.selector, c.container)
		pid, err := containerFirstPID(id)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		fds, ok := harness.ProcessFDs(pid)
		stat, ok2 := harness.ProcessStat(pid)
		if !ok || !ok2 {
			t.Fatalf("%s (pid %d) ended while it was counted", c.name, pid)
		}
		q.pid[c.name], q.fds[c.name], q.rss[c.name] = pid, fds, stat.ResidentMemory()
	}
	if fams, err := l.e.ControllerMetrics(ctx); err == nil {
		q.goroutines, _ = harness.MetricValue(fams, "go_goroutines", nil)
	}
	t.Logf("soak: quiet point %s: %d FUSE mount points (%d layers under them), %d mounters; fds controller %d, sidecar %d, driver %d; RSS controller %d MiB, sidecar %d MiB; controller goroutines %g",
		what, q.mounts, q.layers, q.mounters, q.fds["controller"], q.fds["sidecar"], q.fds["driver"], q.rss["controller"]>>20, q.rss["sidecar"]>>20, q.goroutines)
	if len(l.points) > 0 {
		base := l.points[0]
		for _, c := range watched {
			if q.fds[c.name] > base.fds[c.name]+fdTolerance {
				l.leak(t, "%s: %d file descriptors at %s, %d at %s (tolerance %d)", c.name, q.fds[c.name], what, base.fds[c.name], base.what, fdTolerance)
			}
		}
		if base.goroutines > 0 && q.goroutines > base.goroutines+goroutineTolerance {
			l.leak(t, "controller: %g goroutines at %s, %g at %s (tolerance %d)", q.goroutines, what, base.goroutines, base.what, goroutineTolerance)
		}
	}
	l.points = append(l.points, q)
}

func (l *leakWatch) leak(t harness.TB, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.leaks = append(l.leaks, msg)
	t.Logf("soak: LEAK %s", msg)
}

// verdict adds the memory comparison (the last quiet point against the first of the same
// process, for the controller and the sidecar) and returns every leak found.
func (l *leakWatch) verdict() []string {
	if len(l.points) < 2 {
		return l.leaks
	}
	last := l.points[len(l.points)-1]
	for _, name := range []string{"controller", "sidecar"} {
		i := slices.IndexFunc(l.points, func(q quietPoint) bool { return q.pid[name] == last.pid[name] })
		first := l.points[i]
		if i == len(l.points)-1 {
			continue
		}
		if bound := int(float64(first.rss[name])*(1+rssGrowth)) + rssSlack; last.rss[name] > bound {
			l.leaks = append(l.leaks, fmt.Sprintf("%s (pid %d): resident memory %d MiB at %s, %d MiB at %s (bound %d MiB)",
				name, last.pid[name], last.rss[name]>>20, last.what, first.rss[name]>>20, first.what, bound>>20))
		}
	}
	return l.leaks
}

// layers is the most mounts stacked under the driver's mount points at a quiet point.
func (l *leakWatch) layers() int {
	n := 0
	for _, q := range l.points {
		n = max(n, q.layers)
	}
	return n
}

// memoryReport says how the controller's and the sidecar's memory went from the first to the
// last quiet point of their last process.
func (l *leakWatch) memoryReport() string {
	if len(l.points) == 0 {
		return ""
	}
	last := l.points[len(l.points)-1]
	var parts []string
	for _, name := range []string{"controller", "sidecar"} {
		i := slices.IndexFunc(l.points, func(q quietPoint) bool { return q.pid[name] == last.pid[name] })
		parts = append(parts, fmt.Sprintf("%s %d -> %d MiB over %d quiet points", name, l.points[i].rss[name]>>20, last.rss[name]>>20, len(l.points)-i))
	}
	return strings.Join(parts, ", ")
}
