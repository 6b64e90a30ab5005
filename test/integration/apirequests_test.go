package integration

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/harness"
)

// sweepResources are the resources a sweep is about. The apiserver's own loops touch others
// (leases, endpoints, ...) at any time, but none of these.
var sweepResources = []string{
	"persistentvolumes", "persistentvolumeclaims", "volumeattachments", "storageclasses", "csidrivers",
	"nodes", "csiaddonsnodes", "secrets", "events", "configmaps", "pods",
}

// TestAPIRequestsPerRestartSweep counts the API requests of a restart sweep of a node with many
// volumes (-perf-volumes, 1,000 by default), and, in the same run, those of the list-everything
// approach that Ceph CSI takes at plugin start: one cluster-wide LIST of VolumeAttachments, then a
// GET of each PV, VolumeAttachment and Secret. The window holds the whole restart: the old
// sidecar's stop, the new one's start and the sweep, which the default debounce starts at once.
// The calls carry the PVs' facts, so the sidecar reads no PV and no VolumeAttachment; it reads
// the node-stage Secret for the heals. Both are counted with the apiserver's own
// apiserver_request_total (before and after) and attributed to clients through the audit log,
// which knows user agents. The controller must make no LIST and no GET during the sweep, and no
// write for a healthy volume. -perf-report writes the figures as Markdown.
func TestAPIRequestsPerRestartSweep(t *testing.T) {
	n := *perfVolumes
	const broken = 10
	if n < broken {
		t.Fatalf("-perf-volumes=%d: want at least %d", n, broken)
	}
	f := newFixture(t, "perf")
	sc := f.StorageClass("perf-rbd-nbd", "rbd-nbd", nil)
	p := f.newPlugin("perf-node-1")
	vols := f.newVolumes(p, sc, "rbd-nbd", "vol", n)
	p.start()
	// Leader election is off: it would add a Lease GET and UPDATE every retry period, sweep or not.
	startController(t, "perf", nil)
	f.SweepFinished(p.Node(), time.Minute)

	setUpStart := time.Now()
	f.CreateVolumes(vols, false)
	t.Logf("created %d PVs, PVCs and VolumeAttachments in %s", n, time.Since(setUpStart).Round(time.Millisecond))
	version, err := f.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}

	// The test watches instead of polling, so that it makes no request inside the window: a watch
	// is counted when it ends, after the window.
	w := watchSweep(t, f, p)
	sweepBefore := apiserverRequests(t, f.Clientset)
	sweepAudit := openAuditWindow(t, auditLog(f.s.Dir))
	restartedAt := time.Now()
	p.restart(func() {
		for _, v := range vols[:broken] {
			v.SetCondition(t, control.Gone, 0)
		}
	})
	marker := trigger.RestartMarker(f.AddonsNode(p.Node()))
	w.wait(t, marker, n, broken, 5*time.Minute)
	// The Event recorder writes in the background: give the last Events time to land.
	time.Sleep(2 * time.Second)
	sweepAfter := apiserverRequests(t, f.Clientset)
	sweepAudit.close()
	w.stop()
	first, last := callSpan(p.calls, restartedAt)

	// The list-everything approach, counted the same way.
	lc := listEverythingClient(t, f)
	leBefore := apiserverRequests(t, f.Clientset)
	leAudit := openAuditWindow(t, auditLog(f.s.Dir))
	leStart := time.Now()
	leVolumes, leListed := listEverything(t, lc, f.Driver, p.Node())
	leTime := time.Since(leStart)
	leAfter := apiserverRequests(t, f.Clientset)
	leAudit.close()

	fig := perfFigures{
		volumes: n, broken: broken, apiserver: version.GitVersion,
		sweepTime: last.Sub(first), sweepClients: sweepAudit.byClient(t), sweepMetric: sweepAfter.minus(sweepBefore),
		leVolumes: leVolumes, leListed: leListed, leTime: leTime, leClients: leAudit.byClient(t), leMetric: leAfter.minus(leBefore),
	}
	report := fig.markdown()
	t.Log("\n" + report)
	if *perfReport != "" {
		if err := os.WriteFile(*perfReport, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}

	if got := p.Driver().Counters().Calls["ProbeVolume"]; got < int64(n) {
		t.Errorf("%d ProbeVolume calls in the restart sweep of %d volumes", got, n)
	}
	for _, v := range vols[:broken] {
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s is %s after the sweep, want healthy", v.PV, c)
		}
	}

	// The goal: no LIST and no GET by the controller during a sweep.
	ctrl := fig.sweepClients[clientController]
	if l, g := ctrl.byVerb("list"), ctrl.byVerb("get"); l != 0 || g != 0 {
		t.Errorf("the controller made %d LIST and %d GET requests during the restart sweep (audit log); want none: %s", l, g, ctrl.describe())
	}
	// The same by the apiserver's own counter: nobody but the sidecar read the sweep's objects
	// during the window.
	sidecarReads := fig.sweepClients[clientSidecar]
	// The test's own requests in the window (it reads the restart marker) are not the restart's.
	restart := fig.sweepMetric.minus(fig.sweepClients[clientHarness])
	read := restart.only(sweepResources...).minus(sidecarReads)
	if l, g := read.byVerb("list"), read.byVerb("get"); l != 0 || g != 0 {
		t.Errorf("apiserver_request_total counted %d LIST and %d GET requests on %v during the restart sweep besides the sidecar's; want none: %s", l, g, sweepResources, read.describe())
	}
	// The sidecar reads nothing per volume: the calls carry the PVs' facts, its Node says what is
	// attached there, and it reads the one node-stage Secret for the heals, cached. Its one LIST
	// is of the CSIAddonsNodes of its namespace, to register.
	for k, v := range sidecarReads {
		if (k.verb == "list" || k.verb == "get") && k.resource != "csiaddonsnodes" && k.resource != "secrets" {
			t.Errorf("the sidecar made %d %s %s during the restart; want none: %s", v, k.verb, k.resource, sidecarReads.describe())
		}
	}
	if got := sidecarReads[requestKey{"get", "secrets"}]; got > broken {
		t.Errorf("the sidecar read the one node-stage Secret %d times for %d heals; want it cached", got, broken)
	}
	// What a user would notice: the whole restart, every client counted by the apiserver,
	// costs a handful of requests and three per healed volume (its Event, its status, the
	// Secret its heal reads).
	if got, most := restart.total(), 10+3*broken; got > most {
		t.Errorf("the restart of a node plugin with %d volumes (%d broken) cost %d requests by apiserver_request_total; want at most %d: %s",
			n, broken, got, most, restart.describe())
	}
	t.Logf("the restart cost %d requests by apiserver_request_total, all clients but the test's own: %s", restart.total(), restart.describe())
	// The controller's token for the node's sidecars is requested at most once (it lives ten
	// minutes) and is no write of the sweep's objects.
	tokenKey := requestKey{"create", "serviceaccounts/token"}
	if got := ctrl[tokenKey]; got > 1 {
		t.Errorf("the controller requested %d tokens for the sidecars of one node during the sweep; want at most 1", got)
	}
	// Writes grow with the volumes that needed something, not with the volumes swept: two Events
	// and the handled marker per sweep, a status annotation and an Event per healed volume.
	if got, most := ctrl.writes()-ctrl[tokenKey], 3+2*broken; got > most {
		t.Errorf("the controller made %d writes in the sweep of %d volumes (%d broken); want at most %d: %s", got, n, broken, most, ctrl.describe())
	}
	for k := range ctrl {
		if k.verb != "watch" && k != tokenKey && !slices.Contains([]string{"events", "persistentvolumeclaims", "csiaddonsnodes"}, k.resource) {
			t.Errorf("the controller sent %s %s during the sweep; a sweep writes only Events, PVC annotations and the CSIAddonsNode's handled marker, and asks for the node's sidecar token", k.verb, k.resource)
		}
	}
	// The counting sees reads where there are some: the list-everything approach's, by both
	// counts.
	want := requestCounts{
		{"list", "volumeattachments"}: 1,
		{"get", "persistentvolumes"}:  leVolumes, {"get", "volumeattachments"}: leVolumes, {"get", "secrets"}: leVolumes,
	}
	if got := fig.leClients[clientListEverything]; len(got.minus(want)) != 0 {
		t.Errorf("list-everything by the audit log: %s; want %s", got.describe(), want.describe())
	}
	for k, v := range want {
		if got := fig.leMetric[k]; got < v {
			t.Errorf("apiserver_request_total counted %d %s %s during the list-everything reads; they made %d", got, k.verb, k.resource, v)
		}
	}
	if leVolumes != n {
		t.Errorf("list-everything found %d VolumeAttachments of the node, want %d", leVolumes, n)
	}
}

