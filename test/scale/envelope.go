package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/volume-healer/volume-healer/scheduler/dispatch"
)

// The envelope run measures, in this process, the parts of one controller's envelope that an
// API server on this machine cannot be filled for in time: the periodic sweep of figure 5 at
// 100,000 volumes (three policies) and at 300,000, and a rollout storm of 5,000 nodes through the
// dispatcher. It needs no control plane.

// envelopeSchema versions bench/envelope.json.
const envelopeSchema = "volume-healer/envelope/v1"

// EnvelopeLayout sizes an envelope run.
type EnvelopeLayout struct {
	// SweepVolumes are the volumes of the sweeps of figure 5 (three policies).
	SweepVolumes int `json:"sweepVolumes"`
	// LargeSweepVolumes are the volumes of the sweeps at the envelope's size (the built-in and
	// the teams policy, memoized).
	LargeSweepVolumes int `json:"largeSweepVolumes"`
	// CacheVolumes are the volumes whose caches a process of its own decodes and holds.
	CacheVolumes int `json:"cacheVolumes"`
	// StormNodes x StormVolumesPerNode calls of StormCall each go through the dispatcher at once,
	// under the budgets of figure 3 (64 in all, 64 per driver, 4 per node).
	StormNodes          int           `json:"stormNodes"`
	StormVolumesPerNode int           `json:"stormVolumesPerNode"`
	StormCall           time.Duration `json:"stormCall"`
	// Profile takes a CPU profile of every sweep and runs the policy benchmarks.
	Profile bool `json:"profile"`
}

// ShortEnvelopeLayout is the run of the normal test command, in seconds.
func ShortEnvelopeLayout() EnvelopeLayout {
	return EnvelopeLayout{SweepVolumes: 2000, LargeSweepVolumes: 6000, CacheVolumes: 6000, StormNodes: 100, StormVolumesPerNode: 20, StormCall: 5 * time.Millisecond}
}

// FullEnvelopeLayout is the run that make bench asks for.
func FullEnvelopeLayout() EnvelopeLayout {
	return EnvelopeLayout{SweepVolumes: 100000, LargeSweepVolumes: 300000, CacheVolumes: 300000, StormNodes: 5000, StormVolumesPerNode: 60,
		StormCall: 5 * time.Millisecond, Profile: true}
}

// EnvelopeResults are the figures of an envelope run.
type EnvelopeResults struct {
	Schema      string         `json:"schema"`
	Mode        string         `json:"mode"`
	Started     time.Time      `json:"started"`
	WallSeconds float64        `json:"wallSeconds"`
	Machine     machineInfo    `json:"machine"`
	LoadAverage string         `json:"loadAverage"`
	Layout      EnvelopeLayout `json:"layout"`
	// SweepCPU is figure 5 at SweepVolumes.
	SweepCPU []sweepCPU `json:"sweepCPU"`
	// LargeSweepCPU is figure 5's memoized sweeps at LargeSweepVolumes.
	LargeSweepCPU []sweepCPU `json:"largeSweepCPU"`
	// Caches is the memory of a process holding the caches of CacheVolumes volumes.
	Caches *cacheProcess `json:"caches"`
	// Storm is the rollout storm through the dispatcher.
	Storm *dispatchStorm `json:"storm"`
	// DecisionFloor are the lines of `go test -bench '^BenchmarkDecision$' ./policy`: an
	// evaluated decision beside OPA's floor for the same policy and input (full runs only).
	DecisionFloor []benchmarkLine `json:"decisionFloor,omitempty"`
	Notes         []string        `json:"notes,omitempty"`
}

// RunEnvelope measures the envelope's in-process figures; profiles go to dir.
func RunEnvelope(ctx context.Context, l EnvelopeLayout, dir string, logf func(string, ...any)) (*EnvelopeResults, error) {
	start := time.Now()
	res := &EnvelopeResults{Schema: envelopeSchema, Mode: "short", Started: start.UTC(), Layout: l,
		Machine: readMachine(runtime.Version(), runtime.NumCPU())}
	if l.Profile {
		res.Mode = "full"
	}
	res.LoadAverage = loadAverage()
	defer func() { res.WallSeconds = time.Since(start).Seconds() }()
	profiles := ""
	if l.Profile {
		profiles = dir
	}
	var err error
	if res.SweepCPU, err = sweepCPUFigures(ctx, l.SweepVolumes, profiles, logf); err != nil {
		return res, err
	}
	sh, err := newShapes()
	if err != nil {
		return res, err
	}
	for _, namespaces := range []int{0, teamNamespaces} {
		f, err := newPlanningFixture(sh, l.LargeSweepVolumes, 100, namespaces)
		if err != nil {
			return res, err
		}
		var r sweepCPU
		if namespaces == 0 {
			r, err = f.measure(ctx, true, "")
		} else {
			r, err = f.measure(ctx, true, "", teamPolicy)
		}
		if err != nil {
			return res, err
		}
		res.LargeSweepCPU = append(res.LargeSweepCPU, r)
		logf("envelope: periodic sweep of %d volumes (%s policy, %d namespaces): %.2f CPU seconds on one core (%.2fs wall), %.0f memo misses",
			r.Volumes, r.Policy, r.Namespaces, r.CPUSeconds, r.WallSeconds, r.MemoMisses)
	}
	caches, err := measureCacheProcess(l.CacheVolumes)
	if err != nil {
		return res, err
	}
	res.Caches = &caches
	logf("envelope: the caches of %d volumes, decoded in a process of their own: live heap %.0f MiB, RSS %.0f MiB (peak %.0f MiB; %.0f MiB without volumes)",
		caches.Volumes, float64(caches.LiveBytes)/(1<<20), float64(caches.RSSBytes)/(1<<20), float64(caches.PeakRSSBytes)/(1<<20), float64(caches.BaselineRSSBytes)/(1<<20))
	storm, err := runDispatchStorm(ctx, l.StormNodes, l.StormVolumesPerNode,
		dispatch.Options{Global: 64, PerDriver: 64, PerNode: 4}, l.StormCall)
	if err != nil {
		return res, err
	}
	res.Storm = &storm
	logf("envelope: storm of %d nodes x %d volumes through the dispatcher: %.1fs against a budget-bound %.1fs (%.1f%%), %d violations, max in flight %d (per node %d, per volume %d)",
		storm.Nodes, storm.VolumesPerNode, storm.Seconds, storm.IdealSeconds, 100*storm.Efficiency, storm.Violations,
		storm.MaxInFlight, storm.MaxInFlightPerNode, storm.MaxInFlightPerVolume)
	if l.Profile {
		lines, err := goBenchmarks("./policy", "^BenchmarkDecision$")
		if err != nil {
			res.Notes = append(res.Notes, "policy benchmarks not run: "+err.Error())
		}
		res.DecisionFloor = lines
	}
	return res, nil
}

