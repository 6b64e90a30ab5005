package main

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// A Rule says which packages must not import which others. In a pattern "..." matches any string,
// as in the go command's patterns: "x/..." matches x and every package below it, and "x/.../y"
// matches x/y and every y below x. A pattern whose first
// element has no dot names packages of this module ("scheduler/...", "sidecar", and "..." for the
// whole module); any other is a full import path ("k8s.io/client-go/...").
type Rule struct {
	// Name identifies the rule in every violation; unique in the table.
	Name string
	// Packages are the packages the rule binds, less Except.
	Packages []string
	// Except are packages that Packages match and the rule does not bind.
	Except []string
	// Tests binds the packages' _test.go files too; without it a rule binds what the package
	// ships, and its tests may import what they need.
	Tests bool
	// Forbid are the packages a bound package must not import, less Allow.
	Forbid []string
	// Allow are packages that Forbid matches and a bound package may import.
	Allow []string
	// Direct limits the rule to a package's own imports. Without it the rule holds for everything
	// the package links: importing a package that imports a forbidden one is a violation too.
	Direct bool
	// Reason says why the rule exists; it is printed with every violation.
	Reason string
}

// A Package is one build of a package, as go list -deps -test describes it: the package's own
// files, or the package with its _test.go files.
type Package struct {
	// ID names the build uniquely: the import path, or for a test build "p [p.test]".
	ID string
	// Path is the import path of the package whose files are built, without a test build's
	// suffix.
	Path string
	// Of is the package whose rules bind this build: Path, or for a test build the package under
	// test. It is empty for builds that no rule binds: a package rebuilt for another's test, and a
	// test's generated main.
	Of string
	// Test is set for a build of Of's _test.go files (internal or external).
	Test bool
	// Module is the path of the module the package belongs to; empty for the standard library.
	Module string
	// Imports are the IDs of the builds it imports.
	Imports []string
}

// A Violation is one package importing, or linking, a package against one rule.
type Violation struct {
	Rule *Rule
	// Importer is the bound package, Test whether the import is in its tests.
	Importer string
	Test     bool
	// Imported is the forbidden package; Chain the imports that lead to it, Importer first.
	Imported string
	Chain    []string
}

func (v Violation) String(module string) string {
	var b strings.Builder
	importer := short(module, v.Importer)
	if v.Test {
		importer += " (tests)"
	}
	fmt.Fprintf(&b, "%s imports %s", importer, short(module, v.Imported))
	if len(v.Chain) > 2 {
		names := make([]string, len(v.Chain))
		for i, p := range v.Chain {
			names[i] = short(module, p)
		}
		fmt.Fprintf(&b, " (through %s)", strings.Join(names, " -> "))
	}
	fmt.Fprintf(&b, ", against rule %q: %s", v.Rule.Name, v.Rule.Reason)
	return b.String()
}

// short names a package of the module by its path in the module, and any other by its import path.
func short(module, path string) string {
	if rel, ok := strings.CutPrefix(path, module+"/"); ok {
		return rel
	}
	return path
}

// A matcher matches import paths against a rule's patterns.
type matcher []*regexp.Regexp

func newMatcher(module string, patterns []string) matcher {
	m := make(matcher, len(patterns))
	for i, p := range patterns {
		m[i] = patternRegexp(module, p)
	}
	return m
}

func (m matcher) match(path string) bool {
	for _, re := range m {
		if re.MatchString(path) {
			return true
		}
	}
	return false
}

// patternRegexp turns a pattern into a regular expression over full import paths.
func patternRegexp(module, pattern string) *regexp.Regexp {
	full := pattern
	if first, _, _ := strings.Cut(pattern, "/"); !strings.Contains(strings.ReplaceAll(first, "...", ""), ".") {
		full = module + "/" + pattern
	}
	expr := regexp.QuoteMeta(full)
	// "x/..." matches x itself as well as what is below it.
	if rest, ok := strings.CutSuffix(expr, `/\.\.\.`); ok {
		expr = rest + `(/.*)?`
	}
	// "x/.../y" matches x/y as well as x/a/b/y.
	expr = strings.ReplaceAll(expr, `/\.\.\./`, `(/|/.*/)`)
	expr = strings.ReplaceAll(expr, `\.\.\.`, `.*`)
	return regexp.MustCompile(`^` + expr + `$`)
}

// binds reports whether rule r binds the build p.
func (r *Rule) binds(module string, p Package) bool {
	if p.Of == "" || (p.Test && !r.Tests) {
		return false
	}
	return newMatcher(module, r.Packages).match(p.Of) && !newMatcher(module, r.Except).match(p.Of)
}

