package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/kubelet"
)

// The real story's driver, the namespace of its node plugins and the StorageClass of its volumes.
const (
	realDriverName      = "fuse.csi.volume-healer.io"
	realPluginNamespace = "csi-fuse"
	realClass           = "fuse"
)

// realNode is one node of the real story and the volumes its pods use.
type realNode struct {
	*harness.RealNode
	// ctl reaches the control socket of the node's driver, whichever start it is: one client
	// for the whole demo, so that its connections are reused.
	ctl *simulated.ControlClient
	// dir holds the node's kubelet root, its driver's state and its logs.
	dir  string
	vols []*realVolume
}

// realVolume is one volume of the real story: provisioned through CSI, staged and published on
// its node for one pod, and used by that pod's workload.
type realVolume struct {
	*harness.Volume
	// target is the publish path kubelet gave the volume's pod.
	target      string
	propagation corev1.MountPropagationMode
	workload    *kubelet.Workload
}

// The volumes of the restarted node and of the other node that play a part of their own.
const (
	// lostIndex is the volume of the restarted node whose data is removed; privateIndex the one
	// whose workload mounts it with propagation None.
	lostIndex, privateIndex = 0, 1
	// readOnlyIndex and frozenIndex are the volumes of the other node that a periodic sweep
	// finds broken.
	readOnlyIndex, frozenIndex = 0, 1
)

// realDemo is the story on real mounts: nodes whose node plugin serves FUSE mounts, workloads
// in mount namespaces of their own, a node plugin killed for real.
func realDemo(s *harness.Script, dir string, o options) error {
	ctx := s.Context()
	// Runs last: nothing the demo mounted may outlive it. Each node's Close checks that no
	// process of the node is left.
	s.Cleanup(func() {
		if mounts := mountsUnder(dir); len(mounts) > 0 {
			s.Errorf("mounts left behind under %s: %s", dir, strings.Join(mounts, ", "))
		}
	})
	step("Starting a local control plane (kube-apiserver and etcd)")
	cluster, err := harness.StartCluster(ctx, harness.ClusterOptions{Dir: dir})
	if err != nil {
		return err
	}
	s.Cleanup(func() { _ = cluster.Stop() })
	fmt.Printf("  kubeconfig: %s   (kubectl --kubeconfig %s get pvc -A)\n", cluster.Kubeconfig, cluster.Kubeconfig)
	fmt.Printf("  logs: %s (this program's sidecars and clients), %s (the controller), %s (each node's driver and mounters)\n",
		filepath.Join(dir, inProcessLog), filepath.Join(dir, "controller.log"), filepath.Join(dir, "node-*", "refdriver.log"))

	// The workload stand-in is a test program, not one of bin/'s: built like the suites build it.
	workloadBin, err := harness.BuildWorkload()
	if err != nil {
		return err
	}
	f, nodes, err := setUpReal(s, cluster, dir, o, workloadBin)
	if err != nil {
		return err
	}
	victim, other := nodes[len(nodes)/2], nodes[0]

	step("Starting the controller (%s)", o.controller)
	ctrl, err := startController(cluster, dir, o.controller)
	if err != nil {
		return err
	}
	s.Cleanup(func() { _ = ctrl.Stop(40 * time.Second) })
	view := newRealView(nodes)
	events := newEventPrinter(cluster.Clientset, appNamespace, realPluginNamespace)
	if err := view.watch(ctx, time.Minute, "the first restart sweeps (the plugins' first start)", events, func(st []nodeState) (bool, string) {
		if ok, why := allHandled(ctx, cluster.Client); !ok {
			return false, why
		}
		return view.count(st, control.Healthy) == view.volumes() && view.workloads(st, stateWriting) == view.volumes(), "not every volume healthy and written to yet"
	}); err != nil {
		return fmt.Errorf("%w (controller log: %s)", err, ctrl.LogPath)
	}
	fmt.Printf("  every node plugin's first start swept: %d volumes healthy, %d workloads writing\n", view.volumes(), view.volumes())
	events.skipExisting(ctx)

	r, err := restartStory(s, f, victim, view, events, o)
	if err != nil {
		return fmt.Errorf("%w (controller log: %s)", err, ctrl.LogPath)
	}
	p, err := periodicStory(s, f, other, view, events, o)
	if err != nil {
		return fmt.Errorf("%w (controller log: %s)", err, ctrl.LogPath)
	}
	broken := realSummary(ctx, nodes, victim, r, p)
	// The volume whose workload cannot see the repaired mount is not healed: its pod must restart.
	want := statusWant{driver: realDriverName, node: victim.Node(), volumes: map[string]bool{
		appNamespace + "/" + victim.vols[lostIndex].PVC:    true,
		appNamespace + "/" + victim.vols[privateIndex].PVC: false,
	}}
	if err := operatorView(ctx, o.healerctl, cluster.Kubeconfig, want, 0); err != nil {
		broken = append(broken, err.Error())
	}
	return end(ctx, o.hold, cluster.Kubeconfig, "pvc,events", broken)
}

