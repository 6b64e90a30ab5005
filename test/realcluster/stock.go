package realcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/test/controlplane"
	"github.com/volume-healer/volume-healer/test/harness"
)

// InstallStock installs the reference driver's chart a second time, as a driver that serves no
// Healer service (node.mode=stock) with a FUSE mounter nobody here wrote (rclone, from Debian's
// package, in the image healer-refdriver-rclone), with the healer sidecar beside it, and waits
// until kubelet registered it. The volume-healer chart binds the sidecar's cluster-side RBAC to one
// driver namespace; the second driver's is bound here as an operator who adds a driver does:
// the chart's ClusterRole for its ServiceAccount, and a Role for its CSIAddonsNodes.
func (e *Env) InstallStock(t harness.TB) {
	t.Helper()
	e.stock = true
	e.installDriverRelease(t, driverRelease{
		release: stockRelease, namespace: stockNS, driver: stockDriver, class: stockClass, image: "healer-refdriver-rclone",
		folders: []string{stockStateDir}, what: "stock mode, rclone",
		values: []string{"stateDir=" + stockStateDir, "node.mode=stock", "node.mounter=rclone"},
	})
}

// driverRelease is a further release of the reference driver's chart beside the first.
type driverRelease struct {
	release, namespace, driver, class string
	// image is the cluster image of the driver (hack/images --cluster-images).
	image string
	// folders are the node folders the release writes, removed after the test unless they
	// were there before it: after the teardown, once no pod or node plugin writes in them.
	folders []string
	// what says in a few words what the release runs, for the log.
	what string
	// values are the chart values it sets besides the driver's name, class and images.
	values []string
}

// installDriverRelease installs r with the images built here and the healer sidecar beside its
// node plugin, and waits until kubelet registered its driver. The volume-healer chart binds the
// sidecar's cluster-side RBAC to one driver namespace; a further driver's is bound here as an
// operator who adds a driver does (sidecarRBAC).
func (e *Env) installDriverRelease(t harness.TB, r driverRelease) {
	t.Helper()
	for _, dir := range r.folders {
		e.removeAfterTeardown(dir, r.release)
	}
	e.namespace(r.namespace, nil)
	e.sidecarRBAC(t, r.namespace)
	img := e.assets.Images
	driverImg, ok := img[r.image]
	if !ok {
		t.Fatalf("no image %s among the cluster images (hack/images --cluster-images builds it)", r.image)
	}
	begin := time.Now()
	args := []string{"install", r.release, "deploy/helm/healer-refdriver", "--namespace", r.namespace,
		"--set", "driverName=" + r.driver, "--set", "storageClass.name=" + r.class,
		"--set", "images.refdriver.repository=" + driverImg.Repository, "--set", "images.refdriver.tag=" + driverImg.Tag,
		"--set", "images.healerSidecar.repository=" + img["healer-sidecar"].Repository, "--set", "images.healerSidecar.tag=" + img["healer-sidecar"].Tag,
		"--set", "images.csiProvisioner.repository=" + img["csi-provisioner"].Repository, "--set", "images.csiProvisioner.tag=" + img["csi-provisioner"].Tag,
		"--set", "images.csiAttacher.repository=" + img["csi-attacher"].Repository, "--set", "images.csiAttacher.tag=" + img["csi-attacher"].Tag,
		"--wait", "--timeout", "5m"}
	for _, v := range r.values {
		args = append(args, "--set", v)
	}
	for _, name := range []string{"refdriver", "healerSidecar", "csiProvisioner", "csiAttacher"} {
		args = append(args, "--set", "images."+name+".pullPolicy=Never")
	}
	e.must(t, "helm", args...)
	t.Logf("helm install %s (%s): %s", r.release, r.what, time.Since(begin).Round(100*time.Millisecond))
	e.waitRegistered(r.driver)
}

