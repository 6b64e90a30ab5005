package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// volume is one demo volume and where it lives.
type volume struct {
	pv, pvc, handle, class, mounter string
	node                            *plugin
}

func run(ctx context.Context, o options) error {
	if err := os.RemoveAll(o.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	// make demo-down stops a demo held open (or left behind) through these.
	if err := os.WriteFile(filepath.Join(dir, "demo.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		return err
	}
	step("Starting a local control plane (kube-apiserver and etcd)")
	env, err := controlplane.New(controlplane.Options{KubeconfigDir: dir})
	if err != nil {
		return err
	}
	defer func() { _ = env.Stop() }()
	fmt.Printf("  kubeconfig: %s   (kubectl --kubeconfig %s get pvc -A)\n", env.Kubeconfig, env.Kubeconfig)

	vols, plugins, err := setUp(ctx, env, dir, o)
	if err != nil {
		return err
	}
	defer func() {
		for _, p := range plugins {
			p.stop()
		}
	}()

	step("Starting the controller (%s)", o.controller)
	ctrl, err := startController(ctx, env, dir, o.controller)
	if err != nil {
		return err
	}
	defer ctrl.stop()
	events := newEventPrinter(env.Clientset)
	if err := waitFor(ctx, time.Minute, "the first restart sweeps (the plugins' first start)", func() (bool, error) {
		return allHandled(ctx, env.Client)
	}); err != nil {
		return fmt.Errorf("%w (controller log: %s)", err, ctrl.log)
	}
	fmt.Printf("  every node plugin's first start swept: %d volumes healthy\n", len(vols))
	events.skipExisting(ctx)

	// The node plugin on the second node restarts (an upgrade, an OOM kill): its rbd-nbd mounters
	// die with it, so those volumes go dead under their pods; krbd volumes live in the kernel and
	// survive. One volume had lost its data already.
	victim := plugins[len(plugins)/2]
	var broken, lost []volume
	for _, v := range vols {
		if v.node != victim {
			continue
		}
		switch {
		case v.mounter == "rbd-nbd" && len(lost) == 0:
			lost = append(lost, v)
		case v.mounter == "rbd-nbd":
			broken = append(broken, v)
		}
	}
	step("Restarting the node plugin on %s: its %d rbd-nbd mounters die with it, one volume has lost its data", victim.node, len(broken)+len(lost))
	victim.stop()
	for _, v := range broken {
		if _, err := victim.drv().SetCondition(v.handle, driver.Gone, 0); err != nil {
			return err
		}
	}
	if _, err := victim.drv().SetCondition(lost[0].handle, driver.Lost, 0); err != nil {
		return err
	}
	restartedAt := time.Now()
	if err := victim.start(ctx, nil); err != nil {
		return err
	}

	healed := func() (bool, error) { return countCondition(broken, driver.Healthy) == len(broken), nil }
	err = watch(ctx, o.timeout, plugins, vols, events, healed)
	healTime := time.Since(restartedAt)
	if err != nil {
		return fmt.Errorf("restart sweep: %w (controller log: %s)", err, ctrl.log)
	}
	fmt.Printf("  restart to last heal: %s\n", healTime.Round(10*time.Millisecond))

	// A periodic sweep finds what no restart announced: a mount on another node turned read-only.
	other := plugins[0]
	var degraded []volume
	for _, v := range vols {
		if v.node == other && v.mounter == "rbd-nbd" {
			degraded = append(degraded, v)
			break
		}
	}
	step("A mount on %s turns read-only; StorageClass ceph-rbd-nbd gets a periodic schedule of @every 10s", other.node)
	if _, err := other.drv().SetCondition(degraded[0].handle, driver.ReadOnly, 0); err != nil {
		return err
	}
	var sc storagev1.StorageClass
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "ceph-rbd-nbd"}, &sc); err != nil {
		return err
	}
	sc.Annotations = map[string]string{annotations.Schedule: "@every 10s"}
	if err := env.Client.Update(ctx, &sc); err != nil {
		return err
	}
	if err := watch(ctx, o.timeout, plugins, vols, events, func() (bool, error) {
		return countCondition(degraded, driver.Healthy) == 1, nil
	}); err != nil {
		return fmt.Errorf("periodic sweep: %w (controller log: %s)", err, ctrl.log)
	}

	summary(plugins, vols, broken, lost, degraded, healTime)
	if o.hold {
		fmt.Printf("\nThe cluster stays up: kubectl --kubeconfig %s get pvc,events -A. Ctrl-C ends the demo.\n", env.Kubeconfig)
		<-ctx.Done()
	}
	return nil
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

// setUp creates the cluster objects and starts the node plugins.
func setUp(ctx context.Context, env *controlplane.Env, dir string, o options) ([]volume, []*plugin, error) {
	step("Creating %d nodes, %d volumes each (rbd-nbd and krbd), with their PVs, PVCs and VolumeAttachments", o.nodes, o.volumes)
	c := env.Client
	attach := true
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "volume-healer"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pluginNamespace}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "volume-healer", Name: "volume-healer"}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driverName}, Spec: storagev1.CSIDriverSpec{AttachRequired: &attach}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "ceph-rbd-nbd"}, Provisioner: driverName,
			Parameters: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "mounter": "rbd-nbd"}},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "ceph-rbd"}, Provisioner: driverName,
			Parameters: map[string]string{"clusterID": "rook-ceph", "pool": "replicapool"}},
	}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			return nil, nil, err
		}
	}
	var vols []volume
	var plugins []*plugin
	for n := 1; n <= o.nodes; n++ {
		nodeName := fmt.Sprintf("node-%d", n)
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}); err != nil {
			return nil, nil, err
		}
		p, err := newPlugin(dir, nodeName, env.Config)
		if err != nil {
			return nil, nil, err
		}
		plugins = append(plugins, p)
		var specs []driver.VolumeSpec
		for i := 1; i <= o.volumes; i++ {
			v := volume{
				pv:     fmt.Sprintf("pvc-%s-%03d", nodeName, i),
				pvc:    fmt.Sprintf("data-%s-%03d", nodeName, i),
				handle: fmt.Sprintf("0001-0009-rook-ceph-0000000000000002-%s-%03d", nodeName, i),
				class:  "ceph-rbd-nbd", mounter: "rbd-nbd", node: p,
			}
			if i%4 == 0 {
				v.class, v.mounter = "ceph-rbd", ""
			}
			if err := createVolume(ctx, c, v); err != nil {
				return nil, nil, err
			}
			vols = append(vols, v)
			attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool"}
			if v.mounter != "" {
				attrs["mounter"] = v.mounter
			}
			specs = append(specs, driver.VolumeSpec{ID: v.handle, Mounter: v.mounter, VolumeContext: attrs})
		}
		if err := p.start(ctx, specs); err != nil {
			return nil, nil, fmt.Errorf("node plugin on %s: %w", nodeName, err)
		}
	}
	return vols, plugins, nil
}

