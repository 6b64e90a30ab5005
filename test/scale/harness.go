package scale

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/scheduler/planner"
	"github.com/volume-healer/volume-healer/test/fixtures"
	"github.com/volume-healer/volume-healer/test/harness"
)

// Layout sizes a run. ShortLayout and FullLayout are the two the test uses.
type Layout struct {
	// BigNodeVolumes are the volumes on the node that figures 1 and 2 restart.
	BigNodeVolumes int `json:"bigNodeVolumes"`
	// VolumesPerNode are the volumes on every other node.
	VolumesPerNode int `json:"volumesPerNode"`
	// GrowNodes are the nodes added after the first phase (the cluster of figure 1's second
	// size) and StormNodes those added after it, before the storm.
	GrowNodes  int `json:"growNodes"`
	StormNodes int `json:"stormNodes"`
	// Restarts is how often figure 2 restarts the big node; figure 1 at the first size averages
	// the same restarts. GrownRestarts is how often figure 1 restarts it at the second size.
	Restarts      int `json:"restarts"`
	GrownRestarts int `json:"grownRestarts"`
	// RestartBroken is how many of the restarted node's volumes lose their mount before each
	// restart of figure 1 at its second and its large size, for the sweep to heal (the restarts
	// at the first size, figure 2's, break none).
	RestartBroken int `json:"restartBroken"`
	// LargeNodeVolumes are the volumes of figure 1's large size: a node of its own, written into
	// etcd with the volumes of figure 4's point at LargeNodeClusterVolumes (one of
	// MemoryVolumes, these volumes counted in it) and restarted LargeNodeRestarts times once
	// that point's memory is read. 0: figure 1 has no large size.
	LargeNodeVolumes        int `json:"largeNodeVolumes"`
	LargeNodeClusterVolumes int `json:"largeNodeClusterVolumes"`
	LargeNodeRestarts       int `json:"largeNodeRestarts"`
	// Debounce is the controller's restart debounce for figures 1 and 2.
	Debounce time.Duration `json:"debounce"`
	// StormDebounce is the debounce during the storm: the default, as shipped.
	StormDebounce time.Duration `json:"stormDebounce"`
	// Global, PerDriver and PerNode are the controller's budgets.
	Global    int `json:"budgetGlobal"`
	PerDriver int `json:"budgetPerDriver"`
	PerNode   int `json:"budgetPerNode"`
	// CallDelay is what each driver call takes during the storm.
	CallDelay time.Duration `json:"callDelay"`
	// MemoryVolumes are the cluster's sizes, in volumes, of figure 4's points after the storm,
	// in ascending order: volumes on nodes without a plugin are written into etcd (etcdfill.go)
	// up to each size, and a fresh controller's memory is read at each. The informer caches are
	// rebuilt in the harness's process at the first.
	MemoryVolumes []int `json:"memoryVolumes"`
	// SweepCPUVolumes are the volumes of figure 5's in-process sweep.
	SweepCPUVolumes int `json:"sweepCpuVolumes"`
	// DecodedCacheVolumes are the volumes of figure 4's in-process cache measurement at the
	// goal's size: objects encoded and decoded as the API server sends them, through the
	// controller's transform into stores with its indexes, without an API server to fill.
	DecodedCacheVolumes int `json:"decodedCacheVolumes"`
	// Workers create objects concurrently.
	Workers int `json:"workers"`
	// Settle is how long the controller idles before its memory is read.
	Settle time.Duration `json:"settle"`
	// Profile takes CPU profiles of the harness (storm, sweep) and runs the policy and
	// scheduler packages' benchmarks.
	Profile bool `json:"profile"`
	// ControllerProfile is how long the controller's CPU is profiled from the start of the storm.
	ControllerProfile time.Duration `json:"controllerProfile"`
}

// ShortLayout is the run of the normal test command: 200 volumes over 5 nodes, every figure
// computed, in about a minute.
func ShortLayout() Layout {
	return Layout{
		BigNodeVolumes: 40, VolumesPerNode: 40, GrowNodes: 2, StormNodes: 2,
		Restarts: 5, GrownRestarts: 2,
		RestartBroken: 10, LargeNodeVolumes: 100, LargeNodeClusterVolumes: 400, LargeNodeRestarts: 2,
		Debounce: 0, StormDebounce: 2 * time.Second,
		Global: 8, PerDriver: 8, PerNode: 4,
		CallDelay:           20 * time.Millisecond,
		MemoryVolumes:       []int{240, 400},
		SweepCPUVolumes:     2000,
		DecodedCacheVolumes: 2000,
		Workers:             16,
		Settle:              time.Second,
		ControllerProfile:   2 * time.Second,
	}
}

