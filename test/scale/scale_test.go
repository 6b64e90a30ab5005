package scale

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/volume-healer/volume-healer/test/controlplane"
)

var (
	full        = flag.Bool("full", false, "run the full-size harness (21,000 volumes over 201 nodes; about 15 minutes on 2 cores) and write bench/results.json; SCALE_FULL=1 does the same")
	resultsPath = flag.String("results", "", "write the results here instead of bench/results.json (full) or a temporary file (short)")
	only        = flag.String("only", "", "run one figure of the layout alone and write its results to -results or a temporary file, never to bench/: \"storm\" (figure 3, the rollout storm, with every node created at once; about 5 minutes with -full)")
	stormBudget = flag.Int("storm-budget", 0, "with -only=storm: the global and per-driver budgets of the storm instead of the layout's (64 with -full), the per-node budget unchanged; to see how the dispatch efficiency depends on how many calls the machine carries at once")
)

// TestScale runs the scale harness. Without -full it runs the small layout, so that the harness
// cannot rot unnoticed, and checks what a user would notice in any cluster: the controller reads
// nothing from the apiserver per sweep, the budgets hold in a rollout, every volume is probed.
func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver, etcd, the controller and simulated nodes; run without -short")
	}
	layout := ShortLayout()
	isFull := *full || os.Getenv("SCALE_FULL") == "1"
	if isFull {
		layout = FullLayout()
	}
	dir := t.TempDir()
	klogToFile(t, dir)
	if *stormBudget < 0 || *stormBudget > 0 && *only != "storm" {
		t.Fatalf("-storm-budget=%d: give a positive budget, and -only=storm with it (the full layout's figures keep their budgets)", *stormBudget)
	}
	switch *only {
	case "":
	case "storm":
		if *stormBudget > 0 {
			layout.Global, layout.PerDriver = *stormBudget, *stormBudget
		}
		runStormOnly(t, layout, dir)
		return
	default:
		t.Fatalf("-only=%q: no such figure; the one figure that runs alone is \"storm\"", *only)
	}

	res, err := Run(t.Context(), layout, dir, t.Logf)
	if res != nil {
		path := *resultsPath
		switch {
		case path != "":
		case isFull:
			root, rerr := controlplane.RepoRoot()
			if rerr != nil {
				t.Fatal(rerr)
			}
			path = filepath.Join(root, "bench", "results.json")
		default:
			path = filepath.Join(dir, "results.json")
		}
		if werr := res.write(path); werr != nil {
			t.Error(werr)
		} else {
			t.Logf("results written to %s", path)
		}
		if isFull {
			if werr := os.WriteFile(filepath.Join(filepath.Dir(path), "results.md"), []byte(res.markdown()), 0o644); werr != nil {
				t.Error(werr)
			}
		}
		checkWritten(t, path)
	}
	if err != nil {
		t.Fatalf("scale harness: %v (files kept in %s until the test ends)", err, dir)
	}
	checkResults(t, layout, res)
}

// runStormOnly runs figure 3 alone (-only=storm) and checks it as checkResults does; its results
// go to -results, or to dir, with the report and the storm's CPU profiles beside them.
func runStormOnly(t *testing.T, l Layout, dir string) {
	t.Helper()
	res, err := RunStorm(t.Context(), l, dir, t.Logf)
	if res != nil {
		path := *resultsPath
		if path == "" {
			path = filepath.Join(dir, "results.json")
		}
		if werr := res.write(path); werr != nil {
			t.Error(werr)
		}
		md := strings.TrimSuffix(path, filepath.Ext(path)) + ".md"
		if werr := os.WriteFile(md, []byte(res.markdown()), 0o644); werr != nil {
			t.Error(werr)
		}
		// The storm's CPU profiles go beside them, for go tool pprof.
		for _, name := range []string{"storm-controller.pprof", "storm-harness.pprof"} {
			if b, rerr := os.ReadFile(filepath.Join(dir, name)); rerr == nil {
				if werr := os.WriteFile(filepath.Join(filepath.Dir(path), name), b, 0o644); werr != nil {
					t.Error(werr)
				}
			}
		}
		t.Logf("results written to %s and %s, the storm's CPU profiles beside them", path, md)
	}
	if err != nil {
		t.Fatalf("storm: %v (files kept in %s until the test ends)", err, dir)
	}
	checkRolloutStorm(t, res.Storm)
	s := res.Storm
	t.Logf("storm: finished %.1fs after the first marker; the arrivals allowed %.1fs: efficiency against that %.0f%% (ideal %.1fs: %.0f%%); mean controller call %.1fms, mean driver call %.1fms; %d violations; load average at start %s",
		s.FinishSeconds, s.ArrivalIdealSeconds, 100*s.ArrivalEfficiency, s.IdealSeconds, 100*s.Efficiency, s.MeanControllerCallMs, s.MeanDriverCallMs, s.BudgetViolations, res.LoadAverage)
}

