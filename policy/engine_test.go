package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
)

// slowLoop is a condition that takes seconds to evaluate: 25 million iterations of a comprehension
// that collects nothing, so it costs time but no memory.
const slowLoop = `count([i | some i in numbers.range(1, 5000); some j in numbers.range(1, 5000); i * j < 0]) == 0`

func newTestEngine(t *testing.T, opts Options) (*Engine, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Metrics = NewMetrics(reg)
	opts.Compile = patient(opts.Compile)
	e, err := NewEngine(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return e, reg
}

// TestBadPoliciesNeverServe loads a good policy, then each kind of bad policy, and checks that the
// bad one is rejected with its kind, file and line, counted in the metric, and that the good one
// keeps deciding.
func TestBadPoliciesNeverServe(t *testing.T) {
	tests := map[string]struct {
		text     string
		kind     ErrorKind
		contains []string
	}{
		"parse error": {
			text:     policyText(`decision := {"action": "skip", "reason": "r"`),
			kind:     KindParse,
			contains: []string{"bad.rego:4", "rego_parse_error", "unexpected eof"},
		},
		"compile error: undefined function": {
			text:     policyText(`decision := {"action": "skip", "reason": no_such_function(1)}`),
			kind:     KindCompile,
			contains: []string{"bad.rego:3", "undefined function no_such_function"},
		},
		"compile error: unsafe variable": {
			text:     policyText(`decision := {"action": "skip", "reason": x} if {`, `	x != "a"`, `}`),
			kind:     KindCompile,
			contains: []string{"bad.rego:", "rego_unsafe_var_error", "var x is unsafe"},
		},
		"compile error: strict mode": {
			text:     policyText(`decision := {"action": "skip", "reason": "r"} if {`, `	unused := input.trigger`, `}`),
			kind:     KindCompile,
			contains: []string{"bad.rego:4", "unused"},
		},
		"runtime error: division by zero": {
			// The shared filesystem canned input has no mount options.
			text:     policyText(`decision := {"action": "skip", "reason": "r", "priority": 10 / count(input.volume.mountOptions)}`),
			kind:     KindRuntime,
			contains: []string{"bad.rego:3", "divide by zero"},
		},
		"conflicting outputs": {
			text: policyText(
				`decision := {"action": "skip", "reason": "everyone"}`,
				`decision := {"action": "probe", "reason": "restart"} if input.trigger == "restart"`),
			kind:     KindConflict,
			contains: []string{"bad.rego:", "eval_conflict_error"},
		},
		"wrong output type": {
			text:     policyText(`decision := "skip"`),
			kind:     KindInvalidOutput,
			contains: []string{`decision is string "skip"`},
		},
		"unknown action": {
			text:     policyText(`decision := {"action": "repair", "reason": "r"}`),
			kind:     KindInvalidOutput,
			contains: []string{`action "repair"`},
		},
		"unknown key": {
			text:     policyText(`decision := {"action": "skip", "reason": "r", "delay": "5s"}`),
			kind:     KindInvalidOutput,
			contains: []string{`unknown key "delay"`},
		},
		"several outputs as a set": {
			text:     policyText(`decision contains {"action": "skip", "reason": "r"}`),
			kind:     KindInvalidOutput,
			contains: []string{"decision is set"},
		},
		"undefined for some inputs": {
			text:     policyText(`decision := {"action": "probe", "reason": "r"} if input.trigger == "restart"`),
			kind:     KindUndefined,
			contains: []string{"schedule sweep", "default decision"},
		},
		"no decision rule": {
			text:     policyText(`allow := true`),
			kind:     KindUndefined,
			contains: []string{"no module defines it"},
		},
		"slow evaluation": {
			text:     policyText(`decision := {"action": "skip", "reason": "slow"} if {`, "\t"+slowLoop, `}`),
			kind:     KindTimeout,
			contains: []string{"timed out after 1s"},
		},
		"http.send": {
			text: policyText(`decision := {"action": "skip", "reason": r.body} if {`,
				`	r := http.send({"method": "GET", "url": "http://127.0.0.1:1/"})`, `}`),
			kind:     KindForbiddenBuiltin,
			contains: []string{"bad.rego:4", "http.send is not allowed", "sends HTTP requests"},
		},
		"net.lookup_ip_addr": {
			text: policyText(`decision := {"action": "skip", "reason": "r"} if {`,
				`	count(net.lookup_ip_addr("example.com")) > 0`, `}`),
			kind:     KindForbiddenBuiltin,
			contains: []string{"bad.rego:4", "net.lookup_ip_addr is not allowed"},
		},
		"opa.runtime environment": {
			text:     policyText(`decision := {"action": "skip", "reason": opa.runtime().env.HOME}`),
			kind:     KindForbiddenBuiltin,
			contains: []string{"bad.rego:3", "opa.runtime is not allowed", "environment"},
		},
		"file access through a schema reference": {
			text: policyText(`decision := {"action": "skip", "reason": "r"} if {`,
				`	json.match_schema({}, {"$ref": "file:///etc/hostname"})[0]`, `}`),
			kind:     KindForbiddenBuiltin,
			contains: []string{"bad.rego:4", "json.match_schema is not allowed", "reads files"},
		},
	}
	ctx := context.Background()
	good := policyText(`decision := {"action": "probe", "reason": "GoodPolicy"}`)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// Far above what the good policy needs even on a loaded machine, far below the slow loop.
			e, reg := newTestEngine(t, Options{Compile: CompileOptions{EvalTimeout: time.Second}})
			serving, err := e.Load(ctx, []Module{{File: "good.rego", Text: good}})
			if err != nil {
				t.Fatal(err)
			}

			start := time.Now()
			rev, err := e.Load(ctx, []Module{{File: "bad.rego", Text: tc.text}})
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("rejecting took %v", took)
			}
			if rev != nil || err == nil {
				t.Fatalf("bad policy loaded as revision %v", rev)
			}
			t.Log(err)
			var le *LoadError
			if !errors.As(err, &le) || !errors.Is(err, ErrRejected) {
				t.Fatalf("error %T %v, want a *LoadError", err, err)
			}
			if le.Kind != tc.kind {
				t.Errorf("kind %s, want %s: %v", le.Kind, tc.kind, err)
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not mention %q: %v", s, err)
				}
			}
			if tc.kind != KindUndefined && !slices.Contains(le.Files, "bad.rego") {
				t.Errorf("error blames %v, want bad.rego", le.Files)
			}

			if got := e.Revision(); got != serving {
				t.Errorf("serving revision %s, want %s", got.ID(), serving.ID())
			}
			in := sampleInput()
			d, err := e.Decide(ctx, &in)
			if err != nil || d.Reason != "GoodPolicy" {
				t.Errorf("after the rejection the engine decided %+v, %v; want the good policy's decision", d, err)
			}
			if v := metricValue(t, reg, "volume_healer_policy_load_errors_total", map[string]string{"reason": string(tc.kind)}); v != 1 {
				t.Errorf("load errors{reason=%s} = %v, want 1", tc.kind, v)
			}
			if v := metricValue(t, reg, "volume_healer_policy_revision_info", map[string]string{"revision": serving.ID()}); v != 1 {
				t.Errorf("revision_info{revision=%s} = %v, want 1", serving.ID(), v)
			}
		})
	}
}