// sweepWatch follows, through watches opened before the counting window, what shows that a restart
// sweep is over: the handled marker, the healed volumes' Events and the sweep's last Event.
type sweepWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	err      string
	handled  string
	healed   map[string]bool
	finished []string
}

func watchSweep(t *testing.T, f *fixture, p *plugin) *sweepWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(f.Ctx())
	sw := &sweepWatch{cancel: cancel, healed: map[string]bool{}}
	wc, err := client.NewWithWatch(f.s.Config, client.Options{Scheme: f.s.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// Resource version "0" starts from the watch cache as it is; an empty one would first wait for
	// the cache to catch up with etcd, and give up after a few seconds on a quiet resource.
	fromCache := &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}}
	nodes, err := wc.Watch(ctx, &csiaddonsv1alpha1.CSIAddonsNodeList{}, client.InNamespace(f.PluginNS), fromCache)
	if err != nil {
		t.Fatal(err)
	}
	events, err := f.Clientset.CoreV1().Events(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	follow := func(w watch.Interface, seen func(any)) {
		sw.wg.Add(1)
		go func() {
			defer sw.wg.Done()
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					switch {
					case !ok:
						sw.fail("a watch ended early")
						return
					case ev.Type == watch.Error:
						sw.fail(fmt.Sprintf("a watch failed: %v", ev.Object))
						return
					case ev.Type == watch.Added || ev.Type == watch.Modified:
						seen(ev.Object)
					}
				}
			}
		}()
	}
	name := f.AddonsNodeKey(p.Node()).Name
	follow(nodes, func(obj any) {
		if n, ok := obj.(*csiaddonsv1alpha1.CSIAddonsNode); ok && n.Name == name {
			sw.mu.Lock()
			sw.handled = n.Annotations[annotations.HandledMarker]
			sw.mu.Unlock()
		}
	})
	follow(events, func(obj any) {
		ev, ok := obj.(*corev1.Event)
		if !ok {
			return
		}
		sw.mu.Lock()
		defer sw.mu.Unlock()
		switch {
		case ev.Namespace == f.AppNS && ev.Reason == healer.ReasonVolumeHealed:
			sw.healed[ev.InvolvedObject.Name] = true
		case ev.Namespace == f.PluginNS && ev.Reason == healer.ReasonRestartSweepFinished && ev.InvolvedObject.Name == name:
			sw.finished = append(sw.finished, ev.Message)
		}
	})
	return sw
}