// checkWritten reads the results file back: another tool must be able to load it.
func checkWritten(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back Results
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("results file %s does not decode: %v", path, err)
	}
	if back.Schema != resultsSchema {
		t.Errorf("results file schema %q, want %q", back.Schema, resultsSchema)
	}
}

// checkResults asserts what holds at any size.
func checkResults(t *testing.T, l Layout, r *Results) {
	t.Helper()
	sizes := 2
	if l.LargeNodeVolumes > 0 {
		sizes++
	}
	if len(r.APIRequests) != sizes {
		t.Fatalf("figure 1 measured at %d sizes, want %d", len(r.APIRequests), sizes)
	}
	if l.LargeNodeVolumes > 0 {
		if a := r.APIRequests[2]; a.NodeVolumes != l.LargeNodeVolumes || a.ClusterVolumes != l.LargeNodeClusterVolumes {
			t.Errorf("figure 1's large size: %d volumes on the node, %d in the cluster; want %d and %d", a.NodeVolumes, a.ClusterVolumes, l.LargeNodeVolumes, l.LargeNodeClusterVolumes)
		}
	}
	for _, a := range r.APIRequests {
		if want := float64(min(a.BrokenPerRestart, a.NodeVolumes)); a.Heals < want {
			t.Errorf("at %d volumes on the node a restart sweep healed %.1f volumes, want the %.0f broken before each restart", a.NodeVolumes, a.Heals, want)
		}
		if a.ControllerListGetMax != 0 {
			t.Errorf("at %d volumes a restart sweep made up to %d LIST/GET requests from the controller, want 0: %v",
				a.ClusterVolumes, a.ControllerListGetMax, a.Controller.ByVerbResource)
		}
		if got := a.Controller.ByVerbResource["PATCH csiaddonsnodes"]; got != 1 {
			t.Errorf("at %d volumes the controller wrote %.2f handled markers per sweep, want 1", a.ClusterVolumes, got)
		}
		if a.Peer.Volumes != a.NodeVolumes {
			t.Errorf("the list-everything approach found %d volumes on the node, want %d", a.Peer.Volumes, a.NodeVolumes)
		}
		checkRestartCost(t, a)
		if want := float64(1 + 3*a.NodeVolumes); a.Peer.Client.Requests != want {
			t.Errorf("the list-everything approach made %.0f requests, want %.0f (one LIST, three GETs per volume)", a.Peer.Client.Requests, want)
		}
	}
	if r.APIRequests[1].ClusterVolumes <= r.APIRequests[0].ClusterVolumes {
		t.Errorf("figure 1's second size (%d volumes) is not larger than its first (%d)", r.APIRequests[1].ClusterVolumes, r.APIRequests[0].ClusterVolumes)
	}

	// A restart announced while no controller ran is swept when one starts, from full caches.
	if c := r.ControllerStart; c == nil || c.Probed != c.NodeVolumes {
		t.Errorf("controller start: the restart pending when the controller started was recorded handled after probing %+v of the node's volumes; want all", c)
	}

	lat := r.Latency
	if lat == nil || len(lat.SamplesMs) != l.Restarts {
		t.Fatalf("figure 2: want %d latency samples, got %+v", l.Restarts, lat)
	}
	for _, s := range lat.SamplesMs {
		if s <= 0 {
			t.Errorf("figure 2: a restart's first probe came %.1fms after its marker; want a positive time", s)
		}
	}

	checkRolloutStorm(t, r.Storm)

	m := r.Memory
	if m == nil {
		t.Fatal("figure 4: no memory results")
	}
	measured := 0
	for _, p := range m.Points {
		if p.Extrapolated {
			continue
		}
		measured++
		if p.HeapInuseBytes <= 0 || p.RSSBytes < p.HeapInuseBytes {
			t.Errorf("figure 4: at %d volumes RSS %d and heap %d bytes; want 0 < heap <= RSS", p.Volumes, p.RSSBytes, p.HeapInuseBytes)
		}
	}
	want := 3
	for _, size := range l.MemoryVolumes {
		if size > l.BigNodeVolumes+(l.GrowNodes+l.StormNodes)*l.VolumesPerNode {
			want++
		}
	}
	if measured != want {
		t.Errorf("figure 4: %d measured points, want %d", measured, want)
	}
	// The volumes written into etcd are listed by the apiserver (addVolumesOnly waits for it)
	// and cached by the controller: each point after the storm counts them.
	for _, size := range l.MemoryVolumes {
		found := false
		for _, p := range m.Points {
			found = found || (!p.Extrapolated && p.Volumes == size)
		}
		if !found {
			t.Errorf("figure 4: no point measured at %d volumes", size)
		}
	}
	// Caches: informer-filled shipped and previous transform, then the decoded in-process shipped
	// and previous transform. The sidecar keeps no informer cache (TestSidecarMemoryFollowsItsNode).
	if len(m.Caches) != 4 {
		t.Fatalf("figure 4: %d in-process cache measurements, want 4", len(m.Caches))
	}
	for _, pair := range [][2]int{{0, 1}, {2, 3}} {
		shipped, before := m.Caches[pair[0]], m.Caches[pair[1]]
		if shipped.BytesPerVolume <= 0 || shipped.BytesPerVolume >= before.BytesPerVolume {
			t.Errorf("figure 4: %s takes %.0f bytes per volume, %s %.0f; want a positive size below the previous transform's",
				shipped.Name, shipped.BytesPerVolume, before.Name, before.BytesPerVolume)
		}
	}
	if m.Caches[2].Volumes != l.DecodedCacheVolumes {
		t.Errorf("figure 4: decoded caches measured with %d volumes, want %d", m.Caches[2].Volumes, l.DecodedCacheVolumes)
	}

	checkSweepCPU(t, r.SweepCPU, l.SweepCPUVolumes)

	if r.Decisions == nil || len(r.Decisions.InProcess) != 4 {
		t.Fatalf("figure 6: want 4 in-process rates, got %+v", r.Decisions)
	}
	for _, d := range r.Decisions.InProcess {
		if d.DecisionsPerSecond <= 0 {
			t.Errorf("figure 6: %s: %.0f decisions/s", d.Name, d.DecisionsPerSecond)
		}
	}
}

