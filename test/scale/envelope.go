package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The envelope run measures, in this process, the parts of one controller's envelope that an
// API server on this machine cannot be filled for in time: the periodic sweep of figure 5 at
// 100,000 volumes (three policies) and at 300,000. It needs no control plane.

// envelopeSchema versions bench/envelope.json.
const envelopeSchema = "volume-healer/envelope/v1"

// EnvelopeLayout sizes an envelope run.
type EnvelopeLayout struct {
	// SweepVolumes are the volumes of the sweeps of figure 5 (three policies).
	SweepVolumes int `json:"sweepVolumes"`
	// LargeSweepVolumes are the volumes of the sweeps at the envelope's size (the built-in and
	// the teams policy, memoized).
	LargeSweepVolumes int `json:"largeSweepVolumes"`
	// Profile takes a CPU profile of every sweep.
	Profile bool `json:"profile"`
}

// ShortEnvelopeLayout is the run of the normal test command, in seconds.
func ShortEnvelopeLayout() EnvelopeLayout {
	return EnvelopeLayout{SweepVolumes: 2000, LargeSweepVolumes: 6000}
}

// FullEnvelopeLayout is the run that make bench asks for.
func FullEnvelopeLayout() EnvelopeLayout {
	return EnvelopeLayout{SweepVolumes: 100000, LargeSweepVolumes: 300000, Profile: true}
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
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.LoadAverage = strings.TrimSpace(string(b))
	}
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
