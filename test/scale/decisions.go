package scale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// decisionInputs builds n policy inputs from the harness's own objects, as a restart sweep builds
// them; with probed set, each carries a probe result (every tenth healthy, the others broken), as
// the second evaluation does.
func decisionInputs(s *shapes, n int, probed bool) []policy.Input {
	driver := policy.DriverInfo{
		Name: driverName, IdentityCapabilities: []string{"service.NODE_SERVICE"},
		Healer: policy.HealerCapabilities{Probe: true, Heal: true, Attributes: map[string]string{"healMounters": "rbd-nbd,fuse"}},
	}
	classes := map[string]int{}
	for i, sc := range s.storageClasses {
		classes[sc.Name] = i
	}
	out := make([]policy.Input, 0, n)
	for i, v := range s.newVolumes("node-000", n) {
		pv, pvc, va := s.objects(v)
		in := policy.BuildInput(pv, pvc, s.storageClasses[classes[v.class]], va, nodeObject(v.node, 0), driver, policy.TriggerRestart)
		if probed {
			in.Probe = &policy.ProbeResult{Healable: true, Health: []policy.Health{{
				Status: policy.HealthInaccessible, Reason: "MountGone", Message: fmt.Sprintf("/dev/nbd%d is gone", i),
			}}}
			if i%10 == 0 {
				in.Probe = &policy.ProbeResult{Healthy: true, Healable: true, Health: []policy.Health{}}
			}
		}
		out = append(out, in)
	}
	return out
}

// decisionRateOf times the default policy's decisions over inputs, round robin, for about d.
func decisionRateOf(ctx context.Context, name string, inputs []policy.Input, memo bool, d time.Duration) (decisionRate, error) {
	e, err := policy.NewEngine(ctx, policy.Options{Compile: policy.CompileOptions{DisableMemo: !memo}, Metrics: policy.NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		return decisionRate{}, err
	}
	// One round to warm the memo and the caches, untimed.
	for i := range inputs {
		if _, err := e.Decide(ctx, &inputs[i]); err != nil {
			return decisionRate{}, err
		}
	}
	start := time.Now()
	n := 0
	for time.Since(start) < d {
		for i := 0; i < 100; i++ {
			if _, err := e.Decide(ctx, &inputs[n%len(inputs)]); err != nil {
				return decisionRate{}, err
			}
			n++
		}
	}
	took := time.Since(start)
	return decisionRate{Name: name, DecisionsPerSecond: float64(n) / took.Seconds(), NsPerDecision: float64(took.Nanoseconds()) / float64(n)}, nil
}

// measureDecisions is figure 6.
func (h *runner) measureDecisions(ctx context.Context) error {
	s, err := newShapes()
	if err != nil {
		return err
	}
	d := 300 * time.Millisecond
	if h.layout.Profile {
		d = 2 * time.Second
	}
	out := &decisions{}
	for _, probed := range []bool{false, true} {
		inputs := decisionInputs(s, 1000, probed)
		for _, memo := range []bool{true, false} {
			name := fmt.Sprintf("default policy, probed=%t, memo=%t", probed, memo)
			r, err := decisionRateOf(ctx, name, inputs, memo, d)
			if err != nil {
				return err
			}
			out.InProcess = append(out.InProcess, r)
			h.logf("figure 6: %s: %.0f decisions/s (%.1f µs each)", name, r.DecisionsPerSecond, r.NsPerDecision/1000)
		}
	}
	if h.layout.Profile {
		lines, err := goBenchmarks("./policy", "^BenchmarkDecision(Default|50Rules)$")
		if err != nil {
			// The package's own benchmarks are a second source; the figure stands without them.
			h.res.Notes = append(h.res.Notes, "policy benchmarks not run: "+err.Error())
			h.logf("figure 6: policy benchmarks not run: %v", err)
		}
		out.Benchmarks = lines
	}
	h.res.Decisions = out
	return nil
}

// goBenchmarks runs the benchmarks of a package of this module that match pattern and parses
// their lines.
func goBenchmarks(pkg, pattern string) ([]benchmarkLine, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", pattern, "-benchmem", pkg)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go test -bench %s %s: %w: %s%s", pattern, pkg, err, out, stderr.String())
	}
	return parseBenchmarks(out), nil
}

// parseBenchmarks reads `go test -bench` output lines: name, iterations, then value-unit pairs.
func parseBenchmarks(out []byte) []benchmarkLine {
	var lines []benchmarkLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		l := benchmarkLine{Name: f[0], Metrics: map[string]float64{}}
		if n, err := strconv.ParseFloat(f[1], 64); err == nil {
			l.Metrics["iterations"] = n
		}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				l.Metrics[f[i+1]] = v
			}
		}
		lines = append(lines, l)
	}
	return lines
}