// createVolume creates a bound PV and PVC and an attached VolumeAttachment, as provisioning,
// binding and attaching would leave them.
func createVolume(ctx context.Context, c client.Client, v volume) error {
	attrs := map[string]string{"clusterID": "rook-ceph", "pool": "replicapool", "imageName": "csi-vol-" + v.pv}
	if v.mounter != "" {
		attrs["mounter"] = v.mounter
	}
	size := resource.MustParse("10Gi")
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: v.pv},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: v.class,
			ClaimRef:         &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: appNamespace, Name: v.pvc},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: v.handle, FSType: "ext4", VolumeAttributes: attrs,
			}},
		},
	}
	if err := c.Create(ctx, pv); err != nil {
		return err
	}
	pv.Status.Phase = corev1.VolumeBound
	if err := c.Status().Update(ctx, pv); err != nil {
		return err
	}
	class := v.class
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNamespace, Name: v.pvc},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeName:       v.pv,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if err := c.Create(ctx, pvc); err != nil {
		return err
	}
	pvc.Status.Phase = corev1.ClaimBound
	if err := c.Status().Update(ctx, pvc); err != nil {
		return err
	}
	pvName := v.pv
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-" + v.pv},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driverName, NodeName: v.node.node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
	}
	if err := c.Create(ctx, va); err != nil {
		return err
	}
	va.Status.Attached = true
	return c.Status().Update(ctx, va)
}

