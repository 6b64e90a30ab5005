package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// The simulated story's driver and the namespace of its node plugins.
const (
	driverName      = "rbd.csi.ceph.com"
	pluginNamespace = "csi-rbd"
)

// simulatedDemo is the story on simulated nodes: node plugin pods in this process whose driver
// keeps its volumes as records, so that nothing is mounted and many nodes fit one machine.
func simulatedDemo(s *harness.Script, dir string, o options) error {
	ctx := s.Context()
	step("Starting a local control plane (kube-apiserver and etcd)")
	cluster, err := harness.StartCluster(ctx, harness.ClusterOptions{Dir: dir})
	if err != nil {
		return err
	}
	s.Cleanup(func() { _ = cluster.Stop() })
	fmt.Printf("  kubeconfig: %s   (kubectl --kubeconfig %s get pvc -A)\n", cluster.Kubeconfig, cluster.Kubeconfig)
	fmt.Printf("  logs: %s (this program's sidecars and clients), %s (the controller)\n", filepath.Join(dir, inProcessLog), filepath.Join(dir, "controller.log"))

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
	events := newEventPrinter(cluster.Clientset, appNamespace, pluginNamespace)
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
		v.SetCondition(s, control.Gone, 0)
	}
	lost[0].SetCondition(s, control.Lost, 0)
	restartedAt := time.Now()
	if err := victim.Start(ctx); err != nil {
		return err
	}

	healed := func() bool { return countCondition(ctx, broken, control.Healthy) == len(broken) }
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
	step("A mount on %s turns read-only; StorageClass %s gets a periodic schedule of %s", other.Node(), degraded[0].StorageClass, o.schedule)
	degraded[0].SetCondition(s, control.ReadOnly, 0)
	var sc storagev1.StorageClass
	if err := cluster.Client.Get(ctx, client.ObjectKey{Name: degraded[0].StorageClass}, &sc); err != nil {
		return err
	}
	sc.Annotations = map[string]string{annotations.Schedule: o.schedule}
	if err := cluster.Client.Update(ctx, &sc); err != nil {
		return err
	}
	if err := watch(ctx, o.timeout, plugins, vols, events, func() bool {
		return countCondition(ctx, degraded, control.Healthy) == 1
	}); err != nil {
		return fmt.Errorf("periodic sweep: %w (controller log: %s)", err, ctrl.LogPath)
	}

	summary(ctx, plugins, vols, broken, lost, degraded, healTime)
	want := statusWant{driver: driverName, node: victim.Node(), volumes: map[string]bool{appNamespace + "/" + lost[0].PVC: true}}
	if err := operatorView(ctx, o.healerctl, cluster.Kubeconfig, want, 0); err != nil {
		return err
	}
	return end(ctx, o.hold, cluster.Kubeconfig, "pvc,events", nil)
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
		counts := map[control.Condition]int{}
		for _, v := range vols {
			if v.Node != p.Node() {
				continue
			}
			if vol, err := p.Driver().Volume(v.Handle); err == nil {
				counts[vol.Condition]++
			}
		}
		c := p.Driver().Counters()
		fmt.Fprintf(w, "  \t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Node(), counts[control.Healthy], counts[control.Gone],
			counts[control.ReadOnly], counts[control.Lost], c.Calls["ProbeVolume"], c.Calls["HealVolume"])
	}
	_ = w.Flush()
	return b.String()
}

func countCondition(ctx context.Context, vols []*harness.Volume, cond control.Condition) int {
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
	healthy := countCondition(ctx, vols, control.Healthy)
	fmt.Printf("  volumes: %d (%d healthy now)\n", len(vols), healthy)
	fmt.Printf("  broken by the restart: %d, healed: %d\n", len(broken), countCondition(ctx, broken, control.Healthy))
	fmt.Printf("  read-only found by the periodic sweep: %d, healed: %d\n", len(degraded), countCondition(ctx, degraded, control.Healthy))
	fmt.Printf("  data loss: %d, left for a human (Event VolumeDataLoss on the PVC)\n", countCondition(ctx, lost, control.Lost))
	fmt.Printf("  probe calls: %d, heal calls: %d, most calls on one volume at once: %d\n", probes, heals, maxPerVolume)
	fmt.Printf("  time from the node plugin restart to its last heal: %s\n", healTime.Round(10*time.Millisecond))
	noRecycleHere("simulated nodes")
}