// FullLayout is the run that make bench asks for: 21,000 volumes over 201 nodes.
func FullLayout() Layout {
	return Layout{
		BigNodeVolumes: 1000, VolumesPerNode: 100, GrowNodes: 90, StormNodes: 110,
		Restarts: 40, GrownRestarts: 5,
		RestartBroken: 10, LargeNodeVolumes: 10000, LargeNodeClusterVolumes: 100000, LargeNodeRestarts: 3,
		Debounce: 0, StormDebounce: 2 * time.Second,
		Global: 64, PerDriver: 64, PerNode: 4,
		CallDelay:           50 * time.Millisecond,
		MemoryVolumes:       []int{40000, 100000, 300000},
		SweepCPUVolumes:     100000,
		DecodedCacheVolumes: 100000,
		Workers:             48,
		Settle:              5 * time.Second,
		Profile:             true,
		ControllerProfile:   30 * time.Second,
	}
}

// runner runs the measurements against one control plane.
type runner struct {
	layout  Layout
	dir     string
	bin     string
	procs   *harness.Processes
	logf    func(format string, args ...any)
	c       *cluster
	calls   *callStats
	log     klog.Logger
	big     *nodePlugin
	plugins []*nodePlugin
	ctrl    *controllerProcess
	res     *Results
	// logFile is the simulated sidecars' log (log); start is when the run began.
	logFile *os.File
	start   time.Time
	// brokenPerRestart is how many of the restarted node's volumes lose their mount just before
	// each restart of figure 1 (spread over its volumes), so that its sweeps heal them; 0: none.
	brokenPerRestart int
	// clusterVolumes and clusterNodes count every volume and node in the cluster, those of nodes
	// without a plugin included; idleNodes count the nodes without a plugin.
	clusterVolumes, clusterNodes, idleNodes int
}

// volumes counts the volumes of the simulated node plugins.
func (h *runner) volumes() int {
	n := 0
	for _, p := range h.plugins {
		n += len(p.vols)
	}
	return n
}

func (h *runner) settings(debounce time.Duration) controllerSettings {
	return controllerSettings{debounce: debounce, global: h.layout.Global, perDriver: h.layout.PerDriver, perNode: h.layout.PerNode}
}

// Run measures every figure with layout l, keeping its files in dir, and returns the results.
// logf reports progress.
func Run(ctx context.Context, l Layout, dir string, logf func(format string, args ...any)) (*Results, error) {
	mode := "short"
	if l.Profile {
		mode = "full"
	}
	h, err := newRunner(l, dir, mode, logf)
	if err != nil {
		return nil, err
	}
	defer h.close()
	res := h.res
	if err := h.onCluster(ctx, h.measureCluster); err != nil {
		return res, err
	}
	// Figures 5 and 6 run with the control plane gone, so that it does not take their CPU.
	if err := h.measureSweepCPU(ctx); err != nil {
		return res, err
	}
	if err := h.measureDecisions(ctx); err != nil {
		return res, err
	}
	if l.Profile && res.Storm != nil {
		lines, err := goBenchmarks("./scheduler", "^BenchmarkDispatchStorm$")
		if err != nil {
			res.Notes = append(res.Notes, "dispatcher benchmark not run: "+err.Error())
		}
		res.Storm.DispatcherBenchmark = lines
	}
	return res, nil
}

// RunStorm measures figure 3 alone with layout l, for work on the storm without the other
// figures' minutes: the big node and every other node of the layout created at once, every
// restart marker swept, then, as in Run, a fresh controller with the storm's debounce (its memory
// read) and the storm.
func RunStorm(ctx context.Context, l Layout, dir string, logf func(format string, args ...any)) (*Results, error) {
	h, err := newRunner(l, dir, "storm", logf)
	if err != nil {
		return nil, err
	}
	defer h.close()
	err = h.onCluster(ctx, func(ctx context.Context) error {
		if err := h.addNodes(ctx, "first", []string{"node-big"}, l.BigNodeVolumes); err != nil {
			return err
		}
		h.big = h.plugins[0]
		if err := h.addNodes(ctx, "storm", nodeNames(1, l.GrowNodes+l.StormNodes), l.VolumesPerNode); err != nil {
			return err
		}
		if err := h.restartController(ctx, "controller-1", l.Debounce); err != nil {
			return err
		}
		if err := h.waitHandled(ctx, 10*time.Minute); err != nil {
			return err
		}
		if err := h.measureMemory(ctx, "controller-2", l.StormDebounce); err != nil {
			return err
		}
		return h.measureStorm(ctx)
	})
	return h.res, err
}