// sidecarRBAC binds, for the node plugin ServiceAccount of a further release of the driver's
// chart in ns, what the volume-healer chart binds for the first driver's
// (deploy/helm/volume-healer/templates/sidecar.yaml).
func (e *Env) sidecarRBAC(t harness.TB, ns string) {
	t.Helper()
	ctx := t.Context()
	rbac := e.c.Clientset.RbacV1()
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "healer-refdriver-node", Namespace: ns}}
	const name = controllerDep + "-sidecar"
	create := func(what string, err error) {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create the sidecar's %s: %v", what, err)
		}
	}
	_, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "." + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   subject,
	}, metav1.CreateOptions{})
	create("ClusterRoleBinding", err)
	_, err = rbac.Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"csiaddons.openshift.io"}, Resources: []string{"csiaddonsnodes"},
			Verbs: []string{"get", "list", "watch", "create", "patch"},
		}},
	}, metav1.CreateOptions{})
	create("Role", err)
	_, err = rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   subject,
	}, metav1.CreateOptions{})
	create("RoleBinding", err)
	t.Cleanup(func() {
		_ = e.c.Clientset.RbacV1().ClusterRoleBindings().Delete(context.Background(), name+"."+ns, metav1.DeleteOptions{})
	})
}

// StockStatefulSet creates a StatefulSet of replicas pods on the stock driver's volumes, with
// mount propagation None, as most pods mount their volumes.
func (e *Env) StockStatefulSet(name string, replicas int) *Workload {
	e.t.Helper()
	return e.StatefulSetOf(stockClass, name, corev1.MountPropagationNone, replicas)
}

// RolloutRestartStock restarts the stock driver's node plugin DaemonSet, as an upgrade does.
func (e *Env) RolloutRestartStock(t harness.TB) {
	t.Helper()
	e.must(t, "kubectl", "rollout", "restart", "daemonset/"+stockDS, "--namespace", stockNS)
}

// KillStockDriverContainer kills the stock node plugin's driver process with SIGKILL; kubelet
// restarts the container in the same pod, and the mounters, its children, die with it.
func (e *Env) KillStockDriverContainer(t harness.TB) {
	t.Helper()
	e.killContainer(t, stockNS, stockPods, "refdriver")
}

// stockNode is what the suite reads of a driver's CSIAddonsNode on the node (first the stock
// driver's).
type stockNode struct {
	restart, handled string
	tier             map[string]any
	pod              types.UID
	// sweep is what the last finished restart sweep did, when the controller recorded it.
	sweep *healer.RestartSweepResult
}

// stockCSIAddonsNode reads the stock driver's CSIAddonsNode on the node, which its healer sidecar
// created (no csi-addons sidecar runs beside it).
func (e *Env) stockCSIAddonsNode(ctx context.Context, c client.Client) (stockNode, error) {
	return e.driverCSIAddonsNode(ctx, c, stockNS, stockDriver)
}

// driverCSIAddonsNode reads the CSIAddonsNode of driver on the node, in ns, which its healer
// sidecar created.
func (e *Env) driverCSIAddonsNode(ctx context.Context, c client.Client, ns, driver string) (stockNode, error) {
	var list csiaddonsv1alpha1.CSIAddonsNodeList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return stockNode{}, err
	}
	var found []csiaddonsv1alpha1.CSIAddonsNode
	for _, o := range list.Items {
		if o.Spec.Driver.Name == driver && o.Spec.Driver.NodeID == e.c.NodeName() {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return stockNode{}, fmt.Errorf("%d CSIAddonsNodes of %s on %s", len(found), driver, e.c.NodeName())
	}
	a := found[0].Annotations
	n := stockNode{restart: a[annotations.HealerRestart], handled: a[annotations.HandledMarker]}
	if _, uid, ok := strings.Cut(n.restart, "/"); ok {
		n.pod = types.UID(uid)
	}
	if raw := a[annotations.RestartSweep]; raw != "" {
		n.sweep = &healer.RestartSweepResult{}
		if err := json.Unmarshal([]byte(raw), n.sweep); err != nil {
			return n, fmt.Errorf("CSIAddonsNode %s: %s %q: %w", found[0].Name, annotations.RestartSweep, raw, err)
		}
	}
	if raw := a[annotations.DriverTier]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &n.tier); err != nil {
			return n, fmt.Errorf("CSIAddonsNode %s: %s %q: %w", found[0].Name, annotations.DriverTier, raw, err)
		}
	}
	return n, nil
}