// wait waits until marker is handled, broken volumes were reported healed, and the sweep's
// RestartSweepFinished Event names all volumes.
func (sw *sweepWatch) wait(t *testing.T, marker string, volumes, broken int, timeout time.Duration) {
	t.Helper()
	summary := fmt.Sprintf("%d volumes:", volumes)
	harness.Eventually(t, timeout, "the restart sweep to finish", func() (bool, string) {
		sw.mu.Lock()
		defer sw.mu.Unlock()
		if sw.err != "" {
			t.Fatalf("following the restart sweep: %s", sw.err)
		}
		done := sw.handled == marker && len(sw.healed) >= broken &&
			slices.ContainsFunc(sw.finished, func(m string) bool { return strings.Contains(m, summary) })
		return done, fmt.Sprintf("handled %q (want %q), %d healed Events, finished Events %q", sw.handled, marker, len(sw.healed), sw.finished)
	})
}

func (sw *sweepWatch) fail(msg string) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.err == "" {
		sw.err = msg
	}
}

func (sw *sweepWatch) stop() {
	sw.cancel()
	sw.wg.Wait()
}

// callSpan returns when the first and the last call after since began.
func callSpan(c *callTracker, since time.Time) (first, last time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, byRPC := range c.starts {
		for _, times := range byRPC {
			for _, at := range times {
				if !at.After(since) {
					continue
				}
				if first.IsZero() || at.Before(first) {
					first = at
				}
				if at.After(last) {
					last = at
				}
			}
		}
	}
	return first, last
}