// newRunner starts a run of mode with layout l in dir: its results, with the machine and its
// load, and the simulated sidecars' log file (sidecars.log), which close closes once it records
// the run's wall time.
func newRunner(l Layout, dir, mode string, logf func(format string, args ...any)) (*runner, error) {
	start := time.Now()
	res := &Results{Schema: resultsSchema, Mode: mode, Started: start.UTC(), Layout: l, Machine: readMachine(runtime.Version(), runtime.NumCPU()),
		LoadAverage: loadAverage()}
	logFile, err := os.Create(filepath.Join(dir, "sidecars.log"))
	if err != nil {
		return nil, err
	}
	return &runner{layout: l, dir: dir, procs: harness.NewProcesses(), logf: logf, calls: &callStats{}, res: res,
		log: textLogger(logFile), logFile: logFile, start: start}, nil
}

// close records the run's wall time and closes its log file.
func (h *runner) close() {
	h.res.WallSeconds = time.Since(h.start).Seconds()
	_ = h.logFile.Close()
}

// onCluster starts the control plane in h.dir and builds the controller into h.bin, runs measure,
// then stops every process the runner started and the control plane. The start and the build
// take about as long: they overlap. The controller is built without the race detector (its speed
// is what is measured), and serves net/http/pprof for its CPU profile.
func (h *runner) onCluster(ctx context.Context, measure func(context.Context) error) error {
	built := make(chan error, 1)
	go func() {
		bin, err := harness.Build(harness.BuildOptions{Controller: harness.Profiling})
		h.bin = bin.Controller
		built <- err
	}()
	c, err := startCluster(ctx, h.dir)
	if berr := <-built; berr != nil {
		if c != nil {
			_ = c.stop()
		}
		return berr
	}
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	h.c = c
	err = measure(ctx)
	h.stopAll()
	if serr := c.stop(); serr != nil && err == nil {
		err = serr
	}
	return err
}

func (h *runner) stopAll() {
	if h.ctrl != nil {
		h.ctrl.stop()
		h.ctrl = nil
	}
	_ = forEachPlugin(h.plugins, 32, func(p *nodePlugin) error { p.stop(); return nil })
}

func (h *runner) measureCluster(ctx context.Context) error {
	l := h.layout
	// Phase 1: the big node alone.
	if err := h.addNodes(ctx, "first", []string{"node-big"}, l.BigNodeVolumes); err != nil {
		return err
	}
	h.big = h.plugins[0]
	if err := h.restartController(ctx, "controller-1", l.Debounce); err != nil {
		return err
	}
	if err := h.waitHandled(ctx, 5*time.Minute); err != nil {
		return err
	}
	h.res.ControllerStart = &controllerStart{NodeVolumes: len(h.big.vols), Probed: h.big.calls.snapshot().probed}
	h.logf("controller start: the pending restart of %s was recorded handled after %d of its %d volumes were probed",
		h.big.name, h.res.ControllerStart.Probed, len(h.big.vols))
	if err := h.measureRestarts(ctx, l.Restarts, true); err != nil {
		return err
	}
	if err := h.measureMemory(ctx, "controller-2", l.Debounce); err != nil {
		return err
	}

	// Phase 2: grown to the second size of figure 1.
	if err := h.addNodes(ctx, "grow", nodeNames(1, l.GrowNodes), l.VolumesPerNode); err != nil {
		return err
	}
	if err := h.waitHandled(ctx, 10*time.Minute); err != nil {
		return err
	}
	if err := h.measureMemory(ctx, "controller-3", l.Debounce); err != nil {
		return err
	}
	h.brokenPerRestart = l.RestartBroken
	if err := h.measureRestarts(ctx, l.GrownRestarts, false); err != nil {
		return err
	}
	h.brokenPerRestart = 0

	// Phase 3: every node, then the storm.
	if err := h.addNodes(ctx, "storm", nodeNames(1+l.GrowNodes, l.StormNodes), l.VolumesPerNode); err != nil {
		return err
	}
	if err := h.waitHandled(ctx, 10*time.Minute); err != nil {
		return err
	}
	if err := h.measureMemory(ctx, "controller-4", l.StormDebounce); err != nil {
		return err
	}
	if err := h.measureStorm(ctx); err != nil {
		return err
	}

	// Phase 4: the node plugins stop; volumes on nodes without one are added for more memory
	// points, and at the first the controller's caches are rebuilt in this process to see what
	// they hold. At figure 1's large size, a node with its volumes is written with them, and
	// restarted once the point's memory is read.
	_ = forEachPlugin(h.plugins, 32, func(p *nodePlugin) error { p.stop(); return nil })
	for i, size := range l.MemoryVolumes {
		var large *nodePlugin
		if l.LargeNodeVolumes > 0 && size == l.LargeNodeClusterVolumes {
			var err error
			if large, err = h.writeLargeNode(ctx, "node-large", l.LargeNodeVolumes); err != nil {
				return err
			}
		}
		if extra := size - h.clusterVolumes; extra > 0 {
			if err := h.addVolumesOnly(ctx, extra); err != nil {
				return err
			}
			if err := h.measureMemory(ctx, fmt.Sprintf("controller-%d", 5+i), l.StormDebounce); err != nil {
				return err
			}
		}
		if large != nil {
			if err := h.measureLargeNode(ctx, large); err != nil {
				return err
			}
		}
		if i == 0 {
			h.ctrl.stop()
			h.ctrl = nil
			if err := h.measureCaches(ctx); err != nil {
				return err
			}
		}
	}
	h.fitMemory()
	if h.ctrl != nil {
		h.ctrl.stop()
		h.ctrl = nil
	}
	return nil
}