// crClient is a controller-runtime client of the cluster that knows the CSIAddonsNode kind.
func (e *Env) crClient(t harness.TB) client.Client {
	t.Helper()
	scheme, err := controlplane.NewScheme()
	if err != nil {
		t.Fatalf("%v", err)
	}
	c, err := client.New(e.c.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return c
}

// WaitStockSwept waits until the running stock node plugin pod's restart is recorded handled on
// its CSIAddonsNode, and the controller recorded the driver's tier as none, probed by the sidecar.
func (e *Env) WaitStockSwept(t harness.TB, timeout time.Duration) {
	t.Helper()
	c := e.crClient(t)
	harness.Eventually(t, timeout, "the stock driver's CSIAddonsNode to show tier none and its restart swept", func() (bool, string) {
		ctx := t.Context()
		pods, err := e.c.Clientset.CoreV1().Pods(stockNS).List(ctx, metav1.ListOptions{LabelSelector: stockPods})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 || pods.Items[0].DeletionTimestamp != nil {
			return false, fmt.Sprintf("%d stock node plugin pods, want one that is not going away", len(pods.Items))
		}
		n, err := e.stockCSIAddonsNode(ctx, c)
		switch {
		case err != nil:
			return false, err.Error()
		case n.pod != pods.Items[0].UID:
			return false, fmt.Sprintf("restart marker %q is not of the running pod %s", n.restart, pods.Items[0].UID)
		case n.tier["tier"] != "none" || n.tier["probeSource"] != "sidecar":
			return false, fmt.Sprintf("driver tier %v, want tier none probed by the sidecar", n.tier)
		case n.handled == "" || !strings.Contains(n.handled, n.restart):
			return false, fmt.Sprintf("handled marker %q, restart marker %q", n.handled, n.restart)
		}
		return true, ""
	})
}

// DisruptStock breaks the stock driver's node plugin with breakIt and checks the remedy of a
// driver that cannot heal: the sidecar's own probe finds the dead mounts, the policy recycles each
// volume (every pod using it on the node evicted through the Eviction API, Events VolumeRecycling
// and EvictedForRecycle), kubelet stages and publishes it again for the replacement pods through
// the driver's own NodeStage and NodePublish, whose writes succeed (Event VolumeRecycled); the
// restart is recorded handled only once no volume is left on a dead mount. It returns each
// pod's outage, first failed try to first good one, in the pod or its replacement.
func (e *Env) DisruptStock(t harness.TB, w *Workload, what string, breakIt func()) []time.Duration {
	t.Helper()
	ctx := t.Context()
	c := e.crClient(t)
	before := map[string]types.UID{}
	for _, slot := range w.slots() {
		p, err := e.c.Clientset.CoreV1().Pods(appsNS).Get(ctx, slot, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%v", err)
		}
		before[slot] = p.UID
	}
	old, err := e.stockCSIAddonsNode(ctx, c)
	if err != nil {
		t.Fatalf("%v", err)
	}
	recyclesBefore := e.recycled(t)

	at := time.Now()
	rec := w.Record(at)
	defer rec.Stop()
	// The moment the new restart is recorded handled, no staging mount of the driver may still be
	// dead. Watched meanwhile, since that moment passes.
	watch := e.watchHandled(c, old)
	breakIt()

	harness.Eventually(t, 3*time.Minute, "the pods of "+w.name+" to be replaced by pods that write and read their volumes", func() (bool, string) {
		var waiting []string
		for _, slot := range w.slots() {
			p, err := e.c.Clientset.CoreV1().Pods(appsNS).Get(ctx, slot, metav1.GetOptions{})
			if err != nil {
				waiting = append(waiting, slot+": "+err.Error())
				continue
			}
			if p.UID == before[slot] {
				state, _ := w.podState(ctx, p)
				waiting = append(waiting, fmt.Sprintf("%s still the pod from before (%s)", slot, state))
				continue
			}
			if ok, failure, err := w.PodState(ctx, p.Name); err != nil || !ok {
				waiting = append(waiting, fmt.Sprintf("%s replaced, not writing yet (%s %v)", slot, failure, err))
			}
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	})
	var outages []time.Duration
	harness.Eventually(t, time.Minute, "the recorded tries of "+w.name+" to show each pod's outage", func() (bool, string) {
		outages = outages[:0]
		var missing []string
		for slot, o := range rec.Outages() {
			if !o.Over() {
				missing = append(missing, slot+": "+o.String())
				continue
			}
			outages = append(outages, o.Duration())
		}
		return len(missing) == 0, strings.Join(missing, "; ")
	})
	for slot, o := range rec.Outages() {
		t.Logf("%s: %s: %s", what, slot, o)
	}
	for _, claim := range w.claims {
		e.expectEvent(t, "PersistentVolumeClaim", claim, evict.ReasonVolumeRecycling, at)
		e.expectEvent(t, "PersistentVolumeClaim", claim, healer.ReasonVolumeRecycled, at)
	}
	for slot := range before {
		e.expectEvent(t, "Pod", slot, evict.ReasonEvictedForRecycle, at)
	}
	e.WaitStockSwept(t, 2*time.Minute)
	if staged, err := watch(); err != nil {
		t.Errorf("%s: %v", what, err)
	} else {
		t.Logf("%s: the restart was recorded handled with %d of the %d volumes staged again, live, and the others unstaged with no pod from before left", what, staged, len(w.claims))
	}
	e.outages.Add(RemedyRecycle, what, outages...)
	if got := e.recycled(t); got < recyclesBefore+float64(len(w.claims)) {
		t.Errorf("volume_healer_recycles_total{result=\"recycled\"} = %v, want at least %v", got, recyclesBefore+float64(len(w.claims)))
	}
	return outages
}

// podState says what pod's latest try did.
func (w *Workload) podState(ctx context.Context, p *corev1.Pod) (string, error) {
	ok, failure, err := w.PodState(ctx, p.Name)
	switch {
	case err != nil:
		return "", err
	case ok:
		return "writes", nil
	}
	return failure, nil
}

// recycled reads volume_healer_recycles_total{result="recycled"} of the controller.
func (e *Env) recycled(t harness.TB) float64 {
	t.Helper()
	var v float64
	harness.Eventually(t, time.Minute, "the controller's metrics", func() (bool, string) {
		m, err := e.ControllerMetrics(t.Context())
		if err != nil {
			return false, err.Error()
		}
		v = 0
		if f := m["volume_healer_recycles_total"]; f != nil {
			for _, s := range f.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "result" && l.GetValue() == evict.RecycleRecycled {
						v = s.GetCounter().GetValue()
					}
				}
			}
		}
		return true, ""
	})
	return v
}