// controllerProcess is the controller running as its own process.
type controllerProcess struct {
	cmd *exec.Cmd
	log string
}

func startController(ctx context.Context, env *controlplane.Env, dir, bin string) (*controllerProcess, error) {
	// The controller authenticates to the sidecars with its ServiceAccount's token.
	tokenFile := filepath.Join(dir, "controller-token")
	if err := controlplane.WriteServiceAccountToken(ctx, env.Clientset, "volume-healer", "volume-healer", time.Hour, tokenFile); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "controller.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	metricsAddr, healthAddr, err := twoFreeAddrs()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--log-verbosity=2")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(),
		"VOLUME_HEALER_KUBECONFIG="+env.Kubeconfig,
		"VOLUME_HEALER_METRICS_BIND_ADDRESS="+metricsAddr,
		"VOLUME_HEALER_HEALTH_BIND_ADDRESS="+healthAddr,
		"VOLUME_HEALER_SIDECAR_TLS_ENABLED=false",
		"VOLUME_HEALER_SIDECAR_AUTH_TOKEN_FILE="+tokenFile,
		"VOLUME_HEALER_RESTART_DEBOUNCE=500ms",
		"VOLUME_HEALER_SCHEDULE_DEFAULT=",
		"VOLUME_HEALER_SCHEDULE_STAGGER=2s",
		"VOLUME_HEALER_BACKOFF_BASE=500ms",
		"VOLUME_HEALER_BUDGETS_PER_NODE=4",
	)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w (run make build first)", bin, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "controller.pid"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
		return nil, err
	}
	fmt.Printf("  controller pid %d, log %s, metrics http://%s/metrics\n", cmd.Process.Pid, logPath, metricsAddr)
	return &controllerProcess{cmd: cmd, log: logPath}, nil
}

func (p *controllerProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func twoFreeAddrs() (string, string, error) {
	a, err := freePort()
	if err != nil {
		return "", "", err
	}
	b, err := freePort()
	if err != nil {
		return "", "", err
	}
	return net.JoinHostPort("127.0.0.1", fmt.Sprint(a)), net.JoinHostPort("127.0.0.1", fmt.Sprint(b)), nil
}

// allHandled reports whether every CSIAddonsNode's current restart has been swept.
func allHandled(ctx context.Context, c client.Client) (bool, error) {
	var list csiaddonsv1alpha1.CSIAddonsNodeList
	if err := c.List(ctx, &list); err != nil {
		return false, err
	}
	if len(list.Items) == 0 {
		return false, nil
	}
	for i := range list.Items {
		n := &list.Items[i]
		if n.Annotations[annotations.HandledMarker] != trigger.RestartMarker(n) {
			return false, nil
		}
	}
	return true, nil
}

func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// watch prints progress, a table of volumes by state and new Events until done says so.
func watch(ctx context.Context, timeout time.Duration, plugins []*plugin, vols []volume, events *eventPrinter, done func() (bool, error)) error {
	last := ""
	return waitFor(ctx, timeout, "the broken volumes to heal", func() (bool, error) {
		events.print(ctx)
		// The table is printed when a count changes, with the time of the change.
		table := stateTable(plugins, vols)
		if table != last {
			fmt.Printf("  %s\n%s", time.Now().Format("15:04:05.000"), table)
			last = table
		}
		return done()
	})
}

func stateTable(plugins []*plugin, vols []volume) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "  \tNODE\tHEALTHY\tGONE\tREADONLY\tLOST\tPROBES\tHEALS\n")
	for _, p := range plugins {
		counts := map[driver.Condition]int{}
		for _, v := range vols {
			if v.node != p {
				continue
			}
			if vol, err := p.drv().Volume(v.handle); err == nil {
				counts[vol.Condition]++
			}
		}
		c := p.drv().Counters()
		fmt.Fprintf(w, "  \t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.node, counts[driver.Healthy], counts[driver.Gone],
			counts[driver.ReadOnly], counts[driver.Lost], c.Calls["ProbeVolume"], c.Calls["HealVolume"])
	}
	_ = w.Flush()
	return b.String()
}

