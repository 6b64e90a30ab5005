package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
	"github.com/volume-healer/volume-healer/test/harness"
)

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
	// The harness's cluster helpers fail a test; under RunScript they end the demo with an error.
	// What the demo starts is stopped when it ends, last started first.
	return harness.RunScript(ctx, "demo", func(s *harness.Script) error { return demo(s, dir, o) })
}

func demo(s *harness.Script, dir string, o options) error {
	ctx := s.Context()
	step("Starting a local control plane (kube-apiserver and etcd)")
	cluster, err := harness.StartCluster(ctx, harness.ClusterOptions{Dir: dir})
	if err != nil {
		return err
	}
	s.Cleanup(func() { _ = cluster.Stop() })
	fmt.Printf("  kubeconfig: %s   (kubectl --kubeconfig %s get pvc -A)\n", cluster.Kubeconfig, cluster.Kubeconfig)

	vols, plugins, err := setUp(s, cluster, dir, o)
	if err != nil {
		return err
	}

	step("Starting the controller (%s)", o.controller)
	ctrl, err := startController(cluster, dir, o.controller)
	if err != nil {
		return err
	}
	s.Cleanup(func() { _ = ctrl.Stop(40 * time.Second) })
	events := newEventPrinter(cluster.Clientset)
	if err := harness.WaitFor(ctx, time.Minute, "the first restart sweeps (the plugins' first start)", func() (bool, string) {
		return allHandled(ctx, cluster.Client)
	}); err != nil {
		return fmt.Errorf("%w (controller log: %s)", err, ctrl.LogPath)
	}
	fmt.Printf("  every node plugin's first start swept: %d volumes healthy\n", len(vols))
	events.skipExisting(ctx)

	// The node plugin on the second node restarts (an upgrade, an OOM kill): its rbd-nbd mounters
	// die with it, so those volumes go dead under their pods; krbd volumes live in the kernel and
	// survive. One volume had lost its data already.
	victim := plugins[len(plugins)/2]
	var broken, lost []*harness.Volume
	for _, v := range vols {
		if v.Node != victim.Node() {
			continue
		}
		switch {
		case v.Mounter == "rbd-nbd" && len(lost) == 0:
			lost = append(lost, v)
		case v.Mounter == "rbd-nbd":
			broken = append(broken, v)
		}
	}
	step("Restarting the node plugin on %s: its %d rbd-nbd mounters die with it, one volume has lost its data", victim.Node(), len(broken)+len(lost))
	if err := victim.Stop(); err != nil {
		return err
	}
	for _, v := range broken {
		v.SetCondition(s, driver.Gone, 0)
	}
	lost[0].SetCondition(s, driver.Lost, 0)
	restartedAt := time.Now()
	if err := victim.Start(ctx); err != nil {
		return err
	}

	healed := func() bool { return countCondition(ctx, broken, driver.Healthy) == len(broken) }
	err = watch(ctx, o.timeout, plugins, vols, events, healed)
	healTime := time.Since(restartedAt)
	if err != nil {
		return fmt.Errorf("restart sweep: %w (controller log: %s)", err, ctrl.LogPath)
	}
	fmt.Printf("  restart to last heal: %s\n", healTime.Round(10*time.Millisecond))

	// A periodic sweep finds what no restart announced: a mount on another node turned read-only.
	other := plugins[0]
	var degraded []*harness.Volume
	for _, v := range vols {
		if v.Node == other.Node() && v.Mounter == "rbd-nbd" {
			degraded = append(degraded, v)
			break
		}
	}
	step("A mount on %s turns read-only; StorageClass %s gets a periodic schedule of @every 10s", other.Node(), degraded[0].StorageClass)
	degraded[0].SetCondition(s, driver.ReadOnly, 0)
	var sc storagev1.StorageClass
	if err := cluster.Client.Get(ctx, client.ObjectKey{Name: degraded[0].StorageClass}, &sc); err != nil {
		return err
	}
	sc.Annotations = map[string]string{annotations.Schedule: "@every 10s"}
	if err := cluster.Client.Update(ctx, &sc); err != nil {
		return err
	}
	if err := watch(ctx, o.timeout, plugins, vols, events, func() bool {
		return countCondition(ctx, degraded, driver.Healthy) == 1
	}); err != nil {
		return fmt.Errorf("periodic sweep: %w (controller log: %s)", err, ctrl.LogPath)
	}

	summary(ctx, plugins, vols, broken, lost, degraded, healTime)
	if err := operatorView(ctx, o.healerctl, cluster.Kubeconfig, victim.Node(), lost[0]); err != nil {
		return err
	}
	if o.hold {
		fmt.Printf("\nThe cluster stays up: kubectl --kubeconfig %s get pvc,events -A. Ctrl-C ends the demo.\n", cluster.Kubeconfig)
		<-ctx.Done()
	}
	return nil
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

// setUp creates the cluster objects and starts the node plugins: on each node, every fourth volume
// is krbd, the others rbd-nbd.
func setUp(s *harness.Script, cluster *harness.Cluster, dir string, o options) ([]*harness.Volume, []*harness.Plugin, error) {
	step("Creating %d nodes, %d volumes each (rbd-nbd and krbd), with their PVs, PVCs and VolumeAttachments", o.nodes, o.volumes)
	f := harness.NewFixture(s, cluster.Env, harness.FixtureOptions{Name: "demo", Driver: driverName, PluginNamespace: pluginNamespace, AppNamespace: appNamespace})
	nbd := f.StorageClass("ceph-rbd-nbd", "rbd-nbd", nil)
	krbd := f.StorageClass("ceph-rbd", "", nil)
	var vols []*harness.Volume
	var plugins []*harness.Plugin
	for n := 1; n <= o.nodes; n++ {
		node := fmt.Sprintf("node-%d", n)
		f.CreateNode(node)
		p, err := harness.NewPlugin(harness.PluginOptions{
			Node: node, Driver: f.Driver, Namespace: f.PluginNS, Kube: cluster.Config,
			Dir: filepath.Join(dir, node), KeepPort: true,
		})
		if err != nil {
			return nil, nil, err
		}
		s.Cleanup(func() { _ = p.Close() })
		plugins = append(plugins, p)
		nodeVols := f.NewVolumes(node, p.Control(), nbd, "rbd-nbd", node, o.volumes-o.volumes/4)
		nodeVols = append(nodeVols, f.NewVolumes(node, p.Control(), krbd, "krbd", node+"-krbd", o.volumes/4)...)
		p.AddVolumes(harness.Specs(nodeVols)...)
		vols = append(vols, nodeVols...)
	}
	f.CreateVolumes(vols, true)
	for _, p := range plugins {
		if err := p.Start(s.Context()); err != nil {
			return nil, nil, fmt.Errorf("node plugin on %s: %w", p.Node(), err)
		}
	}
	return vols, plugins, nil
}

// startController starts the controller as its own process, with settings that make a short
// demo: a quick debounce and backoff, at most 4 calls at a time per node.
func startController(cluster *harness.Cluster, dir, bin string) (*harness.Controller, error) {
	settings := cluster.ControllerSettings()
	settings["RESTART_DEBOUNCE"] = "500ms"
	settings["SCHEDULE_DEFAULT"] = ""
	settings["SCHEDULE_STAGGER"] = "2s"
	settings["BACKOFF_BASE"] = "500ms"
	settings["BUDGETS_PER_NODE"] = "4"
	ctrl, err := harness.StartController(harness.NewProcesses(), harness.ControllerOptions{
		Name: "controller", Binary: bin, Settings: settings, Args: []string{"--log-verbosity=2"},
		LogPath: filepath.Join(dir, "controller.log"),
	})
	if err != nil {
		return nil, fmt.Errorf("%w (run make build first)", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "controller.pid"), []byte(fmt.Sprint(ctrl.Pid())), 0o644); err != nil {
		return nil, err
	}
	fmt.Printf("  controller pid %d, log %s, metrics http://%s/metrics\n", ctrl.Pid(), ctrl.LogPath, ctrl.MetricsAddr)
	return ctrl, nil
}

// allHandled reports whether every CSIAddonsNode's current restart has been swept.
func allHandled(ctx context.Context, c client.Client) (bool, string) {
	pending, seen, err := harness.RestartsPending(ctx, c, "")
	if err != nil {
		return false, err.Error()
	}
	return seen > 0 && len(pending) == 0, fmt.Sprintf("%d of %d restarts not swept yet", len(pending), seen)
}

// watch prints progress, a table of volumes by state and new Events until done says so.
func watch(ctx context.Context, timeout time.Duration, plugins []*harness.Plugin, vols []*harness.Volume, events *eventPrinter, done func() bool) error {
	last := ""
	return harness.WaitFor(ctx, timeout, "the broken volumes to heal", func() (bool, string) {
		events.print(ctx)
		// The table is printed when a count changes, with the time of the change.
		table := stateTable(plugins, vols)
		if table != last {
			fmt.Printf("  %s\n%s", time.Now().Format("15:04:05.000"), table)
			last = table
		}
		return done(), "not yet"
	})
}

func stateTable(plugins []*harness.Plugin, vols []*harness.Volume) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "  \tNODE\tHEALTHY\tGONE\tREADONLY\tLOST\tPROBES\tHEALS\n")
	for _, p := range plugins {
		counts := map[driver.Condition]int{}
		for _, v := range vols {
			if v.Node != p.Node() {
				continue
			}
			if vol, err := p.Driver().Volume(v.Handle); err == nil {
				counts[vol.Condition]++
			}
		}
		c := p.Driver().Counters()
		fmt.Fprintf(w, "  \t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Node(), counts[driver.Healthy], counts[driver.Gone],
			counts[driver.ReadOnly], counts[driver.Lost], c.Calls["ProbeVolume"], c.Calls["HealVolume"])
	}
	_ = w.Flush()
	return b.String()
}