// checkRolloutStorm asserts what holds of figure 3 at any size: no budget exceeded, every volume
// probed, the controller profiled, an efficiency that is a fraction.
func checkRolloutStorm(t *testing.T, s *storm) {
	t.Helper()
	if s == nil {
		t.Fatal("figure 3: no storm results")
	}
	if s.BudgetViolations != 0 {
		t.Errorf("storm: %d budgets exceeded: in flight %d (global %d), per node %d/%d (driver counters %d), per volume %d/%d (driver counters %d)",
			s.BudgetViolations, s.MaxInFlight, s.Global, s.MaxInFlightPerNode, s.PerNode, s.DriverMaxConcurrentPerNode,
			s.MaxInFlightPerVolume, 1, s.DriverMaxConcurrentPerVolume)
	}
	if s.VolumesProbed != s.Volumes {
		t.Errorf("storm: %d of %d volumes probed", s.VolumesProbed, s.Volumes)
	}
	if len(s.ControllerProfileTop) == 0 {
		t.Error("storm: no CPU profile of the controller")
	}
	if s.Efficiency <= 0 || s.Efficiency > 1.05 {
		t.Errorf("storm: efficiency %.2f is outside (0, 1]: the measurement is broken", s.Efficiency)
	}
}

// checkSweepCPU asserts what holds of figure 5 at any size: three sweeps (the built-in policy with
// the memo and without, teamPolicy with it), each deciding every volume; the built-in policy
// probes every volume, teamPolicy leaves some alone (opted out, sandboxes); teamPolicy's
// decisions hit the memo and miss it for many of the namespaces in use (how often is the
// figure; it depends on the size).
func checkSweepCPU(t *testing.T, rows []sweepCPU, volumes int) {
	t.Helper()
	if len(rows) != 3 {
		t.Fatalf("figure 5: %d results, want 3 (built-in policy with and without the memo, teams policy)", len(rows))
	}
	for _, c := range rows {
		var failed float64
		for _, n := range c.EvaluationErrors {
			failed += n
		}
		if c.Volumes != volumes || c.Decisions != volumes || c.CPUSeconds <= 0 {
			t.Errorf("figure 5 (%s, memo %t): %d of %d volumes decided in %.3f CPU seconds; want all %d and a positive time",
				c.Policy, c.Memo, c.Decisions, c.Volumes, c.CPUSeconds, volumes)
		}
		// A decision that timed out on a starved CPU leaves its volume alone; with the built-in
		// policy every other volume is to be probed.
		switch {
		case c.Policy == "built-in" && float64(c.TasksSubmitted)+failed != float64(c.Volumes):
			t.Errorf("figure 5 (built-in, memo %t): %d of %d volumes to probe, %.0f evaluation errors; want every volume", c.Memo, c.TasksSubmitted, c.Volumes, failed)
		case c.Policy == "teams" && (c.TasksSubmitted == 0 || c.TasksSubmitted >= int64(c.Volumes)):
			t.Errorf("figure 5 (teams): %d of %d volumes to probe; want most, not all (opted-out claims and sandboxes are skipped)", c.TasksSubmitted, c.Volumes)
		}
	}
	teams := rows[2]
	minMisses := float64(min(teams.Namespaces, teams.Volumes/10))
	if teams.MemoMisses < minMisses || teams.MemoHits == 0 {
		t.Errorf("figure 5 (teams): %.0f memo hits and %.0f misses over %d volumes in %d namespaces; want at least %.0f misses and some hits",
			teams.MemoHits, teams.MemoMisses, teams.Volumes, teams.Namespaces, minMisses)
	}
}