func countCondition(vols []volume, cond driver.Condition) int {
	n := 0
	for _, v := range vols {
		if vol, err := v.node.drv().Volume(v.handle); err == nil && vol.Condition == cond {
			n++
		}
	}
	return n
}

func summary(plugins []*plugin, vols []volume, broken, lost, degraded []volume, healTime time.Duration) {
	step("Summary")
	var probes, heals, maxPerVolume int64
	for _, p := range plugins {
		c := p.drv().Counters()
		probes += c.Calls["ProbeVolume"]
		heals += c.Calls["HealVolume"]
		for _, m := range c.MaxConcurrentPerVolume {
			maxPerVolume = max(maxPerVolume, m)
		}
	}
	healthy := countCondition(vols, driver.Healthy)
	fmt.Printf("  volumes: %d (%d healthy now)\n", len(vols), healthy)
	fmt.Printf("  broken by the restart: %d, healed: %d\n", len(broken), countCondition(broken, driver.Healthy))
	fmt.Printf("  read-only found by the periodic sweep: %d, healed: %d\n", len(degraded), countCondition(degraded, driver.Healthy))
	fmt.Printf("  data loss: %d, left for a human (Event VolumeDataLoss on the PVC)\n", countCondition(lost, driver.Lost))
	fmt.Printf("  probe calls: %d, heal calls: %d, most calls on one volume at once: %d\n", probes, heals, maxPerVolume)
	fmt.Printf("  time from the node plugin restart to its last heal: %s\n", healTime.Round(10*time.Millisecond))
}

// eventPrinter prints Events of the demo's namespaces once each.
type eventPrinter struct {
	cs   kubernetes.Interface
	seen map[string]bool
}

func newEventPrinter(cs kubernetes.Interface) *eventPrinter {
	return &eventPrinter{cs: cs, seen: map[string]bool{}}
}

func (e *eventPrinter) list(ctx context.Context) []corev1.Event {
	var out []corev1.Event
	for _, ns := range []string{appNamespace, pluginNamespace} {
		list, err := e.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		out = append(out, list.Items...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastTimestamp.Before(&out[j].LastTimestamp) })
	return out
}

func (e *eventPrinter) skipExisting(ctx context.Context) {
	for _, ev := range e.list(ctx) {
		e.seen[string(ev.UID)] = true
	}
}

// print shows new Events; per-volume Events beyond a few per reason are counted, not listed.
func (e *eventPrinter) print(ctx context.Context) {
	shown := map[string]int{}
	for _, ev := range e.list(ctx) {
		if e.seen[string(ev.UID)] {
			continue
		}
		e.seen[string(ev.UID)] = true
		shown[ev.Reason]++
		if shown[ev.Reason] > 3 {
			continue
		}
		fmt.Printf("  event %-8s %-22s %s/%s: %s\n", ev.Type, ev.Reason, strings.ToLower(ev.InvolvedObject.Kind), ev.InvolvedObject.Name, ev.Message)
	}
	for reason, n := range shown {
		if n > 3 {
			fmt.Printf("  ... and %d more %s events\n", n-3, reason)
		}
	}
}