func countCondition(ctx context.Context, vols []*harness.Volume, cond driver.Condition) int {
	n := 0
	for _, v := range vols {
		if vol, err := v.Control.Volume(ctx, v.Handle); err == nil && vol.Condition == cond {
			n++
		}
	}
	return n
}

func summary(ctx context.Context, plugins []*harness.Plugin, vols, broken, lost, degraded []*harness.Volume, healTime time.Duration) {
	step("Summary")
	var probes, heals, maxPerVolume int64
	for _, p := range plugins {
		c := p.Driver().Counters()
		probes += c.Calls["ProbeVolume"]
		heals += c.Calls["HealVolume"]
		for _, m := range c.MaxConcurrentPerVolume {
			maxPerVolume = max(maxPerVolume, m)
		}
	}
	healthy := countCondition(ctx, vols, driver.Healthy)
	fmt.Printf("  volumes: %d (%d healthy now)\n", len(vols), healthy)
	fmt.Printf("  broken by the restart: %d, healed: %d\n", len(broken), countCondition(ctx, broken, driver.Healthy))
	fmt.Printf("  read-only found by the periodic sweep: %d, healed: %d\n", len(degraded), countCondition(ctx, degraded, driver.Healthy))
	fmt.Printf("  data loss: %d, left for a human (Event VolumeDataLoss on the PVC)\n", countCondition(ctx, lost, driver.Lost))
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

// operatorView shows what an operator sees with `healerctl status` (`kubectl healer status`), and
// checks it: the restart of the node whose plugin restarted is handled, the volume whose data is
// lost waits for a human, nothing else does, and the exit code says so.
func operatorView(ctx context.Context, healerctl, kubeconfig, restarted string, lost *harness.Volume) error {
	step("What an operator sees: healerctl status (or kubectl healer status)")
	table, code, err := runHealerctl(ctx, healerctl, "status", "--kubeconfig", kubeconfig)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		fmt.Printf("  %s\n", line)
	}
	fmt.Printf("  exit code %d: %s\n", code, map[bool]string{true: "something needs a human", false: "nothing needs a human"}[code != 0])
	raw, jsonCode, err := runHealerctl(ctx, healerctl, "status", "--kubeconfig", kubeconfig, "-o", "json")
	if err != nil {
		return err
	}
	var st struct {
		Restarts []struct{ Driver, Node, State string }
		Volumes  []struct {
			PVC      string
			DataLoss bool
		}
		Problems []string
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return fmt.Errorf("healerctl status -o json: %w", err)
	}
	var problems []string
	if code != 2 || jsonCode != 2 {
		problems = append(problems, fmt.Sprintf("exit codes %d and %d, want 2: a volume's data is lost", code, jsonCode))
	}
	handled := false
	for _, r := range st.Restarts {
		handled = handled || r.Driver == driverName && r.Node == restarted && r.State == "handled"
	}
	if !handled {
		problems = append(problems, fmt.Sprintf("the restart on %s is not listed as handled: %+v", restarted, st.Restarts))
	}
	if want := appNamespace + "/" + lost.PVC; len(st.Volumes) != 1 || st.Volumes[0].PVC != want || !st.Volumes[0].DataLoss || len(st.Problems) != 1 {
		problems = append(problems, fmt.Sprintf("volumes %+v and problems %q, want only %s with its data lost", st.Volumes, st.Problems, want))
	}
	if len(problems) > 0 {
		return fmt.Errorf("healerctl status: %s", strings.Join(problems, "; "))
	}
	return nil
}

// runHealerctl runs healerctl and returns its standard output and exit code; an error only when
// it could not run or failed (exit code 1).
func runHealerctl(ctx context.Context, healerctl string, args ...string) (string, int, error) {
	cmd := exec.CommandContext(ctx, healerctl, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0, nil
	case errors.As(err, &exit) && exit.ExitCode() > 1:
		return stdout.String(), exit.ExitCode(), nil
	default:
		return "", 0, fmt.Errorf("%s %s: %w: %s (run make build first)", healerctl, strings.Join(args, " "), err, stderr.String())
	}
}