// setUpReal starts the nodes, provisions their volumes through CSI, has each staged and
// published for a pod of its own and starts that pod's workload.
func setUpReal(s *harness.Script, cluster *harness.Cluster, dir string, o options, workloadBin string) (*harness.Fixture, []*realNode, error) {
	ctx := s.Context()
	step("Creating %d nodes with real mounts: on each, a kubelet stand-in, the reference driver as a CSI node plugin process "+
		"(its FUSE mounters in its process group, as in a container) and the healer sidecar", o.nodes)
	f := harness.NewFixture(s, cluster.Env, harness.FixtureOptions{Name: "demo", Driver: realDriverName, PluginNamespace: realPluginNamespace, AppNamespace: appNamespace})
	class := f.StorageClass(realClass, "fuse", nil)
	var nodes []*realNode
	for i := range o.nodes {
		name := fmt.Sprintf("node-%d", i+1)
		f.CreateNode(name)
		rn, err := harness.NewRealNode(harness.RealNodeOptions{
			Node: name, Driver: f.Driver, Namespace: f.PluginNS, Kube: cluster.Config,
			Dir: filepath.Join(dir, name), DriverBinary: o.refdriver, KeepPort: true,
		})
		if err != nil {
			return nil, nil, err
		}
		s.Cleanup(func() {
			if err := rn.Close(); err != nil {
				s.Errorf("node %s: %v", name, err)
			}
		})
		if err := rn.Start(ctx); err != nil {
			return nil, nil, fmt.Errorf("node plugin on %s: %w (driver log: %s)", name, err, rn.DriverLog())
		}
		nodes = append(nodes, &realNode{RealNode: rn, ctl: rn.Control(), dir: filepath.Join(dir, name)})
	}
	victim := nodes[len(nodes)/2]

	interval := workloadInterval(o.nodes * o.volumes)
	step("Provisioning %d volumes per node with CSI CreateVolume; the kubelet stand-in stages and publishes each for a pod, "+
		"whose workload writes, syncs and reads back a file on it every %s", o.volumes, interval)
	var all []*harness.Volume
	for _, n := range nodes {
		for _, v := range f.NewVolumes(n.Node(), n.ctl, class, "fuse", n.Node(), o.volumes) {
			if err := n.Provision(ctx, v); err != nil {
				return nil, nil, err
			}
			all = append(all, v)
			n.vols = append(n.vols, &realVolume{Volume: v, propagation: corev1.MountPropagationHostToContainer})
		}
	}
	f.CreateVolumes(all, true)
	victim.vols[privateIndex].propagation = corev1.MountPropagationNone
	for _, n := range nodes {
		for _, v := range n.vols {
			var err error
			// A pod UID of its own per volume: one pod each.
			if v.target, err = n.Mount(ctx, v.Volume, "uid-"+v.PVC); err != nil {
				return nil, nil, err
			}
			v.workload, err = kubelet.StartWorkload(ctx, kubelet.WorkloadOptions{
				Bin: workloadBin, Target: v.target, Propagation: v.propagation, Name: v.PVC, Interval: interval,
				Dir: filepath.Join(n.dir, "workloads", v.PVC),
			})
			if err != nil {
				return nil, nil, err
			}
			// Stopped before its node closes: the node checks that no process of its own is left.
			s.Cleanup(func() {
				if err := v.workload.Stop(); err != nil {
					s.Errorf("%v", err)
				}
			})
		}
	}
	fmt.Printf("  every workload mounts its volume with mountPropagation HostToContainer, but the one of %s on %s: None\n",
		victim.vols[privateIndex].PVC, victim.Node())
	return f, nodes, nil
}