// listEverythingClient is a client of its own user agent, without client-side rate limits, as a
// node plugin starting up would use.
func listEverythingClient(t *testing.T, f *fixture) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(f.s.Config)
	cfg.UserAgent = "list-everything"
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// listEverything does what Ceph CSI's node plugin does at start to find the volumes to heal: it
// lists every VolumeAttachment in the cluster, keeps those of its driver and node, and reads each
// one's PV, the VolumeAttachment itself and the PV's node-stage Secret. It returns the number of
// volumes it found and the number of VolumeAttachments the LIST returned.
func listEverything(t *testing.T, cs kubernetes.Interface, driverName, node string) (found, listed int) {
	t.Helper()
	ctx := t.Context()
	list, err := cs.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mine []storagev1.VolumeAttachment
	for _, va := range list.Items {
		if va.Spec.Attacher == driverName && va.Spec.NodeName == node && va.Spec.Source.PersistentVolumeName != nil {
			mine = append(mine, va)
		}
	}
	work := make(chan storagev1.VolumeAttachment)
	errs := make(chan error, len(mine))
	const workers = 8
	for range workers {
		go func() {
			for va := range work {
				errs <- readVolume(ctx, cs, va)
			}
		}()
	}
	for _, va := range mine {
		work <- va
	}
	close(work)
	for range mine {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return len(mine), len(list.Items)
}

func readVolume(ctx context.Context, cs kubernetes.Interface, va storagev1.VolumeAttachment) error {
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, *va.Spec.Source.PersistentVolumeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if _, err := cs.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{}); err != nil {
		return err
	}
	ref := pv.Spec.CSI.NodeStageSecretRef
	if ref == nil {
		return fmt.Errorf("PV %s has no node-stage Secret", pv.Name)
	}
	_, err = cs.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	return err
}

// perfFigures are the measured figures of TestAPIRequestsPerRestartSweep.
type perfFigures struct {
	volumes, broken int
	apiserver       string
	// sweepTime runs from the sweep's first call to its last.
	sweepTime    time.Duration
	sweepClients map[string]requestCounts
	sweepMetric  requestCounts
	leVolumes    int
	leListed     int
	leTime       time.Duration
	leClients    map[string]requestCounts
	leMetric     requestCounts
}

func (p perfFigures) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s; kube-apiserver %s with etcd, both local; %d volumes attached to the restarted node, %d of them broken (mount gone).\n\n",
		time.Now().UTC().Format("2006-01-02"), machine(), p.apiserver, p.volumes, p.broken)
	b.WriteString("| Approach | LIST | GET | WATCH | Writes | Total | Time |\n|---|---:|---:|---:|---:|---:|---:|\n")
	row := func(name string, c requestCounts, d time.Duration) {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %s |\n", name, c.byVerb("list"), c.byVerb("get"), c.byVerb("watch"), c.writes(), c.total(), d.Round(10*time.Millisecond))
	}
	row("volume-healer restart sweep: the controller's requests", p.sweepClients[clientController], p.sweepTime)
	row("volume-healer restart sweep: the sidecar's requests", p.sweepClients[clientSidecar], p.sweepTime)
	row("list-everything at plugin start (Ceph CSI's way)", p.leClients[clientListEverything], p.leTime)

	clients := func(title string, byClient map[string]requestCounts, metric requestCounts) {
		fmt.Fprintf(&b, "\n%s\n\n| Counted by | Requests |\n|---|---|\n", title)
		names := make([]string, 0, len(byClient))
		for c := range byClient {
			names = append(names, c)
		}
		slices.Sort(names)
		for _, c := range names {
			fmt.Fprintf(&b, "| audit log: %s | %s |\n", c, byClient[c].describe())
		}
		fmt.Fprintf(&b, "| apiserver_request_total: all clients | %s |\n", metric.describe())
	}
	clients("Every request answered during the restart sweep's window:", p.sweepClients, p.sweepMetric)
	fmt.Fprintf(&b, "\nThe sweep's time runs from its first call to the driver to its last. The list-everything LIST returned %d VolumeAttachments (every one in the cluster), %d of them on the node.\n",
		p.leListed, p.leVolumes)
	clients("Every request answered during the list-everything reads:", p.leClients, p.leMetric)
	return b.String()
}

// machine describes the machine the test runs on: CPU model, cores and memory.
func machine() string {
	model, mem := "unknown CPU", "unknown memory"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb int64
				if _, err := fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb); err == nil {
					mem = fmt.Sprintf("%.1f GiB RAM", float64(kb)/(1<<20))
				}
			}
		}
	}
	return fmt.Sprintf("%s, %d cores (nproc), %s, %s/%s, %s", model, runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