// markdown renders the results as bench/envelope.md.
func (r *EnvelopeResults) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# One controller's envelope, in-process figures (%s run, %s)\n\n", r.Mode, r.Started.Format("2006-01-02 15:04 MST"))
	p("Machine: %d CPUs (%s), %.1f MiB memory, Linux %s, %s; load average at start %s. Wall time %.0fs.\n",
		r.Machine.CPUs, r.Machine.CPUModel, float64(r.Machine.MemoryBytes)/(1<<20), r.Machine.Kernel, r.Machine.GoVersion, r.LoadAverage, r.WallSeconds)
	p("\nEvery figure here is measured in this process, without an API server: the controller's sweep code over informer stores filled with its transform's records.\n")
	p("\n## Periodic sweep planning and policy, one core, %d volumes\n\n", r.Layout.SweepVolumes)
	sweepCPUTable(p, r.SweepCPU)
	p("\n## Periodic sweep planning and policy, one core, %d volumes\n\n", r.Layout.LargeSweepVolumes)
	sweepCPUTable(p, r.LargeSweepCPU)
	if c := r.Caches; c != nil {
		p("\n## The controller's caches, decoded in a process of their own\n\n| volumes | live heap | per volume | RSS after collection | peak RSS while filling | RSS of the same process without volumes |\n|---|---|---|---|---|---|\n")
		p("| %d | %.1f MiB | %.0f bytes | **%.1f MiB** | %.1f MiB | %.1f MiB |\n", c.Volumes, float64(c.LiveBytes)/(1<<20), float64(c.LiveBytes)/float64(c.Volumes),
			float64(c.RSSBytes)/(1<<20), float64(c.PeakRSSBytes)/(1<<20), float64(c.BaselineRSSBytes)/(1<<20))
	}
	if st := r.Storm; st != nil {
		p("\n## Rollout storm through the dispatcher\n\n| nodes | volumes | budgets g/d/n | call | mean call | finish | budget-bound | efficiency | calls | max in flight | per node | per volume | violations | CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		p("| %d | %d | %d/%d/%d | %.1f ms | %.2f ms | %.1f s | %.1f s (nominal %.1f s) | **%.1f %%** | %d | %d | %d | %d | **%d** | %.1f |\n",
			st.Nodes, st.Nodes*st.VolumesPerNode, st.Global, st.PerDriver, st.PerNode, 1000*st.CallSeconds, 1000*st.MeanCallSeconds,
			st.Seconds, st.IdealSeconds, st.NominalIdealSeconds, 100*st.Efficiency, st.Calls, st.MaxInFlight, st.MaxInFlightPerNode,
			st.MaxInFlightPerVolume, st.Violations, st.CPUSeconds)
	}
	if len(r.DecisionFloor) > 0 {
		p("\n## An evaluated decision beside OPA's floor (`go test -bench '^BenchmarkDecision$' ./policy`)\n\n")
		p("| benchmark | µs/op | allocs/op | evaluated µs | floor µs | x-floor (time) | x-floor (allocations) |\n|---|---|---|---|---|---|---|\n")
		for _, l := range r.DecisionFloor {
			m := l.Metrics
			if _, ok := m["x-floor"]; ok {
				p("| %s | %.1f | %.0f | %.1f | %.1f | **%.2f** | %.2f |\n", l.Name, m["ns/op"]/1000, m["allocs/op"], m["evaluated-µs"], m["floor-µs"], m["x-floor"], m["allocs-x-floor"])
			} else {
				p("| %s | %.1f | %.0f | | | | |\n", l.Name, m["ns/op"]/1000, m["allocs/op"])
			}
		}
	}
	for _, n := range r.Notes {
		p("\nNote: %s\n", n)
	}
	return b.String()
}

// write stores r as indented JSON at path and as markdown beside it (same name, .md).
func (r *EnvelopeResults) write(path string) error {
	if err := writeJSON(path, r); err != nil {
		return err
	}
	md := strings.TrimSuffix(path, filepath.Ext(path)) + ".md"
	return os.WriteFile(md, []byte(r.markdown()), 0o644)
}