// measureCaches rebuilds the controller's caches in this process, from the apiserver and from
// decoded objects, with the shipped transform and the one before.
func (h *runner) measureCaches(ctx context.Context) error {
	l := h.layout
	for _, t := range []struct {
		name      string
		transform func(any) (any, error)
	}{
		{"controller, compact records (planner.CacheTransform, as shipped)", planner.CacheTransform},
		{"controller, API objects with managed fields stripped (the transform before)", stripManagedFields},
	} {
		profile := ""
		if l.Profile {
			profile = filepath.Join(h.dir, fmt.Sprintf("cache-heap-%d.pprof", len(h.res.Memory.Caches)))
		}
		ch, err := h.c.measureCacheHeap(ctx, t.name, t.transform, h.clusterVolumes, profile)
		if err != nil {
			return err
		}
		h.res.Memory.Caches = append(h.res.Memory.Caches, ch)
		h.logf("figure 4: informer caches of %d volumes in this process, %s: %.1f MiB live, %.0f bytes per volume",
			ch.Volumes, ch.Name, float64(ch.LiveBytes)/(1<<20), ch.BytesPerVolume)
	}
	for _, t := range []struct {
		name      string
		transform func(any) (any, error)
	}{
		{"controller, compact records (as shipped), decoded in-process", planner.CacheTransform},
		{"controller, API objects with managed fields stripped (the transform before), decoded in-process", stripManagedFields},
	} {
		ch, err := h.c.measureDecodedCacheHeap(t.name, t.transform, l.DecodedCacheVolumes)
		if err != nil {
			return err
		}
		h.res.Memory.Caches = append(h.res.Memory.Caches, ch)
		h.logf("figure 4: caches of %d decoded volumes in this process, %s: %.1f MiB live, %.0f bytes per volume",
			ch.Volumes, ch.Name, float64(ch.LiveBytes)/(1<<20), ch.BytesPerVolume)
	}
	return nil
}

// addVolumesOnly writes n volumes on nodes that run no node plugin, 100 to a node, straight
// into the apiserver's etcd, and waits until the apiserver lists them.
func (h *runner) addVolumesOnly(ctx context.Context, n int) error {
	var names []string
	var vols []volume
	for len(vols) < n {
		name := fmt.Sprintf("node-idle-%03d", h.idleNodes)
		h.idleNodes++
		names = append(names, name)
		vols = append(vols, h.c.newVolumes(name, min(100, n-len(vols)))...)
	}
	h.logf("memory: writing %d nodes without a node plugin, with %d volumes, into etcd (%d in the cluster after)", len(names), len(vols), h.clusterVolumes+len(vols))
	return h.writeIntoEtcd(ctx, "memory", names, vols)
}

// writeLargeNode writes a node named name with n volumes straight into the apiserver's etcd (as
// addVolumesOnly), lists them attached in its Node's status (as the attach/detach controller
// does), and returns its node plugin, not started: figure 1's large size.
func (h *runner) writeLargeNode(ctx context.Context, name string, n int) (*nodePlugin, error) {
	vols := h.c.newVolumes(name, n)
	h.logf("figure 1: writing %s with %d volumes into etcd (%d in the cluster after)", name, n, h.clusterVolumes+n)
	if err := h.writeIntoEtcd(ctx, "large node", []string{name}, vols); err != nil {
		return nil, err
	}
	handles := make([]string, len(vols))
	for i, v := range vols {
		handles[i] = v.handle
	}
	if err := fixtures.ReportAttached(ctx, h.c.kube, name, driverName, handles...); err != nil {
		return nil, fmt.Errorf("report %s's volumes attached: %w", name, err)
	}
	return newNodePlugin(h.c, name, vols, h.calls, h.log)
}