// Check returns every violation of rules in the import graph pkgs of module, ordered by importer,
// rule and imported package. A forbidden package is reported once per importer and rule, by the
// shortest chain that reaches it, and what it imports itself is not followed further.
func Check(module string, pkgs []Package, rules []Rule) []Violation {
	byID := make(map[string]Package, len(pkgs))
	for _, p := range pkgs {
		byID[p.ID] = p
	}
	// A package's own build before its test build, so that a violation in its own files is
	// reported without "(tests)".
	order := make([]Package, len(pkgs))
	copy(order, pkgs)
	sort.SliceStable(order, func(i, j int) bool { return !order[i].Test && order[j].Test })

	var out []Violation
	for i := range rules {
		r := &rules[i]
		forbid, allow := newMatcher(module, r.Forbid), newMatcher(module, r.Allow)
		forbidden := func(path string) bool { return forbid.match(path) && !allow.match(path) }
		reported := map[[2]string]bool{}
		for _, p := range order {
			if !r.binds(module, p) {
				continue
			}
			for _, v := range reach(byID, p, r.Direct, forbidden) {
				key := [2]string{p.Of, v.Imported}
				if reported[key] {
					continue
				}
				reported[key] = true
				v.Rule = r
				out = append(out, v)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Importer != b.Importer {
			return a.Importer < b.Importer
		}
		if a.Test != b.Test {
			return !a.Test
		}
		if a.Rule.Name != b.Rule.Name {
			return a.Rule.Name < b.Rule.Name
		}
		return a.Imported < b.Imported
	})
	return out
}

// reach walks the imports of from, breadth first so that each chain is a shortest one, and returns
// a violation for each forbidden package it meets. With direct it looks at from's own imports only.
func reach(byID map[string]Package, from Package, direct bool, forbidden func(string) bool) []Violation {
	type step struct {
		id     string
		parent int
	}
	steps := []step{{id: from.ID, parent: -1}}
	seen := map[string]bool{from.ID: true}
	chain := func(i int) []string {
		var c []string
		for ; i >= 0; i = steps[i].parent {
			c = append(c, pathOf(byID, steps[i].id))
		}
		for l, r := 0, len(c)-1; l < r; l, r = l+1, r-1 {
			c[l], c[r] = c[r], c[l]
		}
		c[0] = from.Of
		return c
	}
	var out []Violation
	for i := 0; i < len(steps); i++ {
		if i > 0 && direct {
			break
		}
		for _, id := range byID[steps[i].id].Imports {
			if seen[id] {
				continue
			}
			seen[id] = true
			path := pathOf(byID, id)
			if path == from.Of {
				// An external test imports the package it tests.
				continue
			}
			steps = append(steps, step{id: id, parent: i})
			if forbidden(path) {
				out = append(out, Violation{Importer: from.Of, Test: from.Test, Imported: path, Chain: chain(len(steps) - 1)})
				// Not followed: what a forbidden package imports is its own business.
				steps = steps[:len(steps)-1]
			}
		}
	}
	return out
}

// pathOf is the import path of the build id, also for an id the graph does not describe.
func pathOf(byID map[string]Package, id string) string {
	if p, ok := byID[id]; ok {
		return p.Path
	}
	path, _, _ := strings.Cut(id, " ")
	return path
}

// Unmatched returns, for every pattern of rules that matches no package of pkgs, a line naming the
// rule and the pattern: a rule whose package was moved or removed would otherwise check nothing.
// Packages patterns must bind a build; the others must match any package of the graph.
func Unmatched(module string, pkgs []Package, rules []Rule) []string {
	var out []string
	for _, r := range rules {
		fields := []struct {
			name     string
			patterns []string
			bound    bool
		}{
			{"Packages", r.Packages, true},
			{"Except", r.Except, true},
			{"Forbid", r.Forbid, false},
			{"Allow", r.Allow, false},
		}
		for _, f := range fields {
			for _, pattern := range f.patterns {
				re := patternRegexp(module, pattern)
				found := false
				for _, p := range pkgs {
					path := p.Path
					if f.bound {
						path = p.Of
					}
					if path != "" && re.MatchString(path) {
						found = true
						break
					}
				}
				if !found {
					out = append(out, fmt.Sprintf("rule %q: %s pattern %q matches no package: update the rule to where the package went", r.Name, f.name, pattern))
				}
			}
		}
	}
	return out
}