// workloadInterval is the time between two iterations of each workload. Every iteration is a
// few FUSE round trips and an fsync: the interval grows with the number of workloads, so that
// together they keep doing about 320 iterations a second, which two cores serve beside
// everything else; more would starve the heals they are there to measure.
func workloadInterval(workloads int) time.Duration {
	const perInterval = 16
	return 50 * time.Millisecond * time.Duration(max(1, (workloads+perInterval-1)/perInterval))
}

// restartResult is what the restart of the victim's node plugin showed.
type restartResult struct {
	killedAt, restartedAt time.Time
	// firstProbe and lastHeal are the driver's first ProbeVolume call and the end of its last
	// HealVolume call after the restart; zero when there was none.
	firstProbe, lastHeal time.Time
	// outages are, per HostToContainer workload of a healable volume, the time from the kill to
	// its first good iteration; resumed the same from the restart.
	outages, resumed []time.Duration
	// healed and healable count the restarted node's healable volumes.
	healed, healable int
	// broken lists the promises that did not hold.
	broken []string
}

// restartStory removes one volume's data, kills the victim's node plugin, shows the dead mounts
// and failing workloads, starts the plugin again and waits for the restart sweep to heal.
func restartStory(s *harness.Script, f *harness.Fixture, victim *realNode, view *realView, events *eventPrinter, o options) (restartResult, error) {
	ctx := s.Context()
	var res restartResult
	lost, private := victim.vols[lostIndex], victim.vols[privateIndex]
	var healable, following []*realVolume
	for i, v := range victim.vols {
		if i != lostIndex {
			healable = append(healable, v)
		}
		if i != lostIndex && i != privateIndex {
			following = append(following, v)
		}
	}

	step("On %s, the data of %s is removed from its backing store: that volume is lost", victim.Node(), lost.PV)
	lost.SetCondition(s, control.Lost, 0)

	step("The node plugin on %s is killed, as an OOM kill or a crash kills its container: the driver's process group, "+
		"with its %d FUSE mounters, is gone", victim.Node(), len(victim.vols))
	res.killedAt = time.Now()
	if err := victim.Kill(); err != nil {
		return res, err
	}
	// Kill waits for the driver; the kernel ends the rest of its group an instant later, and a
	// mount answers until its mounter is gone.
	if err := harness.WaitFor(ctx, 10*time.Second, "the mounters of the killed node plugin to end", func() (bool, string) {
		left := mounters(victim.dir)
		return len(left) == 0, fmt.Sprintf("mounter processes %v", left)
	}); err != nil {
		return res, err
	}
	if err := view.watch(ctx, 30*time.Second, "the killed node's mounts and workloads to fail", events, func(st []nodeState) (bool, string) {
		dead := view.nodeCount(st, victim, control.Gone)
		failing := 0
		for _, v := range victim.vols {
			if len(v.workload.FailuresSince(res.killedAt)) > 0 {
				failing++
			}
		}
		return dead == len(victim.vols) && failing == len(victim.vols), fmt.Sprintf("%d mounts dead, %d workloads failed", dead, failing)
	}); err != nil {
		return res, err
	}
	for _, msg := range failureSamples(victim.vols, res.killedAt) {
		fmt.Printf("  %s\n", msg)
	}

	step("The node plugin on %s starts again, as a new pod: its sidecar registers the restart, and the restart sweep probes "+
		"every volume of the node and heals the dead mounts", victim.Node())
	res.restartedAt = time.Now()
	if err := victim.Start(ctx); err != nil {
		return res, fmt.Errorf("restart the node plugin on %s: %w (driver log: %s)", victim.Node(), err, victim.DriverLog())
	}
	err := view.watch(ctx, o.timeout, "the restart sweep to heal the dead mounts", events, func(st []nodeState) (bool, string) {
		if ok, why := allHandled(ctx, f.Client); !ok {
			return false, why
		}
		var waiting []string
		for _, v := range healable {
			if c := view.condition(st, victim, v); c != control.Healthy {
				waiting = append(waiting, fmt.Sprintf("%s %s", v.PV, c))
			}
		}
		for _, v := range following {
			if o, ok := v.workload.Outage(res.killedAt); !ok || !o.Over() {
				waiting = append(waiting, "the workload of "+v.PVC+" failing")
			}
		}
		return len(waiting) == 0, strings.Join(waiting, ", ")
	})
	if err != nil {
		return res, fmt.Errorf("restart sweep: %w", err)
	}
	st := view.observe(ctx)
	for _, v := range healable {
		if view.condition(st, victim, v) == control.Healthy {
			res.healed++
		}
	}
	res.healable = len(healable)

	for _, v := range following {
		o, _ := v.workload.Outage(res.killedAt)
		res.outages = append(res.outages, o.Recovery.Time.Sub(res.killedAt))
		res.resumed = append(res.resumed, o.Recovery.Time.Sub(res.restartedAt))
	}
	calls, err := victim.ctl.Calls(ctx)
	if err != nil {
		return res, err
	}
	for _, c := range calls {
		switch {
		case c.RPC == "ProbeVolume" && (res.firstProbe.IsZero() || c.Start.Before(res.firstProbe)):
			res.firstProbe = c.Start
		case c.RPC == "HealVolume" && c.End.After(res.lastHeal):
			res.lastHeal = c.End
		}
	}
	fmt.Printf("  restart -> first probe %s, restart -> last heal %s; workloads back %s after the restart (p50)\n",
		since(res.restartedAt, res.firstProbe), since(res.restartedAt, res.lastHeal), percentile(res.resumed, 0.5).Round(time.Millisecond))

	// What cannot be healed is reported, not healed.
	if err := waitEvent(ctx, f, lost.Volume, healer.ReasonVolumeDataLoss); err != nil {
		res.broken = append(res.broken, fmt.Sprintf("the lost volume %s was not reported: %v", lost.PV, err))
	}
	if err := waitEvent(ctx, f, private.Volume, healer.ReasonVolumePodsMustRestart); err != nil {
		res.broken = append(res.broken, fmt.Sprintf("the workload of %s (propagation None) was not reported: %v", private.PVC, err))
	}
	events.print(ctx)
	return res, nil
}

