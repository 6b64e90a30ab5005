package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const testModule = "example.com/m"

// pkg is a package of the test module (or, with a dot in its first element, another module's)
// built from its own files.
func pkg(path string, imports ...string) Package {
	full := func(p string) string {
		if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
			return p
		}
		return testModule + "/" + p
	}
	p := Package{ID: full(path), Path: full(path), Of: full(path)}
	for _, i := range imports {
		p.Imports = append(p.Imports, full(i))
	}
	return p
}

// testBuild is the build of path's tests, which import what its own files do and imports.
func testBuild(path string, own Package, imports ...string) Package {
	p := pkg(path, imports...)
	p.ID = own.Path + " [" + own.Path + ".test]"
	p.Test = true
	p.Imports = append(slices.Clone(own.Imports), p.Imports...)
	return p
}

func violations(pkgs []Package, rules ...Rule) []string {
	var out []string
	for _, v := range Check(testModule, pkgs, rules) {
		out = append(out, v.String(testModule))
	}
	return out
}

func TestCheck(t *testing.T) {
	sidecar := pkg("sidecar", "config")
	harnessUser := pkg("healer", "policy")
	tests := map[string]struct {
		pkgs []Package
		rule Rule
		want []string
	}{
		"a package linking a forbidden one through another names the chain and the rule": {
			pkgs: []Package{
				pkg("cmd/sidecar", "sidecar"), sidecar,
				pkg("config", "policy"), pkg("policy", "github.com/open-policy-agent/opa/rego"),
				pkg("github.com/open-policy-agent/opa/rego"),
			},
			rule: Rule{Name: "no-policy", Packages: []string{"sidecar", "cmd/..."}, Forbid: []string{"policy/...", "github.com/open-policy-agent/..."}, Reason: "the node side carries no policy engine"},
			// OPA is reached only through policy, which is reported already.
			want: []string{
				`cmd/sidecar imports policy (through cmd/sidecar -> sidecar -> config -> policy), against rule "no-policy": the node side carries no policy engine`,
				`sidecar imports policy (through sidecar -> config -> policy), against rule "no-policy": the node side carries no policy engine`,
			},
		},
		"a forbidden package reached directly and through another is reported once, directly": {
			pkgs: []Package{pkg("a", "b", "c"), pkg("b", "c"), pkg("c")},
			rule: Rule{Name: "r", Packages: []string{"a"}, Forbid: []string{"c"}, Reason: "why"},
			want: []string{`a imports c, against rule "r": why`},
		},
		"a direct rule looks only at the package's own imports": {
			pkgs: []Package{pkg("test/demo", "healer"), pkg("healer", "scheduler"), pkg("scheduler")},
			rule: Rule{Name: "r", Packages: []string{"test/demo"}, Direct: true, Forbid: []string{"scheduler/..."}, Reason: "why"},
		},
		"a direct rule reports an import of the package itself": {
			pkgs: []Package{pkg("test/demo", "scheduler/trigger"), pkg("scheduler/trigger")},
			rule: Rule{Name: "r", Packages: []string{"test/demo"}, Direct: true, Forbid: []string{"scheduler/..."}, Reason: "why"},
			want: []string{`test/demo imports scheduler/trigger, against rule "r": why`},
		},
		"an allowed package may be imported": {
			pkgs: []Package{pkg("config", "api/annotations", "api/other"), pkg("api/annotations"), pkg("api/other")},
			rule: Rule{Name: "r", Packages: []string{"config"}, Forbid: []string{"..."}, Allow: []string{"api/annotations"}, Reason: "why"},
			want: []string{`config imports api/other, against rule "r": why`},
		},
		"an excepted package is not bound": {
			pkgs: []Package{pkg("cmd/x", "cmd/y"), pkg("cmd/y"), pkg("test/e2e", "cmd/y")},
			rule: Rule{Name: "r", Packages: []string{"..."}, Except: []string{"cmd/..."}, Forbid: []string{"cmd/..."}, Reason: "why"},
			want: []string{`test/e2e imports cmd/y, against rule "r": why`},
		},
		"tests are free unless the rule binds them": {
			pkgs: []Package{harnessUser, testBuild("healer", harnessUser, "test/harness"), pkg("policy"), pkg("test/harness")},
			rule: Rule{Name: "r", Packages: []string{"healer"}, Forbid: []string{"test/..."}, Reason: "why"},
		},
		"a rule with Tests binds the tests": {
			pkgs: []Package{harnessUser, testBuild("healer", harnessUser, "test/harness"), pkg("policy"), pkg("test/harness")},
			rule: Rule{Name: "r", Packages: []string{"healer"}, Tests: true, Forbid: []string{"test/..."}, Reason: "why"},
			want: []string{`healer (tests) imports test/harness, against rule "r": why`},
		},
		"a violation in a package's own files is not reported again for its tests": {
			pkgs: []Package{harnessUser, testBuild("healer", harnessUser), pkg("policy")},
			rule: Rule{Name: "r", Packages: []string{"healer"}, Tests: true, Forbid: []string{"policy"}, Reason: "why"},
			want: []string{`healer imports policy, against rule "r": why`},
		},
		"an external test importing the package it tests is no violation": {
			pkgs: func() []Package {
				x := pkg("healer_test", "healer")
				x.ID, x.Of, x.Test = testModule+"/healer_test ["+testModule+"/healer.test]", testModule+"/healer", true
				return []Package{pkg("healer"), x}
			}(),
			rule: Rule{Name: "r", Packages: []string{"healer"}, Tests: true, Forbid: []string{"..."}, Reason: "why"},
		},
		"a package rebuilt for another's test binds no rule": {
			pkgs: func() []Package {
				v := pkg("probe", "test/harness")
				v.ID, v.Of = testModule+"/probe ["+testModule+"/healer.test]", ""
				return []Package{v, pkg("test/harness")}
			}(),
			rule: Rule{Name: "r", Packages: []string{"probe"}, Tests: true, Forbid: []string{"test/..."}, Reason: "why"},
		},
		"a wildcard in the middle matches zero or more elements": {
			pkgs: []Package{pkg("refdriver/mounter", "refdriver/plugin"), pkg("refdriver/x/mounter", "driverkit"), pkg("refdriver/plugin"), pkg("driverkit")},
			rule: Rule{Name: "r", Packages: []string{"refdriver/.../mounter"}, Forbid: []string{"refdriver/...", "driverkit/..."}, Reason: "why"},
			want: []string{
				`refdriver/mounter imports refdriver/plugin, against rule "r": why`,
				`refdriver/x/mounter imports driverkit, against rule "r": why`,
			},
		},
		"x/... does not match a package that only shares the prefix": {
			pkgs: []Package{pkg("a", "policyx"), pkg("policyx")},
			rule: Rule{Name: "r", Packages: []string{"a"}, Forbid: []string{"policy/..."}, Reason: "why"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := violations(tc.pkgs, tc.rule)
			if !slices.Equal(got, tc.want) {
				t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestUnmatched(t *testing.T) {
	pkgs := []Package{pkg("sidecar", "policy"), pkg("policy")}
	rules := []Rule{
		{Name: "fine", Packages: []string{"sidecar"}, Forbid: []string{"policy"}},
		{Name: "moved", Packages: []string{"refdriver/driver"}, Forbid: []string{"scheduler/..."}, Allow: []string{"policy"}},
	}
	got := Unmatched(testModule, pkgs, rules)
	want := []string{
		`rule "moved": Packages pattern "refdriver/driver" matches no package: update the rule to where the package went`,
		`rule "moved": Forbid pattern "scheduler/..." matches no package: update the rule to where the package went`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("Unmatched:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRunOnAModule checks a module on disk through the go command: a package importing across a
// rule, in its own files and in its external test, fails, and go list's test builds are told apart.
func TestRunOnAModule(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod":                "module " + testModule + "\n\ngo 1.22\n",
		"lib/lib.go":            "package lib\n\nimport _ \"" + testModule + "/stage\"\n",
		"lib/lib_test.go":       "package lib_test\n\nimport _ \"" + testModule + "/test/harness\"\n",
		"stage/stage.go":        "package stage\n",
		"test/harness/h.go":     "package harness\n\nimport _ \"" + testModule + "/lib\"\n",
		"cmd/prog/main.go":      "package main\n\nimport _ \"" + testModule + "/lib\"\n\nfunc main() {}\n",
		"cmd/prog/main_test.go": "package main\n\nimport \"testing\"\n\nfunc TestX(*testing.T) {}\n",
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rules := []Rule{
		{Name: "lib-is-a-leaf", Packages: []string{"lib"}, Forbid: []string{"stage"}, Reason: "lib stands alone"},
		{Name: "programs-ship-no-tests", Packages: []string{"cmd/...", "lib"}, Tests: true, Forbid: []string{"test/..."}, Reason: "tests stay out"},
		{Name: "stale", Packages: []string{"gone"}, Forbid: []string{"stage"}, Reason: "the package moved"},
	}
	got, err := run(dir, rules, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`rule "stale": Packages pattern "gone" matches no package: update the rule to where the package went`,
		`lib imports stage, against rule "lib-is-a-leaf": lib stands alone`,
		`lib (tests) imports test/harness, against rule "programs-ship-no-tests": tests stay out`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("run:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRules checks the table itself: every rule can be named in a violation and says why.
func TestRules(t *testing.T) {
	names := map[string]bool{}
	for _, r := range rules {
		if r.Name == "" || names[r.Name] {
			t.Errorf("rule %q: names must be set and unique", r.Name)
		}
		names[r.Name] = true
		if len(r.Packages) == 0 || len(r.Forbid) == 0 || r.Reason == "" {
			t.Errorf("rule %q: a rule needs Packages, Forbid and a Reason", r.Name)
		}
	}
}