// measureLargeNode starts p's node plugin, waits for its first sweep (starting a controller if
// none runs), and measures figure 1 with p as the restarted node, h.layout.RestartBroken of its
// volumes broken before each of h.layout.LargeNodeRestarts restarts; then p stops.
func (h *runner) measureLargeNode(ctx context.Context, p *nodePlugin) error {
	l := h.layout
	start := time.Now()
	if err := p.start(ctx); err != nil {
		return err
	}
	h.plugins = append(h.plugins, p)
	defer p.stop()
	h.logf("figure 1: %s's node plugin (%d volumes) started in %s", p.name, len(p.vols), time.Since(start).Round(time.Millisecond))
	if h.ctrl == nil {
		if err := h.restartController(ctx, "controller-large", l.Debounce); err != nil {
			return err
		}
	}
	if err := h.waitHandled(ctx, 10*time.Minute); err != nil {
		return err
	}
	big, broken := h.big, h.brokenPerRestart
	h.big, h.brokenPerRestart = p, l.RestartBroken
	defer func() { h.big, h.brokenPerRestart = big, broken }()
	return h.measureRestarts(ctx, l.LargeNodeRestarts, false)
}

// writeIntoEtcd writes the Nodes names and vols straight into the apiserver's etcd, waits until
// the apiserver lists them, counts them in the cluster and records the setup step as phase.
func (h *runner) writeIntoEtcd(ctx context.Context, phase string, names []string, vols []volume) error {
	before, err := h.c.count(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	f, err := h.c.newEtcdFiller(ctx)
	if err != nil {
		return err
	}
	defer f.close()
	if err := f.fill(ctx, h.c.shapes, names, vols, 8, func(done int) {
		if done%50000 == 0 {
			h.logf("  %d of %d volumes written, %s", done, len(vols), time.Since(start).Round(time.Second))
		}
	}); err != nil {
		return err
	}
	written := time.Since(start)
	want := served{nodes: before.nodes + len(names), pvs: before.pvs + len(vols), pvcs: before.pvcs + len(vols), vas: before.vas + len(vols)}
	if err := h.c.waitServed(ctx, want, 15*time.Minute); err != nil {
		return err
	}
	h.clusterVolumes += len(vols)
	h.clusterNodes += len(names)
	step := setupStep{Phase: phase, Nodes: len(names), Volumes: len(vols), Method: "etcd", Seconds: written.Seconds(),
		VolumesPerSec: float64(len(vols)) / written.Seconds(), ServedSeconds: (time.Since(start) - written).Seconds()}
	h.res.Setup = append(h.res.Setup, step)
	h.logf("%s: %d volumes written into etcd in %s (%.0f/s); the apiserver listed all %d PVs %s later",
		phase, len(vols), written.Round(time.Millisecond), step.VolumesPerSec, want.pvs, time.Duration(step.ServedSeconds*float64(time.Second)).Round(time.Millisecond))
	return nil
}

func nodeNames(first, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%03d", first+i)
	}
	return out
}

// addNodes creates Node objects and perNode volumes on each, then starts their node plugins.
func (h *runner) addNodes(ctx context.Context, phase string, names []string, perNode int) error {
	if len(names) == 0 {
		return nil
	}
	start := time.Now()
	if err := h.c.createNodes(ctx, names); err != nil {
		return err
	}
	var vols []volume
	var added []*nodePlugin
	for _, name := range names {
		v := h.c.newVolumes(name, perNode)
		p, err := newNodePlugin(h.c, name, v, h.calls, h.log)
		if err != nil {
			return err
		}
		vols = append(vols, v...)
		added = append(added, p)
	}
	total := h.clusterVolumes + len(vols)
	h.logf("%s: creating %d nodes with %d volumes (%d PVs, PVCs and VolumeAttachments each; %d in the cluster after)", phase, len(names), len(vols), len(vols), total)
	if err := h.c.createVolumes(ctx, vols, h.layout.Workers, func(n int) {
		if n%5000 == 0 {
			h.logf("  %d of %d volumes created, %s", n, len(vols), time.Since(start).Round(time.Second))
		}
	}); err != nil {
		return err
	}
	created := time.Since(start)
	pluginsStart := time.Now()
	h.plugins = append(h.plugins, added...)
	h.clusterVolumes += len(vols)
	h.clusterNodes += len(names)
	if err := forEachPlugin(added, 16, func(p *nodePlugin) error { return p.start(ctx) }); err != nil {
		return err
	}
	step := setupStep{Phase: phase, Nodes: len(names), Volumes: len(vols), Seconds: created.Seconds(),
		VolumesPerSec: float64(len(vols)) / created.Seconds(), PluginsSeconds: time.Since(pluginsStart).Seconds(), Method: "api"}
	h.res.Setup = append(h.res.Setup, step)
	h.logf("%s: %d volumes in %s (%.0f/s), %d node plugins started in %s", phase, len(vols), created.Round(time.Millisecond),
		step.VolumesPerSec, len(added), time.Since(pluginsStart).Round(time.Millisecond))
	return nil
}