// TestControllerMemory runs figure 4 alone (RunMemory): with -full (make bench-memory), the
// controller's memory at the full layout's sizes after the storm, 40,000, 100,000 and 300,000
// volumes written into etcd, into bench/memory.json and bench/memory.md. Without it the test is
// skipped: TestScale's small layout runs the same points at its sizes.
func TestControllerMemory(t *testing.T) {
	if testing.Short() || !(*full || os.Getenv("SCALE_FULL") == "1") {
		t.Skip("the full sizes only (-full); TestScale runs the same points at small sizes")
	}
	dir := t.TempDir()
	klogToFile(t, dir)

	l := FullLayout()
	res, err := RunMemory(t.Context(), l.MemoryVolumes, l.Settle, dir, t.Logf)
	if res != nil {
		path := *resultsPath
		if path == "" {
			root, rerr := controlplane.RepoRoot()
			if rerr != nil {
				t.Fatal(rerr)
			}
			path = filepath.Join(root, "bench", "memory.json")
		}
		if werr := res.write(path); werr != nil {
			t.Error(werr)
		} else {
			t.Logf("results written to %s", path)
		}
		md := strings.TrimSuffix(path, filepath.Ext(path)) + ".md"
		if werr := os.WriteFile(md, []byte(res.markdown()), 0o644); werr != nil {
			t.Error(werr)
		}
		checkWritten(t, path)
	}
	if err != nil {
		t.Fatalf("controller memory: %v (files kept in %s until the test ends)", err, dir)
	}
	for _, size := range l.MemoryVolumes {
		found := false
		for _, p := range res.Memory.Points {
			if p.Volumes == size {
				found = true
				if p.HeapInuseBytes <= 0 || p.RSSBytes < p.HeapInuseBytes || p.GoMemoryLimitBytes <= 0 {
					t.Errorf("at %d volumes RSS %d, heap %d, Go memory limit %d bytes; want 0 < heap <= RSS and a limit", size, p.RSSBytes, p.HeapInuseBytes, p.GoMemoryLimitBytes)
				}
			}
		}
		if !found {
			t.Errorf("no point measured at %d volumes", size)
		}
	}
}

// klogToFile sends klog's output (client-go's and the sidecars' logs) into a file in dir until
// the test ends, so that the test's output is its own figures.
func klogToFile(t *testing.T, dir string) {
	t.Helper()
	logFile, err := os.Create(filepath.Join(dir, "klog.log"))
	if err != nil {
		t.Fatal(err)
	}
	klog.LogToStderr(false)
	klog.SetOutput(logFile)
	t.Cleanup(func() {
		klog.LogToStderr(true)
		_ = logFile.Close()
	})
}