// TestForbiddenBuiltinsAreMissingFromCapabilities checks the second line of defence: without the
// engine's early check, the compiler itself does not know the forbidden functions.
func TestForbiddenBuiltinsAreMissingFromCapabilities(t *testing.T) {
	calls := map[string]string{
		"http.send":          `http.send({"method": "GET", "url": "http://127.0.0.1:1/"})`,
		"net.lookup_ip_addr": `net.lookup_ip_addr("example.com")`,
		"opa.runtime":        `opa.runtime()`,
		"json.match_schema":  `json.match_schema({}, {})`,
		"json.verify_schema": `json.verify_schema({})`,
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if capabilities().ContainsBuiltin(name) {
				t.Fatalf("capabilities contain %s", name)
			}
			mod := ast.MustParseModule(policyText("x := " + call))
			c := newCompiler()
			if c.Compile(map[string]*ast.Module{"m.rego": mod}); !c.Failed() || !strings.Contains(c.Errors.Error(), "undefined function "+name) {
				t.Fatalf("compiling a call of %s: %v, want undefined function", name, c.Errors)
			}
		})
	}
	if len(calls) != len(forbiddenBuiltins) {
		t.Errorf("%d forbidden builtins, %d tested", len(forbiddenBuiltins), len(calls))
	}
}

