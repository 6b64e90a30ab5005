package policy

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestDefaultPolicyRegoTests(t *testing.T) {
	results, err := RunTests(context.Background(), DefaultTestModules(), TestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Outcome != OutcomePass {
			t.Errorf("%s", r)
		}
	}
	if err := CheckTests(results); err != nil || len(results) < 13 {
		t.Errorf("%d tests: %v", len(results), err)
	}
}

// exampleDirs lists the documented example policies.
func exampleDirs(t testing.TB) []string {
	t.Helper()
	dirs, err := filepath.Glob("testdata/examples/*")
	if err != nil || len(dirs) != 6 {
		t.Fatalf("example folders %v, %v; want the six of docs/policy.md", dirs, err)
	}
	return dirs
}

// TestDocumentedExamples keeps the examples of docs/policy.md honest: each passes its Rego tests
// through the engine's loader and is accepted as a serving policy.
func TestDocumentedExamples(t *testing.T) {
	ctx := context.Background()
	memoized := map[string]bool{"userspace-mounters": true, "skip-namespace": true, "hourly-probe": false,
		"evict-except-namespace": true, "never-evict-statefulsets": true, "maintenance-window": true}
	for _, dir := range exampleDirs(t) {
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			mods, err := LoadFiles(dir)
			if err != nil {
				t.Fatal(err)
			}
			results, err := RunTests(ctx, mods, TestOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range results {
				if r.Outcome != OutcomePass {
					t.Errorf("%s", r)
				}
			}
			if err := CheckTests(results); err != nil {
				t.Error(err)
			}
			policyOnly, err := LoadFiles(filepath.Join(dir, "policy.rego"))
			if err != nil {
				t.Fatal(err)
			}
			rev, err := Compile(ctx, policyOnly, patient(CompileOptions{}))
			if err != nil {
				t.Fatalf("the example is rejected as a policy: %v", err)
			}
			if on, why := rev.Memoized(); on != memoized[name] {
				t.Errorf("memoized %t (%s), docs/policy.md says %t", on, why, memoized[name])
			}
		})
	}
}

// TestDocsShowTheExamples keeps docs/policy.md in step with the tested example policies.
func TestDocsShowTheExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/policy.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range exampleDirs(t) {
		text, err := os.ReadFile(filepath.Join(dir, "policy.rego"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), "```rego\n"+string(text)+"```\n") {
			t.Errorf("docs/policy.md does not show %s/policy.rego as it is", dir)
		}
	}
	entry := builtinModule(builtinEntryFile).Text
	body := entry[strings.Index(entry, "package volumehealer"):]
	if !strings.Contains(string(doc), "```rego\n"+body+"```\n") {
		t.Errorf("docs/policy.md does not show %s as it is", builtinEntryFile)
	}
}

func TestRunTestsReportsEveryOutcome(t *testing.T) {
	mods := []Module{
		{File: "p.rego", Text: policyText(`decision := {"action": "skip", "reason": "r"}`)},
		{File: "p_test.rego", Text: `package volumehealer_test

import data.volumehealer

test_passes if volumehealer.decision.action == "skip"

test_fails if volumehealer.decision.action == "heal"

test_errs if 1 / 0 == 1

todo_test_later if false
`},
	}
	results, err := RunTests(context.Background(), mods, TestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Outcome{}
	for _, r := range results {
		got[strings.TrimPrefix(r.Name, "data.volumehealer_test.")] = r.Outcome
		if line := r.String(); !strings.Contains(line, "p_test.rego:") || strings.Contains(line, "\n") {
			t.Errorf("result line %q", line)
		}
	}
	want := map[string]Outcome{"test_passes": OutcomePass, "test_fails": OutcomeFail, "test_errs": OutcomeError, "todo_test_later": OutcomeSkip}
	for name, o := range want {
		if got[name] != o {
			t.Errorf("%s: %s, want %s", name, got[name], o)
		}
	}
	if err := CheckTests(results); !errors.Is(err, ErrTestsFailed) || !strings.Contains(err.Error(), "2 of 4") {
		t.Errorf("CheckTests: %v", err)
	}

	only, err := RunTests(context.Background(), mods, TestOptions{Run: "passes"})
	if err != nil || len(only) != 1 || CheckTests(only) != nil {
		t.Errorf("filtered run: %v, %v", only, err)
	}
	if err := CheckTests(nil); !errors.Is(err, ErrNoTests) {
		t.Errorf("no tests: %v", err)
	}
	bad := append(mods, Module{File: "bad_test.rego", Text: "package x\n\ntest_x if http.send({})\n"})
	if _, err := RunTests(context.Background(), bad, TestOptions{}); !errors.Is(err, ErrRejected) {
		t.Errorf("tests calling http.send: %v, want them rejected like the policy would be", err)
	}
}

// opaBinary builds the real opa with hack/opa.sh, or returns why it could not.
func opaBinary() (string, error) {
	cmd := exec.Command("../hack/opa.sh")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// TestRealOPAAgrees runs the real `opa test`, built from the module go.mod requires, on the
// built-in policy, the documented examples and the library of examples/.
func TestRealOPAAgrees(t *testing.T) {
	if testing.Short() {
		t.Skip("builds opa from source, which takes minutes the first time; run without -short")
	}
	opa, err := opaBinary()
	if err != nil {
		t.Fatalf("building opa with hack/opa.sh: %v", err)
	}
	runs := map[string][]string{"builtin default": {"default"}}
	for _, dir := range exampleDirs(t) {
		runs["example "+filepath.Base(dir)] = []string{"default/default.rego", dir}
	}
	for _, name := range libraryExamples {
		runs["library "+name] = []string{"default/default.rego", filepath.Join("examples", name)}
	}
	for name, paths := range runs {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(opa, append([]string{"test", "--v1-compatible"}, paths...)...)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "PASS: ") || strings.Contains(string(out), "FAIL") {
				t.Fatalf("opa test %v: %v\n%s", paths, err, out)
			}
			t.Logf("opa test %v: %s", paths, strings.TrimSpace(string(out)))
		})
	}
}
