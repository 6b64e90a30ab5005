package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// benchVolumes returns n distinct volumes (names, handles, claims differ) as the controller would
// evaluate them in one restart sweep, first without and then with a probe result.
func benchVolumes(n int, probed bool) []Input {
	out := make([]Input, n)
	for i := range out {
		in := sampleInput()
		in.Volume.PV = fmt.Sprintf("pvc-%08d-5d6b-4c1a-9e7f-0a1b2c3d4e5f", i)
		in.Volume.Handle = fmt.Sprintf("0001-0009-rook-ceph-0000000000000002-%08d", i)
		in.Volume.PVC = &Claim{Namespace: fmt.Sprintf("ns-%d", i%20), Name: fmt.Sprintf("data-%d", i),
			Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%50)}}
		if probed {
			in.Probe = brokenProbe()
			in.Probe.Health[0].Message = fmt.Sprintf("/dev/nbd%d is gone", i)
			if i%10 == 0 {
				in.Probe = &ProbeResult{Healthy: true, Healable: true}
			}
		}
		out[i] = in
	}
	return out
}

// fiftyRulePolicy is a generated policy of 50 rules, each for one StorageClass, mounter and
// trigger, the shape a site with many classes might write.
func fiftyRulePolicy() []Module {
	var b strings.Builder
	b.WriteString("package volumehealer\n\ndefault decision := {\"action\": \"skip\", \"reason\": \"NoClassRule\"}\n")
	for i := range 50 {
		action := []string{"probe", "heal", "skip"}[i%3]
		fmt.Fprintf(&b, `
decision := {"action": %q, "reason": "class-%d", "priority": %d, "timeout": "%ds"} if {
	input.volume.storageClass.name == "class-%d"
	input.volume.attributes.mounter == %q
	input.trigger != "manual"
	not input.volume.pvc.labels["healer.csiaddons.openshift.io/skip"]
}
`, action, i, i, 10+i, i, []string{"rbd-nbd", "fuse"}[i%2])
	}
	return []Module{{File: "fifty.rego", Text: b.String()}}
}

func fiftyRuleVolumes(n int) []Input {
	out := benchVolumes(n, false)
	for i := range out {
		out[i].Volume.StorageClass = &StorageClass{Name: fmt.Sprintf("class-%d", i%50), Parameters: map[string]string{"pool": "replicapool"}}
		out[i].Volume.Attributes = map[string]string{"mounter": []string{"rbd-nbd", "fuse"}[i%2]}
	}
	return out
}

// benchDecide measures Engine.Decide, metrics included, over inputs.
func benchDecide(b *testing.B, modules []Module, inputs []Input, memo bool) {
	ctx := context.Background()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	e, err := NewEngine(ctx, Options{Metrics: m, Compile: CompileOptions{DisableMemo: !memo}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.Load(ctx, modules); err != nil {
		b.Fatal(err)
	}
	if on, why := e.Revision().Memoized(); on != memo {
		b.Fatalf("memoized %t (%s), want %t", on, why, memo)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, err := e.Decide(ctx, &inputs[i%len(inputs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

func memoName(on bool) string {
	if on {
		return "memo=on"
	}
	return "memo=off"
}

// BenchmarkDecisionDefault measures the built-in policy over a sweep of 1000 volumes: the first
// evaluation (probe?) and the second (heal?, probe messages differ per volume).
func BenchmarkDecisionDefault(b *testing.B) {
	for _, probed := range []bool{false, true} {
		for _, memo := range []bool{true, false} {
			name := fmt.Sprintf("probed=%t/%s", probed, memoName(memo))
			b.Run(name, func(b *testing.B) { benchDecide(b, DefaultModules(), benchVolumes(1000, probed), memo) })
		}
	}
}

// BenchmarkDecision50Rules measures a generated 50-rule policy over 1000 volumes of 50 classes.
func BenchmarkDecision50Rules(b *testing.B) {
	for _, memo := range []bool{true, false} {
		b.Run(memoName(memo), func(b *testing.B) { benchDecide(b, fiftyRulePolicy(), fiftyRuleVolumes(1000), memo) })
	}
}

// BenchmarkDecisionREST measures the same decisions through `opa run --server` on loopback, the
// deployment a user might pick instead of the in-process engine.
func BenchmarkDecisionREST(b *testing.B) {
	opa, err := opaBinary()
	if err != nil {
		b.Skipf("skipping: hack/opa.sh could not build opa (%v); the REST comparison needs the real binary", err)
	}
	tests := map[string]struct {
		modules []Module
		inputs  []Input
	}{
		"default":  {DefaultModules(), benchVolumes(1000, false)},
		"50 rules": {fiftyRulePolicy(), fiftyRuleVolumes(1000)},
	}
	for name, tc := range tests {
		b.Run(name, func(b *testing.B) {
			url := startOPAServer(b, opa, tc.modules)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Second}
			bodies := make([][]byte, len(tc.inputs))
			for i := range tc.inputs {
				body, err := json.Marshal(map[string]any{"input": tc.inputs[i]})
				if err != nil {
					b.Fatal(err)
				}
				bodies[i] = body
			}
			// The server must agree with the engine, or the comparison means nothing.
			rev, err := Compile(context.Background(), tc.modules, CompileOptions{})
			if err != nil {
				b.Fatal(err)
			}
			for i := range 50 {
				want, err := rev.Decide(context.Background(), &tc.inputs[i])
				if err != nil {
					b.Fatal(err)
				}
				if got := postDecision(b, client, url, bodies[i]); got != want {
					b.Fatalf("opa server decided %+v, the engine %+v", got, want)
				}
			}
			b.ResetTimer()
			i := 0
			for b.Loop() {
				postDecision(b, client, url, bodies[i%len(bodies)])
				i++
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// startOPAServer runs opa with the modules on a free loopback port and returns the decision URL.
func startOPAServer(b *testing.B, opa string, modules []Module) string {
	b.Helper()
	dir := b.TempDir()
	// The engine adds the built-in library to a set that lacks it; the server needs it as a file.
	all := append([]Module{builtinModule(builtinLibraryFile)}, modules...)
	for _, m := range modules {
		if strings.Contains(m.Text, "package volumehealer.builtin\n") {
			all = modules
		}
	}
	for i, m := range all {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("m%d.rego", i)), []byte(m.Text), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(opa, "run", "--server", "--skip-version-check", "--addr", addr, "--log-level", "error", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("opa server on %s did not become healthy: %v\n%s", addr, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "http://" + addr + "/v1/data/volumehealer/decision"
}

func postDecision(b *testing.B, client *http.Client, url string, body []byte) Decision {
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("opa server answered %s: %v", resp.Status, err)
	}
	var d struct {
		Action   Action `json:"action"`
		Reason   string `json:"reason"`
		Timeout  string `json:"timeout"`
		Priority int    `json:"priority"`
	}
	if err := json.Unmarshal(out.Result, &d); err != nil {
		b.Fatalf("decoding %s: %v", out.Result, err)
	}
	dec := Decision{Action: d.Action, Reason: d.Reason, Priority: d.Priority}
	if d.Timeout != "" {
		if dec.Timeout, err = time.ParseDuration(d.Timeout); err != nil {
			b.Fatal(err)
		}
	}
	return dec
}
