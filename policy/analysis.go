package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// A decision is a pure function of the input fields the policy reads, as long as the policy calls
// no non-deterministic built-in function: the policy set has no data other than its rules, and
// every rule is deterministic. So two volumes that agree on those fields get the same decision,
// and the engine may remember decisions keyed by those fields' values. analyse finds the fields
// by walking every rule the decision can reach in the compiled modules.

// elemKind says what one step of an input path selects.
type elemKind uint8

const (
	elemKey   elemKind = iota // an object key
	elemIndex                 // an array index
	elemAny                   // every key or index: the policy iterates or uses a computed key
)

// pathElem is one step of an input path.
type pathElem struct {
	kind  elemKind
	key   string
	index int
}

// inputPath is a path below input, such as volume.attributes.mounter or probe.health[_].status.
type inputPath []pathElem

// String renders the path in Rego syntax.
func (p inputPath) String() string {
	var b strings.Builder
	b.WriteString("input")
	for _, e := range p {
		switch e.kind {
		case elemKey:
			if ast.IsVarCompatibleString(e.key) {
				b.WriteString("." + e.key)
			} else {
				b.WriteString("[" + strconv.Quote(e.key) + "]")
			}
		case elemIndex:
			b.WriteString("[" + strconv.Itoa(e.index) + "]")
		case elemAny:
			b.WriteString("[_]")
		}
	}
	return b.String()
}

// hasPrefix reports whether q is a prefix of p.
func (p inputPath) hasPrefix(q inputPath) bool {
	return len(q) <= len(p) && slices.Equal(p[:len(q)], q)
}

// keyPlan lists the input paths a revision's decisions depend on.
type keyPlan struct {
	paths []inputPath
}

// analyser walks the rules reachable from the decision.
type analyser struct {
	compiler *ast.Compiler
	seen     map[*ast.Rule]bool
	queue    []*ast.Rule
	paths    []inputPath
	reason   string // set when decisions cannot be memoized
}

// analyse returns the plan for memoizing decisions of the compiled policy, or nil and the reason
// why its decisions cannot be memoized.
func analyse(c *ast.Compiler, entry ast.Ref) (*keyPlan, string) {
	a := &analyser{compiler: c, seen: map[*ast.Rule]bool{}}
	a.addRules(c.GetRules(entry))
	for len(a.queue) > 0 && a.reason == "" {
		rule := a.queue[0]
		a.queue = a.queue[1:]
		a.walk(rule)
	}
	if a.reason != "" {
		return nil, a.reason
	}
	return &keyPlan{paths: minimize(a.paths)}, ""
}

func (a *analyser) addRules(rules []*ast.Rule) {
	for _, r := range rules {
		for n := r; n != nil; n = n.Else {
			if !a.seen[n] {
				a.seen[n] = true
				a.queue = append(a.queue, n)
			}
		}
	}
}

func (a *analyser) fail(format string, args ...any) {
	if a.reason == "" {
		a.reason = fmt.Sprintf(format, args...)
	}
}

func (a *analyser) walk(rule *ast.Rule) {
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		switch x := x.(type) {
		case ast.Var:
			// A bare root document: the policy handles input or data as a whole.
			if x.Equal(ast.InputRootDocument.Value) {
				a.fail("the policy reads input as a whole (%s)", location(rule))
			}
			if x.Equal(ast.DefaultRootDocument.Value) {
				a.addRules(a.compiler.GetRules(ast.DefaultRootRef))
			}
		case ast.Ref:
			switch {
			case x[0].Value.Compare(ast.InputRootDocument.Value) == 0:
				a.input(rule, x)
			case x[0].Value.Compare(ast.DefaultRootDocument.Value) == 0:
				// Rules reached through a computed key are covered by taking every rule below
				// the ground prefix.
				a.addRules(a.compiler.GetRules(x.GroundPrefix()))
			default:
				if b, ok := ast.BuiltinMap[x.String()]; ok && b.Nondeterministic {
					a.fail("the policy calls %s, whose result changes from call to call (%s)", x, location(rule))
				}
				return false
			}
			for _, t := range x[1:] {
				vis.Walk(t)
			}
			return true
		}
		return false
	})
	vis.Walk(rule.Head)
	vis.Walk(rule.Body)
}

// input records the path a ref below input reads: its leading keys and indexes, with computed
// keys as wildcards. What follows an element that is neither is covered by reading the prefix
// whole, which only makes the memo key finer.
func (a *analyser) input(rule *ast.Rule, ref ast.Ref) {
	var path inputPath
loop:
	for _, t := range ref[1:] {
		switch v := t.Value.(type) {
		case ast.String:
			path = append(path, pathElem{kind: elemKey, key: string(v)})
		case ast.Number:
			i, ok := v.Int()
			if !ok || i < 0 {
				break loop
			}
			path = append(path, pathElem{kind: elemIndex, index: i})
		case ast.Var, ast.Ref, ast.Call:
			path = append(path, pathElem{kind: elemAny})
		default:
			break loop
		}
	}
	for len(path) > 0 && path[len(path)-1].kind == elemAny {
		path = path[:len(path)-1]
	}
	switch {
	case len(path) == 0:
		a.fail("the policy reads input as a whole (%s)", location(rule))
		return
	case path[0].kind == elemAny:
		a.fail("the policy reads input through a computed top-level key (%s)", location(rule))
		return
	}
	a.paths = append(a.paths, path)
}

func location(rule *ast.Rule) string {
	if rule.Location == nil {
		return rule.Head.Ref().String()
	}
	return fmt.Sprintf("%s:%d", rule.Location.File, rule.Location.Row)
}

// minimize sorts the paths and drops those covered by a shorter one.
func minimize(paths []inputPath) []inputPath {
	slices.SortFunc(paths, func(p, q inputPath) int {
		if c := len(p) - len(q); c != 0 {
			return c
		}
		return strings.Compare(p.String(), q.String())
	})
	var out []inputPath
	for _, p := range paths {
		covered := slices.ContainsFunc(out, func(q inputPath) bool { return p.hasPrefix(q) })
		if !covered {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(p, q inputPath) int { return strings.Compare(p.String(), q.String()) })
	return out
}