func forEachPlugin(ps []*nodePlugin, workers int, f func(*nodePlugin) error) error {
	return forEach(context.Background(), len(ps), workers, func(_ context.Context, i int) error { return f(ps[i]) })
}

// restartController stops the running controller, if any, and starts a fresh one.
func (h *runner) restartController(ctx context.Context, name string, debounce time.Duration) error {
	if h.ctrl != nil {
		h.ctrl.stop()
		h.ctrl = nil
	}
	p, err := startController(ctx, h.c, h.procs, h.bin, name, h.settings(debounce))
	if err != nil {
		return err
	}
	h.ctrl = p
	return nil
}

// waitHandled waits until every CSIAddonsNode's restart marker has been swept.
func (h *runner) waitHandled(ctx context.Context, timeout time.Duration) error {
	err := harness.WaitFor(ctx, timeout, "every restart marker to be swept", func() (bool, string) {
		pending, seen, err := harness.RestartsPending(ctx, h.c.crc, "")
		if err != nil {
			return false, err.Error()
		}
		return len(pending) == 0 && seen == len(h.plugins), fmt.Sprintf("%d of %d restart markers not swept", len(pending), seen)
	})
	if err != nil {
		return fmt.Errorf("%w (controller log %s)", err, h.ctrl.LogPath)
	}
	return nil
}

// handledPatches is how many handled markers the controller has written.
func (h *runner) handledPatches() int64 {
	return h.ctrl.stats.snapshot().Counts[requestKey{Verb: "PATCH", Resource: "csiaddonsnodes"}]
}