// periodicResult is what the periodic sweep showed.
type periodicResult struct {
	faultAt, healedAt time.Time
	healed, healable  int
}

// periodicStory breaks two volumes of a node that did not restart, turns on a periodic schedule
// and waits until a periodic sweep has healed them and their workloads write again.
func periodicStory(s *harness.Script, f *harness.Fixture, n *realNode, view *realView, events *eventPrinter, o options) (periodicResult, error) {
	ctx := s.Context()
	var res periodicResult
	readOnly, frozen := n.vols[readOnlyIndex], n.vols[frozenIndex]
	step("On %s, the mount of %s turns read-only and the mounter of %s freezes. No restart announces these: "+
		"StorageClass %s gets the periodic schedule %q", n.Node(), readOnly.PV, frozen.PV, realClass, o.schedule)
	res.faultAt = time.Now()
	if err := remountReadOnly(ctx, readOnly); err != nil {
		return res, err
	}
	frozen.SetCondition(s, control.Hung, 0)
	f.AnnotateClass(realClass, annotations.Schedule, o.schedule)

	broken := []*realVolume{readOnly, frozen}
	res.healable = len(broken)
	healthyAt := map[*realVolume]time.Time{}
	err := view.watch(ctx, o.timeout, "the periodic sweep to heal "+readOnly.PV+" and "+frozen.PV, events, func(st []nodeState) (bool, string) {
		var waiting []string
		for _, v := range broken {
			if c := view.condition(st, n, v); c != control.Healthy {
				waiting = append(waiting, fmt.Sprintf("%s %s", v.PV, c))
				continue
			}
			if healthyAt[v].IsZero() {
				healthyAt[v] = time.Now()
			}
			// An iteration that began once the mount was seen healthy ran on the healed mount.
			if !wroteSince(v.workload, healthyAt[v]) {
				waiting = append(waiting, "the workload of "+v.PVC+" not writing yet")
			}
		}
		return len(waiting) == 0, strings.Join(waiting, ", ")
	})
	if err != nil {
		return res, fmt.Errorf("periodic sweep: %w", err)
	}
	res.healed = len(broken)
	calls, err := n.ctl.Calls(ctx)
	if err != nil {
		return res, err
	}
	for _, c := range calls {
		if c.RPC == "HealVolume" && c.Start.After(res.faultAt) && c.End.After(res.healedAt) {
			res.healedAt = c.End
		}
	}
	fmt.Printf("  faults -> last heal by the periodic sweep: %s\n", since(res.faultAt, res.healedAt))
	return res, nil
}

