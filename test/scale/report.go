package scale

import (
	"fmt"
	"sort"
	"strings"
)

// markdown renders the figures as the tables of docs/scale.md, for copying into it.
func (r *Results) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	mib := func(v float64) string { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }

	p("# Scale harness results (%s run, %s)\n\n", r.Mode, r.Started.Format("2006-01-02 15:04 UTC"))
	p("Machine: %d CPUs (%s), %s memory, Linux %s, %s; load average at start %s. Wall time %.0fs.\n\n",
		r.Machine.CPUs, r.Machine.CPUModel, mib(float64(r.Machine.MemoryBytes)), r.Machine.Kernel, r.Machine.GoVersion, r.LoadAverage, r.WallSeconds)

	p("## Setup\n\n| phase | nodes | volumes | written through | create s | volumes/s | listed by the apiserver after s | plugins start s |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Setup {
		p("| %s | %d | %d | %s | %.1f | %.0f | %.1f | %.1f |\n", s.Phase, s.Nodes, s.Volumes, s.Method, s.Seconds, s.VolumesPerSec, s.ServedSeconds, s.PluginsSeconds)
	}

	if len(r.APIRequests) > 0 {
		p("\n## 1. API requests per restart sweep\n\n")
		p("| cluster volumes | node volumes | sweeps | heals/sweep | controller requests/sweep (LIST+GET) | controller by verb | restarted sidecar requests | apiserver_request_total/sweep (all clients) | with watches (budget 10 + 3/heal) | peer requests (LIST+GET) | peer response bytes | peer s | peer s at 5 QPS |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, a := range r.APIRequests {
			p("| %d | %d | %d | %.1f | %.2f (%.0f) [min %d, max %d] | %s | %.1f | %.1f | %.1f (%.0f) | %.0f (%.0f) | %.0f | %.2f | %.0f |\n",
				a.ClusterVolumes, a.NodeVolumes, a.Sweeps, a.Heals, a.Controller.Requests, a.Controller.ListGet, a.ControllerRequestsMin, a.ControllerRequestsMax,
				verbs(a.Controller.ByVerbResource), a.Sidecar.Requests, a.APIServer.Requests, a.APIServerWithWatches, restartBudget(a.Heals), a.Peer.Client.Requests, a.Peer.Client.ListGet,
				a.Peer.Client.ResponseBytes, a.Peer.Seconds, a.Peer.SecondsAtDefaultRateLimit)
		}
	}
	for _, a := range r.APIRequests {
		at := fmt.Sprintf("At %d volumes on the node, %d in the cluster, %d broken before each restart", a.NodeVolumes, a.ClusterVolumes, a.BrokenPerRestart)
		p("\n%s, the restarted sidecar per restart: %s\n", at, verbs(a.Sidecar.ByVerbResource))
		p("\n%s, apiserver_request_total per sweep: %s\n", at, verbs(a.APIServer.ByVerbResource))
	}

	if c := r.ControllerStart; c != nil {
		p("\nController start: the restart announced before the controller started was recorded handled after %d of the node's %d volumes were probed.\n", c.Probed, c.NodeVolumes)
	}

	if l := r.Latency; l != nil {
		p("\n## 2. Restart to first probe\n\n| node volumes | cluster volumes | restarts | debounce | p50 | p99 | min | max | all probed p50 | all probed p99 |\n|---|---|---|---|---|---|---|---|---|---|\n")
		p("| %d | %d | %d | %.0fs | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.0f ms | %.0f ms |\n", l.NodeVolumes, l.ClusterVolumes, l.Restarts, l.DebounceSeconds,
			l.P50Ms, l.P99Ms, l.MinMs, l.MaxMs, l.AllProbedP50Ms, l.AllProbedP99Ms)
	}

	if s := r.Storm; s != nil {
		p("\n## 3. Rollout storm\n\n| nodes | volumes | budgets g/d/n | debounce | call delay | mean driver call | mean controller call | rollout | first probe | finish | dispatch | ideal | efficiency | dispatch efficiency | utilization | handled | max in flight | per node | per volume | violations | controller CPU | harness CPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		p("| %d | %d | %d/%d/%d | %.0fs | %.0f ms | %.1f ms | %.1f ms | %.1fs | %.1fs | %.1fs | %.1fs | %.1fs | %.0f%% | %.0f%% | %.0f%% | %.1fs | %d | %d | %d | %d | %.1fs | %.1fs |\n",
			s.Nodes, s.Volumes, s.Global, s.PerDriver, s.PerNode, s.DebounceSeconds, s.CallDelayMs, s.MeanDriverCallMs, s.MeanControllerCallMs,
			s.RolloutSeconds, s.FirstProbeSeconds, s.FinishSeconds, s.DispatchSeconds, s.IdealSeconds, 100*s.Efficiency, 100*s.DispatchEfficiency,
			100*s.Utilization, s.HandledSeconds, s.MaxInFlight, s.MaxInFlightPerNode, s.MaxInFlightPerVolume, s.BudgetViolations,
			s.ControllerCPUSeconds, s.HarnessCPUSeconds)
		p("\nGiven when each node's work arrived, a dispatcher that never idles a usable slot would have finished %.1fs after the first marker (%.1fs had the nodes taken turns, as the dispatcher did before): efficiency against that %.0f%%. The last sweep to end was %s's (%d volumes); it ran alone for the last %.1fs. From a node's last probe to its handled marker: %.2fs at the median, %.2fs at most.\n",
			s.ArrivalIdealSeconds, s.ArrivalTakingTurnsSeconds, 100*s.ArrivalEfficiency, s.LastNode, s.LastNodeVolumes, s.TailSeconds, s.HandledLagP50Seconds, s.HandledLagMaxSeconds)
		p("\nOne node plugin restart took %.1fs at the median, %.1fs at most (64 at a time). The dispatcher had tasks queued for %.1fs; meanwhile its slots were %.0f%% busy by its own gauge and %.0f%% busy at the drivers.\n",
			s.RestartP50Seconds, s.RestartMaxSeconds, s.BacklogSeconds, 100*s.BacklogControllerUtilization, 100*s.BacklogDriverUtilization)
		p("\nController requests during the storm: %s\n", verbs(s.ControllerRequests.ByVerbResource))
		for _, x := range s.DispatcherBenchmark {
			p("\nDispatcher alone (`go test -bench BenchmarkDispatchStorm ./scheduler`): %s: %s\n", x.Name, metricsLine(x.Metrics))
		}
		if len(s.ControllerProfileTop) > 0 {
			p("\nController from the start of the storm, `go tool pprof -top`:\n\n```\n%s\n```\n", strings.Join(s.ControllerProfileTop, "\n"))
			p("\nThe same, `-cum`:\n\n```\n%s\n```\n", strings.Join(s.ControllerProfileTopCum, "\n"))
		}
		if len(s.ProfileTop) > 0 {
			p("\nHarness process (sidecars and drivers) during the storm, `go tool pprof -top`:\n\n```\n%s\n```\n", strings.Join(s.ProfileTop, "\n"))
		}
	}

	if m := r.Memory; m != nil {
		p("\n## 4. Controller memory\n\n| volumes (PVs, PVCs, VAs each) | nodes | RSS | of it anonymous | Go heap in use | Go memory limit | ready after s | objects handled after s | measured |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, pt := range m.Points {
			kind := "measured"
			if pt.Extrapolated {
				kind = "extrapolated"
			}
			anon := "-"
			if pt.RSSAnonBytes > 0 {
				anon = mib(float64(pt.RSSAnonBytes))
			}
			limit := "-"
			if pt.GoMemoryLimitBytes > 0 {
				limit = mib(float64(pt.GoMemoryLimitBytes))
			}
			p("| %d | %d | %s | %s | %s | %s | %.1f | %.1f | %s |\n", pt.Volumes, pt.Nodes, mib(float64(pt.RSSBytes)), anon, mib(float64(pt.HeapInuseBytes)), limit, pt.ReadySeconds, pt.HandledSeconds, kind)
		}
		for _, c := range m.Caches {
			p("\nInformer caches rebuilt in the harness, %s: %d volumes, %s live, %.0f bytes per volume.\n", c.Name, c.Volumes, mib(float64(c.LiveBytes)), c.BytesPerVolume)
			if len(c.ProfileTop) > 0 {
				p("\n```\n%s\n```\n", strings.Join(c.ProfileTop, "\n"))
			}
		}
		if m.RSSBytesPerVolume != 0 {
			p("\nSlope: RSS %.0f bytes per volume, heap %.0f bytes per volume (intercepts %s, %s).\n", m.RSSBytesPerVolume, m.HeapBytesPerVolume, mib(m.RSSInterceptBytes), mib(m.HeapInterceptBytes))
		}
		if s := r.Storm; s != nil {
			p("After the storm (history of every volume held): RSS %s, heap %s.\n", mib(float64(s.ControllerRSSBytes)), mib(float64(s.ControllerHeapBytes)))
		}
	}

	if len(r.SweepCPU) > 0 {
		p("\n## 5. Periodic sweep planning and policy, one core\n\n")
		sweepCPUTable(p, r.SweepCPU)
	}

	if d := r.Decisions; d != nil {
		p("\n## 6. Policy decisions per second\n\n| measurement | decisions/s | µs/decision |\n|---|---|---|\n")
		for _, x := range d.InProcess {
			p("| harness: %s | %.0f | %.1f |\n", x.Name, x.DecisionsPerSecond, x.NsPerDecision/1000)
		}
		for _, x := range d.Benchmarks {
			p("| go test -bench ./policy: %s | %.0f | %.1f |\n", x.Name, x.Metrics["decisions/s"], x.Metrics["ns/op"]/1000)
		}
	}
	for _, n := range r.Notes {
		p("\nNote: %s\n", n)
	}
	return b.String()
}

func verbs(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.4g", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func metricsLine(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%.4g %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

// sweepCPUTable writes the rows of figure 5 and their profiles.
func sweepCPUTable(p func(string, ...any), rows []sweepCPU) {
	mib := func(v float64) string { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }
	p("| policy | volumes | nodes | namespaces | memo | CPU s | wall s | memo hits | memo misses | tasks | allocated | collections | live heap before |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range rows {
		p("| %s | %d | %d | %d | %t | %.2f | %.2f | %.0f | %.0f | %d | %s | %d | %s |\n", c.Policy, c.Volumes, c.Nodes, c.Namespaces, c.Memo,
			c.CPUSeconds, c.WallSeconds, c.MemoHits, c.MemoMisses, c.TasksSubmitted, mib(float64(c.AllocatedBytes)), c.Collections, mib(float64(c.LiveHeapBytes)))
	}
	for _, c := range rows {
		if len(c.ProfileTop) > 0 {
			p("\nProfile, %s policy at %d volumes, memo %t:\n\n```\n%s\n```\n", c.Policy, c.Volumes, c.Memo, strings.Join(c.ProfileTop, "\n"))
		}
	}
}