// measureRestarts restarts the big node's plugin n times, one after the other, each time waiting
// for its sweep to end, and records figure 1 (requests per sweep, ours and the peer's) and, when
// latency is set, figure 2.
func (h *runner) measureRestarts(ctx context.Context, n int, withLatency bool) error {
	rc := h.c.kube.CoreV1().RESTClient()
	var (
		ctrlSum, sidecarSum, apiSum requestSnapshot
		ctrlMin, ctrlMax, lgMax     int64 = -1, 0, 0
		heals                       int64
		lat, allProbed              []float64
		sweepTotal                  time.Duration
	)
	for i := range n {
		a0, err := apiserverCounts(ctx, rc)
		if err != nil {
			return err
		}
		p0, s0 := h.ctrl.stats.snapshot(), h.big.stats.snapshot()
		handled := h.handledPatches()
		h.big.calls.reset()
		h.calls.reset()
		if err := h.breakVolumes(h.big, h.brokenPerRestart); err != nil {
			return err
		}
		if err := h.big.restart(ctx); err != nil {
			return err
		}
		marker := h.big.markerAccepted()
		var sweepEnd time.Time
		deadline := time.Now().Add(3 * time.Minute)
		for {
			if sweepEnd.IsZero() && h.handledPatches() > handled {
				sweepEnd = time.Now()
			}
			if !sweepEnd.IsZero() && h.big.calls.snapshot().probed == len(h.big.vols) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("restart %d of %s: sweep not finished within 3m: %d of %d volumes probed (controller log %s)",
					i+1, h.big.name, h.big.calls.snapshot().probed, len(h.big.vols), h.ctrl.LogPath)
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Events are posted asynchronously, just before the handled marker: let them land.
		time.Sleep(300 * time.Millisecond)
		snap := h.big.calls.snapshot()
		heals += h.calls.heals.Load()
		a1, err := apiserverCounts(ctx, rc)
		if err != nil {
			return err
		}
		ctrl := h.ctrl.stats.snapshot().since(p0)
		ctrlSum = ctrlSum.plus(ctrl)
		sidecarSum = sidecarSum.plus(h.big.stats.snapshot().since(s0))
		apiSum = apiSum.plus(a1.since(a0))
		total, lg := ctrl.total(), ctrl.total("LIST", "GET")
		if ctrlMin < 0 || total < ctrlMin {
			ctrlMin = total
		}
		ctrlMax, lgMax = max(ctrlMax, total), max(lgMax, lg)
		sweepTotal += sweepEnd.Sub(marker)
		lat = append(lat, ms(snap.firstProbe.Sub(marker)))
		allProbed = append(allProbed, ms(time.Unix(0, h.calls.lastEnd.Load()).Sub(marker)))
		h.logf("restart %d/%d of %s (%d volumes): first probe %.1fms after the marker, all probed %.0fms, sweep %s; controller: %s",
			i+1, n, h.big.name, len(h.big.vols), lat[len(lat)-1], allProbed[len(allProbed)-1], sweepEnd.Sub(marker).Round(time.Millisecond), ctrl.describe())
	}
	fig := apiRequests{
		ClusterVolumes: h.clusterVolumes, NodeVolumes: len(h.big.vols), Sweeps: n, BrokenPerRestart: h.brokenPerRestart,
		Controller: figureOf(ctrlSum, n), ControllerListGetMax: lgMax, ControllerRequestsMin: ctrlMin, ControllerRequestsMax: ctrlMax,
		Sidecar: figureOf(sidecarSum, n), APIServer: figureOf(apiSum, n), SweepSeconds: sweepTotal.Seconds() / float64(n),
		Heals: float64(heals) / float64(n), APIServerWithWatches: float64(apiSum.total("GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")) / float64(n),
	}

	// The peer: one LIST of every VolumeAttachment, then a GET of each PV, VolumeAttachment and
	// Secret of the node's volumes.
	peerStats := newRequestStats()
	a0, err := apiserverCounts(ctx, rc)
	if err != nil {
		return err
	}
	found, took, err := h.c.listEverything(ctx, peerStats, h.big.name)
	if err != nil {
		return fmt.Errorf("list-everything approach: %w", err)
	}
	a1, err := apiserverCounts(ctx, rc)
	if err != nil {
		return err
	}
	ps := peerStats.snapshot()
	fig.Peer = peer{Volumes: found, Client: figureOf(ps, 1), APIServer: figureOf(a1.since(a0), 1), Seconds: took.Seconds(),
		SecondsAtDefaultRateLimit: defaultRateLimitSeconds(ps.total())}
	h.logf("figure 1 at %d volumes: controller %.1f requests per sweep (%.1f LIST/GET), peer %d requests (%s) in %s",
		fig.ClusterVolumes, fig.Controller.Requests, fig.Controller.ListGet, ps.total(), ps.describe(), took.Round(time.Millisecond))
	h.res.APIRequests = append(h.res.APIRequests, fig)

	if withLatency {
		h.res.Latency = &latency{
			NodeVolumes: len(h.big.vols), ClusterVolumes: h.clusterVolumes, Restarts: n, DebounceSeconds: h.layout.Debounce.Seconds(),
			P50Ms: percentile(lat, 50), P99Ms: percentile(lat, 99), MinMs: percentile(lat, 0), MaxMs: percentile(lat, 100),
			SamplesMs: lat, AllProbedP50Ms: percentile(allProbed, 50), AllProbedP99Ms: percentile(allProbed, 99),
		}
	}
	return nil
}

// breakVolumes makes n of p's volumes, spread over them, lose their mount (as a dead userspace
// mounter leaves it), for the next restart's sweep to heal.
func (h *runner) breakVolumes(p *nodePlugin, n int) error {
	if n <= 0 || len(p.vols) == 0 {
		return nil
	}
	step := max(len(p.vols)/n, 1)
	for i := 0; i < n && i*step < len(p.vols); i++ {
		if _, err := p.Driver().SetCondition(p.vols[i*step].handle, control.Gone, 0); err != nil {
			return fmt.Errorf("break volume %s on %s: %w", p.vols[i*step].handle, p.name, err)
		}
	}
	return nil
}

// measureMemory starts a fresh controller, lets its caches fill and settle, and reads its memory.
func (h *runner) measureMemory(ctx context.Context, name string, debounce time.Duration) error {
	start := time.Now()
	if err := h.restartController(ctx, name, debounce); err != nil {
		return err
	}
	ready := time.Since(start)
	// The controller's handlers see every object once after its caches are full; once they
	// have, it collects the garbage of filling and sets its Go memory limit to follow the live
	// heap. Its memory is read from then on: what it settles at, not the tail of its start.
	var limit int64
	err := harness.WaitFor(ctx, 10*time.Minute, "the controller to set its Go memory limit after its first list", func() (bool, string) {
		var err error
		limit, err = h.ctrl.memoryLimit(ctx)
		return err == nil && limit > 0, fmt.Sprintf("limit %d, %v", limit, err)
	})
	if err != nil {
		return err
	}
	handled := time.Since(start)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(h.layout.Settle):
	}
	rss, anon, heap, err := h.ctrl.memory(ctx, 3)
	if err != nil {
		return err
	}
	if limit, err = h.ctrl.memoryLimit(ctx); err != nil {
		return err
	}
	if h.res.Memory == nil {
		h.res.Memory = &memory{}
	}
	h.res.Memory.Points = append(h.res.Memory.Points, memoryPoint{Volumes: h.clusterVolumes, Nodes: h.clusterNodes, RSSBytes: rss, RSSAnonBytes: anon, HeapInuseBytes: heap, GoMemoryLimitBytes: limit, ReadySeconds: ready.Seconds(), HandledSeconds: handled.Seconds()})
	h.logf("figure 4: controller with %d volumes cached: RSS %.1f MiB (%.1f MiB anonymous), heap in use %.1f MiB, Go memory limit %.1f MiB (ready in %s, every object handled in %s; startup requests: %s)",
		h.clusterVolumes, float64(rss)/(1<<20), float64(anon)/(1<<20), float64(heap)/(1<<20), float64(limit)/(1<<20), ready.Round(time.Millisecond), handled.Round(time.Millisecond), h.ctrl.stats.snapshot().describe())
	return nil
}