// TestEvaluationTimeout checks that an evaluation that runs long for one volume is cut off at the
// timeout, reported as such, and does not disturb other decisions.
func TestEvaluationTimeout(t *testing.T) {
	ctx := context.Background()
	e, reg := newTestEngine(t, Options{Compile: CompileOptions{EvalTimeout: time.Second}})
	_, err := e.Load(ctx, []Module{{File: "slow.rego", Text: policyText(
		`default decision := {"action": "skip", "reason": "Fast"}`,
		`decision := {"action": "skip", "reason": "Slow"} if {`,
		`	input.volume.pv == "pvc-slow"`,
		"\t"+slowLoop,
		`}`,
	)}})
	if err != nil {
		t.Fatalf("a policy slow only for one volume must pass validation: %v", err)
	}
	slow := sampleInput()
	slow.Volume.PV = "pvc-slow"
	start := time.Now()
	_, err = e.Decide(ctx, &slow)
	took := time.Since(start)
	if !errors.Is(err, ErrEvaluationTimeout) {
		t.Fatalf("slow decision: %v, want ErrEvaluationTimeout", err)
	}
	if took > 5*time.Second {
		t.Errorf("the slow evaluation was stopped after %v, want about 1s", took)
	}
	fast := sampleInput()
	if d, err := e.Decide(ctx, &fast); err != nil || d.Reason != "Fast" {
		t.Errorf("fast decision: %+v, %v", d, err)
	}
	if v := metricValue(t, reg, "volume_healer_policy_evaluation_errors_total", map[string]string{"reason": "timeout"}); v != 1 {
		t.Errorf("evaluation errors{reason=timeout} = %v, want 1", v)
	}

	// The caller's deadline counts too.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := e.Decide(short, &slow); !errors.Is(err, ErrEvaluationTimeout) {
		t.Errorf("slow decision under a 10ms context: %v", err)
	}
}

// TestRuntimeErrorsAreReportedPerDecision checks errors that only some inputs trigger.
func TestRuntimeErrorsAreReportedPerDecision(t *testing.T) {
	ctx := context.Background()
	rev := mustCompile(t, "p.rego", policyText(
		`default decision := {"action": "skip", "reason": "r"}`,
		`decision := {"action": "heal", "reason": "a"} if input.volume.pv == "pvc-conflict"`,
		`decision := {"action": "skip", "reason": "b"} if input.volume.pv == "pvc-conflict"`,
		`decision := {"action": "skip", "reason": "r", "priority": 1 / 0} if input.volume.pv == "pvc-divide"`,
	), patient(CompileOptions{}))
	tests := map[string]struct {
		pv   string
		want error
		kind ErrorKind
	}{
		"conflict":         {pv: "pvc-conflict", want: ErrConflict, kind: KindConflict},
		"division by zero": {pv: "pvc-divide", kind: KindRuntime},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := sampleInput()
			in.Volume.PV = tc.pv
			for range 2 { // errors are not memoized
				_, err := rev.Decide(ctx, &in)
				var ee *EvalError
				if !errors.As(err, &ee) || ee.Kind != tc.kind || (tc.want != nil && !errors.Is(err, tc.want)) {
					t.Fatalf("Decide: %v, want a %s error", err, tc.kind)
				}
				if !strings.Contains(err.Error(), "p.rego:") {
					t.Errorf("error does not say where: %v", err)
				}
			}
		})
	}
}

// TestRevisionSwapsUnderConcurrentEvaluation swaps two good revisions (and offers a bad one) while
// many goroutines decide; every decision must come whole from one of the good revisions.
func TestRevisionSwapsUnderConcurrentEvaluation(t *testing.T) {
	ctx := context.Background()
	e, reg := newTestEngine(t, Options{})
	policies := map[string][]Module{
		"A": {{File: "a.rego", Text: policyText(
			`default decision := {"action": "skip", "reason": "A"}`,
			`decision := {"action": "probe", "reason": "A", "priority": 1} if input.driver.healer.probe`)}},
		"B": {{File: "b.rego", Text: policyText(
			`default decision := {"action": "skip", "reason": "B"}`,
			`decision := {"action": "heal", "reason": "B", "priority": 2} if input.trigger == "restart"`)}},
	}
	bad := []Module{{File: "c.rego", Text: policyText(`decision := "C"`)}}
	if _, err := e.Load(ctx, policies["A"]); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				in := randomInput(r)
				d, err := e.Decide(ctx, &in)
				if err != nil {
					t.Errorf("Decide during swaps: %v", err)
					return
				}
				ok := d.Reason == "A" && (d == Decision{Action: ActionSkip, Reason: "A"} || d == Decision{Action: ActionProbe, Reason: "A", Priority: 1}) ||
					d.Reason == "B" && (d == Decision{Action: ActionSkip, Reason: "B"} || d == Decision{Action: ActionHeal, Reason: "B", Priority: 2})
				if !ok {
					t.Errorf("decision %+v is from neither revision", d)
					return
				}
				mu.Lock()
				seen[d.Reason]++
				mu.Unlock()
			}
		})
	}
	for i := range 40 {
		name := []string{"B", "A"}[i%2]
		if _, err := e.Load(ctx, policies[name]); err != nil {
			t.Fatalf("loading %s: %v", name, err)
		}
		if _, err := e.Load(ctx, bad); !errors.Is(err, ErrRejected) {
			t.Fatalf("loading the bad policy: %v", err)
		}
		time.Sleep(time.Millisecond) // let the deciders see this revision
	}
	close(stop)
	wg.Wait()
	if seen["A"] == 0 || seen["B"] == 0 {
		t.Errorf("decisions seen %v, want both revisions to have served", seen)
	}
	if v := metricValue(t, reg, "volume_healer_policy_load_errors_total", map[string]string{"reason": "invalid_output"}); v != 40 {
		t.Errorf("load errors = %v, want 40", v)
	}
}