// watchHandled polls the stock CSIAddonsNode until its handled marker names a restart other than
// old's, and then checks at once that no staging mount of the stock driver on the node is dead:
// each volume is either mounted again and answers, or unstaged, its recycle done once no pod from
// before it is left (the replacement's NodeStage mounts it anew). The returned func stops the
// watch and says how many volumes were staged at that moment, or what it found wrong: a restart
// recorded handled while a staging mount was still dead, or none recorded.
func (e *Env) watchHandled(c client.Client, old stockNode) func() (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu              sync.Mutex
		result          = errors.New("no new restart was recorded handled")
		stagedAtHandled int
		done            = make(chan struct{})
	)
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			n, err := e.stockCSIAddonsNode(ctx, c)
			if err == nil && n.handled != "" && n.handled != old.handled && strings.Contains(n.handled, n.restart) && n.restart != old.restart {
				staged, err := e.stagedHealthy()
				mu.Lock()
				if err != nil {
					result = fmt.Errorf("restart %s was recorded handled while %w", n.restart, err)
				} else {
					result, stagedAtHandled = nil, staged
				}
				mu.Unlock()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() (int, error) {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return stagedAtHandled, result
	}
}

// stagedHealthy checks on the node that every staging path of the stock driver is a FUSE mount
// that answers a stat within 5 seconds, and returns how many there are. A recycled volume may
// be unstaged, waiting for its replacement pod's NodeStage: it has no staging mount.
func (e *Env) stagedHealthy() (int, error) {
	mounts, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	defer mounts.Close()
	staged := map[string]string{} // mount point: source
	sc := bufio.NewScanner(mounts)
	prefix := "/var/lib/kubelet/plugins/kubernetes.io/csi/" + stockDriver + "/"
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || !strings.HasPrefix(fields[4], prefix) || !strings.HasSuffix(fields[4], "/globalmount") {
			continue
		}
		sep := 6
		for sep < len(fields) && fields[sep] != "-" {
			sep++
		}
		if sep+2 < len(fields) {
			staged[fields[4]] = fields[sep+1] + " " + fields[sep+2]
		}
	}
	for target, source := range staged {
		if !strings.HasPrefix(source, "fuse") {
			return 0, fmt.Errorf("staging path %s is a %s mount, not FUSE", target, source)
		}
		if err := statWithin(target, 5*time.Second); err != nil {
			return 0, fmt.Errorf("staging path %s is still dead: %w", target, err)
		}
	}
	return len(staged), nil
}

// statWithin stats path in its own goroutine, so that a hung mount costs at most timeout (the
// goroutine stays until the mount answers).
func statWithin(path string, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() {
		var st syscall.Stat_t
		done <- syscall.Stat(path, &st)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("stat did not answer in %s", timeout)
	}
}