// fitMemory fits a line through the measured points and adds the extrapolation to 100,000
// volumes.
func (h *runner) fitMemory() {
	m := h.res.Memory
	var x, rss, anon, heap []float64
	for _, p := range m.Points {
		x = append(x, float64(p.Volumes))
		rss = append(rss, float64(p.RSSBytes))
		anon = append(anon, float64(p.RSSAnonBytes))
		heap = append(heap, float64(p.HeapInuseBytes))
	}
	m.RSSBytesPerVolume, m.RSSInterceptBytes = fitLine(x, rss)
	m.RSSAnonBytesPerVolume, m.RSSAnonInterceptBytes = fitLine(x, anon)
	m.HeapBytesPerVolume, m.HeapInterceptBytes = fitLine(x, heap)
	for _, n := range []int{10000, 100000} {
		measured := false
		for _, p := range m.Points {
			measured = measured || p.Volumes == n
		}
		if !measured {
			m.Points = append(m.Points, memoryPoint{Volumes: n, Extrapolated: true,
				RSSBytes:       int64(m.RSSInterceptBytes + m.RSSBytesPerVolume*float64(n)),
				RSSAnonBytes:   int64(m.RSSAnonInterceptBytes + m.RSSAnonBytesPerVolume*float64(n)),
				HeapInuseBytes: int64(m.HeapInterceptBytes + m.HeapBytesPerVolume*float64(n))})
		}
	}
}

// measureSweepCPU is figure 5.
func (h *runner) measureSweepCPU(ctx context.Context) error {
	profiles := ""
	if h.layout.Profile {
		profiles = h.dir
	}
	rs, err := sweepCPUFigures(ctx, h.layout.SweepCPUVolumes, profiles, h.logf)
	h.res.SweepCPU = append(h.res.SweepCPU, rs...)
	return err
}

// teamNamespaces are the namespaces of the sweep with teamPolicy.
const teamNamespaces = 500

// sweepCPUFigures measures one periodic sweep of volumes three ways: the built-in policy with
// memoized decisions and without, and teamPolicy (memoized) over claims in 500 namespaces with
// varied labels. With profiles set, each sweep is run again under the CPU profiler and the
// profile written there.
func sweepCPUFigures(ctx context.Context, volumes int, profiles string, logf func(string, ...any)) ([]sweepCPU, error) {
	sh, err := newShapes()
	if err != nil {
		return nil, err
	}
	var out []sweepCPU
	for _, run := range []struct {
		namespaces int
		memo       bool
		modules    []policy.Module
	}{{0, true, nil}, {0, false, nil}, {teamNamespaces, true, []policy.Module{teamPolicy}}} {
		f, err := newPlanningFixture(sh, volumes, 100, run.namespaces)
		if err != nil {
			return out, err
		}
		name := "built-in"
		if len(run.modules) > 0 {
			name = strings.TrimSuffix(run.modules[0].File, ".rego")
		}
		profile := ""
		if profiles != "" {
			profile = filepath.Join(profiles, fmt.Sprintf("sweep-%s-memo-%t.pprof", name, run.memo))
		}
		r, err := f.measure(ctx, run.memo, profile, run.modules...)
		if err != nil {
			return out, err
		}
		if r.Decisions != volumes {
			return out, fmt.Errorf("periodic sweep decided %d volumes, want %d", r.Decisions, volumes)
		}
		out = append(out, r)
		logf("figure 5: periodic sweep of %d volumes (%s policy, %d namespaces, memo %t): %.2f CPU seconds on one core (%.2fs wall), %.0f memo misses, %d tasks",
			r.Volumes, r.Policy, r.Namespaces, run.memo, r.CPUSeconds, r.WallSeconds, r.MemoMisses, r.TasksSubmitted)
	}
	return out, nil
}

// textLogger logs at verbosity 0 into w.
func textLogger(w io.Writer) klog.Logger {
	return textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(w)))
}