func TestLoadingTheServingSetAgainIsANoOp(t *testing.T) {
	ctx := context.Background()
	e, _ := newTestEngine(t, Options{})
	before := e.Revision()
	again, err := e.LoadDefault(ctx)
	if err != nil || again != before {
		t.Fatalf("reloading the default: %v, %v; want the same revision", again, err)
	}
}

func TestMetricsAreExposed(t *testing.T) {
	ctx := context.Background()
	e, reg := newTestEngine(t, Options{})
	in := sampleInput()
	for range 3 {
		if _, err := e.Decide(ctx, &in); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]float64{
		"volume_healer_policy_evaluation_duration_seconds": 3,
		"volume_healer_policy_decisions_total":             3, // action=probe
		"volume_healer_policy_memo_lookups_total":          2, // result=hit
		"volume_healer_policy_revision_info":               1,
		"volume_healer_policy_load_errors_total":           0, // reason=parse
		"volume_healer_policy_evaluation_errors_total":     0, // reason=runtime
	}
	labels := map[string]map[string]string{
		"volume_healer_policy_decisions_total":         {"action": "probe"},
		"volume_healer_policy_memo_lookups_total":      {"result": "hit"},
		"volume_healer_policy_revision_info":           {"revision": e.Revision().ID()},
		"volume_healer_policy_load_errors_total":       {"reason": "parse"},
		"volume_healer_policy_evaluation_errors_total": {"reason": "runtime"},
	}
	for name, v := range want {
		if got := metricValue(t, reg, name, labels[name]); got != v {
			t.Errorf("%s%v = %v, want %v", name, labels[name], got, v)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("registering the metrics twice on one registry succeeded")
			}
		}()
		NewMetrics(reg)
	}()
}

func TestLoadFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("b.rego", "package b\n")
	write("sub/a.rego", "package a\n")
	write("notes.md", "not a policy")
	mods, err := LoadFiles(dir, filepath.Join(dir, "b.rego"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, m := range mods {
		files = append(files, strings.TrimPrefix(m.File, dir+"/"))
	}
	if want := []string{"b.rego", "sub/a.rego"}; !slices.Equal(files, want) {
		t.Errorf("loaded %v, want %v", files, want)
	}
	if _, err := LoadFiles(filepath.Join(dir, "sub", "..", "missing")); err == nil {
		t.Error("loading a missing path succeeded")
	}
	empty := t.TempDir()
	if _, err := LoadFiles(empty); !errors.Is(err, ErrNoModules) {
		t.Errorf("loading an empty folder: %v, want ErrNoModules", err)
	}
}

func TestBuiltinLibraryCanBeReplaced(t *testing.T) {
	ctx := context.Background()
	lib := Module{File: "lib.rego", Text: "package volumehealer.builtin\n\ndecision := {\"action\": \"skip\", \"reason\": \"MyLibrary\"}\n"}
	rev, err := Compile(ctx, []Module{builtinModule(builtinEntryFile), lib}, patient(CompileOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	in := sampleInput()
	if d, err := rev.Decide(ctx, &in); err != nil || d.Reason != "MyLibrary" {
		t.Fatalf("decision %+v, %v; want the replacement library's", d, err)
	}
	if got := fmt.Sprint(rev.Files()); got != "[builtin:default/decision.rego lib.rego]" {
		t.Errorf("files %s", got)
	}
}

// TestRejectedGaugeFollowsTheNewestSet checks the gauge an alert relies on: it stays 1 as long as
// the newest policy set is bad, however long that is, and drops when a set loads again, including
// a set fixed back to the one serving.
func TestRejectedGaugeFollowsTheNewestSet(t *testing.T) {
	ctx := context.Background()
	e, reg := newTestEngine(t, Options{})
	good := []Module{{File: "site/good.rego", Text: "package volumehealer\n\ndecision := data.volumehealer.builtin.decision\n"}}
	bad := []Module{{File: "site/bad.rego", Text: "package volumehealer\n\ndecision := {\n"}}
	steps := []struct {
		modules []Module
		want    float64
	}{{good, 0}, {bad, 1}, {bad, 1}, {good, 0}}
	for i, s := range steps {
		_, _ = e.Load(ctx, s.modules)
		if got := metricValue(t, reg, "volume_healer_policy_rejected", nil); got != s.want {
			t.Fatalf("step %d: volume_healer_policy_rejected = %v, want %v", i, got, s.want)
		}
	}
}