// realSummary prints what the demo showed and returns the promises that did not hold.
func realSummary(ctx context.Context, nodes []*realNode, victim *realNode, r restartResult, p periodicResult) []string {
	step("Summary")
	broken := slices.Clone(r.broken)
	var probes, heals int64
	total := 0
	for _, n := range nodes {
		total += len(n.vols)
		if c, err := n.ctl.Counters(ctx); err == nil {
			probes += c.Calls["ProbeVolume"]
			heals += c.Calls["HealVolume"]
		}
	}
	fmt.Printf("  volumes: %d on %d nodes, each staged, published and used by a workload\n", total, len(nodes))
	fmt.Printf("  healed: %d of %d healable broken volumes (%d after the node plugin restart on %s, %d by the periodic sweep)\n",
		r.healed+p.healed, r.healable+p.healable, r.healed, victim.Node(), p.healed)
	if r.healed < r.healable || p.healed < p.healable {
		broken = append(broken, "a healable volume was not healed")
	}
	fmt.Printf("  the %d HostToContainer workloads of %s's healable volumes, p50 / p99 / max:\n", len(r.outages), victim.Node())
	fmt.Printf("    outage, plugin killed -> first good write:  %s\n", spread(r.outages))
	fmt.Printf("    plugin restart -> workload I/O resumed:      %s\n", spread(r.resumed))
	fmt.Printf("  plugin restart -> first probe: %s, -> last heal: %s (the driver's call log)\n",
		since(r.restartedAt, r.firstProbe), since(r.restartedAt, r.lastHeal))
	if len(r.outages) == 0 {
		broken = append(broken, "no HostToContainer workload resumed")
	}

	lost, private := victim.vols[lostIndex], victim.vols[privateIndex]
	if res := private.workload.Results(); len(res) > 0 && !res[len(res)-1].OK {
		last := res[len(res)-1]
		fmt.Printf("  %s (mountPropagation None): its workload still fails (%s: %s); Event %s on the PVC: its pod must be restarted to get the volume back\n",
			private.PVC, last.Op, last.Err, healer.ReasonVolumePodsMustRestart)
	} else {
		broken = append(broken, fmt.Sprintf("the workload of %s (propagation None) writes again: it cannot see a repaired mount", private.PVC))
	}
	calls, err := victim.ctl.Calls(ctx)
	if err != nil {
		broken = append(broken, fmt.Sprintf("read the call log of %s: %v", victim.Node(), err))
	}
	healedLost := slices.ContainsFunc(calls, func(c control.Call) bool { return c.RPC == "HealVolume" && c.VolumeID == lost.Handle })
	if cond, err := lost.Control.Volume(ctx, lost.Handle); err != nil || cond.Condition != control.Lost || healedLost {
		broken = append(broken, fmt.Sprintf("the lost volume %s was healed or touched (condition %s, healed %t, %v)", lost.PV, cond.Condition, healedLost, err))
	} else {
		fmt.Printf("  %s: data lost, left alone (no heal call); Event %s on the PVC for a human\n", lost.PVC, healer.ReasonVolumeDataLoss)
	}
	fmt.Printf("  probe calls: %d, heal calls: %d (by the drivers' current processes)\n", probes, heals)
	noRecycleHere("kubelet stand-ins")
	for _, b := range broken {
		fmt.Printf("  BROKEN PROMISE: %s\n", b)
	}
	return broken
}

// remountReadOnly turns the volume's mount read-only. The kernel refuses (EBUSY) while a file on
// it is open for writing, which the workload's is for a moment in each iteration: the demo tries
// again between two iterations, as an I/O error that forces the remount would not need to.
func remountReadOnly(ctx context.Context, v *realVolume) error {
	var last error
	for range 100 {
		if _, last = v.Control.SetCondition(ctx, v.Handle, control.ReadOnly, 0); last == nil {
			v.BrokenAt, v.Broken = time.Now(), control.ReadOnly
			return nil
		}
		if !strings.Contains(last.Error(), "device or resource busy") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("turn %s read-only: %w", v.PV, last)
}

// mounters lists the mounter processes (`refdriver mounter`) of volumes under dir.
func mounters(dir string) []int {
	return harness.ProcessesWhere(func(pid int) bool {
		args := harness.CommandLine(pid)
		return len(args) > 1 && args[1] == "mounter" && slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, dir+"/") })
	})
}

// waitEvent waits until the volume's PVC has an Event with reason.
func waitEvent(ctx context.Context, f *harness.Fixture, v *harness.Volume, reason string) error {
	return harness.WaitFor(ctx, harness.EventWait, fmt.Sprintf("a %s Event on PVC %s", reason, v.PVC), func() (bool, string) {
		_, n := f.PVCEvents(v, reason)
		return n > 0, "none yet"
	})
}

// failureSamples says, once per distinct error, how the workloads fail since t.
func failureSamples(vols []*realVolume, t time.Time) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range vols {
		fails := v.workload.FailuresSince(t)
		if len(fails) == 0 {
			continue
		}
		last := fails[len(fails)-1]
		key := last.Op + ": " + last.Err
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, fmt.Sprintf("the workload of %s: %s", v.PVC, key))
	}
	return out
}

// wroteSince tells whether the workload has had a good iteration that began after t.
func wroteSince(w *kubelet.Workload, t time.Time) bool {
	return slices.ContainsFunc(w.Results(), func(r kubelet.Result) bool { return r.OK && r.Time.After(t) })
}

// since is the time from a to b, or "none" when b did not happen.
func since(a, b time.Time) string {
	if b.IsZero() {
		return "none"
	}
	return b.Sub(a).Round(time.Millisecond).String()
}

// spread sums durations up as p50, p99 and max.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	return fmt.Sprintf("%s / %s / %s", percentile(ds, 0.5).Round(time.Millisecond),
		percentile(ds, 0.99).Round(time.Millisecond), slices.Max(ds).Round(time.Millisecond))
}

// percentile is the nearest-rank percentile p (0 < p <= 1) of ds, or 0 for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(ds))
	rank := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}
