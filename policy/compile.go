package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"
)

const (
	// DecisionQuery is the document the controller evaluates.
	DecisionQuery = "data.volumehealer.decision"
	// BuiltinPackage is the package of the built-in policy. A policy set that defines it replaces
	// the built-in library; otherwise the library is added to every set.
	BuiltinPackage = "data.volumehealer.builtin"

	// DefaultEvalTimeout bounds one evaluation unless CompileOptions say otherwise.
	DefaultEvalTimeout = time.Second
	// DefaultMemoSize is how many decisions one revision remembers unless CompileOptions say
	// otherwise.
	DefaultMemoSize = 10000
)

// forbiddenBuiltins reach outside the controller process. They are removed from the compiler's
// capabilities, so a policy calling one is rejected at load time, and the engine reports which one
// with a reason before the compiler's generic "undefined function".
var forbiddenBuiltins = map[string]string{
	"http.send":          "it sends HTTP requests",
	"net.lookup_ip_addr": "it resolves names through DNS",
	"opa.runtime":        "it reads the process environment and configuration",
	"json.match_schema":  "it reads files and URLs named in a schema's $ref",
	"json.verify_schema": "it reads files and URLs named in a schema's $ref",
}

// allowedNondeterministic are the non-deterministic built-ins a policy may still call: the
// clock, which maintenance windows and "not probed within the hour" need (decisions of a policy
// that reads it are not memoized).
var allowedNondeterministic = map[string]bool{"time.now_ns": true}

// forbiddenReason says why a policy may not call the built-in name, or "" when it may. Besides the
// built-ins that reach outside the process, every non-deterministic one is refused (random
// numbers, UUIDs, signatures with fresh randomness, verification against the clock): a decision
// must be the same for the same input, or the same volume would be healed on one evaluation and
// left alone on the next, and validation on the canned inputs would prove nothing.
func forbiddenReason(name string) string {
	if why, ok := forbiddenBuiltins[name]; ok {
		return why + ", and a policy must not reach outside the controller"
	}
	if b, ok := ast.BuiltinMap[name]; ok && b.Nondeterministic && !allowedNondeterministic[name] {
		return "its result changes from call to call, and a policy must decide the same for the same input"
	}
	return ""
}

// CompileOptions tune how a revision is compiled and evaluated.
type CompileOptions struct {
	// EvalTimeout bounds one evaluation, including each validation run. Default DefaultEvalTimeout.
	EvalTimeout time.Duration
	// MemoSize is how many decisions the revision remembers, keyed by the input fields the policy
	// reads. Default DefaultMemoSize.
	MemoSize int
	// DisableMemo evaluates every decision. Default false: decisions are memoized whenever the
	// policy allows it (see docs/policy.md, "Performance").
	DisableMemo bool
}

func (o CompileOptions) withDefaults() CompileOptions {
	if o.EvalTimeout <= 0 {
		o.EvalTimeout = DefaultEvalTimeout
	}
	if o.MemoSize <= 0 {
		o.MemoSize = DefaultMemoSize
	}
	return o
}

// capabilities returns what a policy may use: everything this OPA version offers except the
// built-in functions that reach outside the process, and no network access for the compiler.
func capabilities() *ast.Capabilities {
	caps := ast.CapabilitiesForThisVersion()
	caps.Builtins = slices.DeleteFunc(slices.Clone(caps.Builtins), func(b *ast.Builtin) bool {
		return forbiddenReason(b.Name) != ""
	})
	caps.AllowNet = []string{}
	return caps
}

// newCompiler returns the compiler every policy goes through, in the engine and in the tests, so
// that `healerctl policy test` rejects what the controller would reject.
func newCompiler() *ast.Compiler {
	return ast.NewCompiler().
		WithCapabilities(capabilities()).
		WithStrict(true).
		WithEnablePrintStatements(false).
		WithDefaultRegoVersion(ast.RegoV1)
}

// parseModules parses the modules and checks for forbidden built-in calls. It adds the built-in
// library when no module defines BuiltinPackage.
func parseModules(modules []Module) ([]Module, map[string]*ast.Module, error) {
	if len(modules) == 0 {
		return nil, nil, &LoadError{Kind: KindCompile, Err: ErrNoModules}
	}
	parsed := make(map[string]*ast.Module, len(modules)+1)
	var errs ast.Errors
	var files []string
	for _, m := range modules {
		if _, dup := parsed[m.File]; dup {
			return nil, nil, &LoadError{Kind: KindCompile, Files: []string{m.File},
				Err: fmt.Errorf("two modules are named %s", m.File)}
		}
		mod, err := ast.ParseModuleWithOpts(m.File, m.Text, ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true})
		if err != nil {
			files = append(files, m.File)
			var astErrs ast.Errors
			if errors.As(err, &astErrs) {
				errs = append(errs, astErrs...)
			} else {
				errs = append(errs, ast.NewError(ast.ParseErr, &ast.Location{File: m.File}, "%v", err))
			}
			continue
		}
		parsed[m.File] = mod
	}
	if len(errs) > 0 {
		return nil, nil, &LoadError{Kind: KindParse, Files: files, Err: errs}
	}

	var forbidden ast.Errors
	hasLibrary := false
	for _, m := range modules {
		mod := parsed[m.File]
		if mod.Package.Path.String() == BuiltinPackage {
			hasLibrary = true
		}
		forbidden = append(forbidden, forbiddenCalls(mod)...)
	}
	if len(forbidden) > 0 {
		return nil, nil, &LoadError{Kind: KindForbiddenBuiltin, Files: errorFiles(forbidden), Err: forbidden}
	}

	out := slices.Clone(modules)
	if !hasLibrary {
		lib := builtinModule(builtinLibraryFile)
		mod, err := ast.ParseModuleWithOpts(lib.File, lib.Text, ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true})
		if err != nil {
			return nil, nil, fmt.Errorf("parsing the built-in policy: %w", err) // a build defect, covered by tests
		}
		if _, clash := parsed[lib.File]; clash {
			return nil, nil, &LoadError{Kind: KindCompile, Files: []string{lib.File},
				Err: fmt.Errorf("module name %s is reserved for the built-in policy", lib.File)}
		}
		parsed[lib.File] = mod
		out = append(out, lib)
	}
	return out, parsed, nil
}

// forbiddenCalls reports every use of a forbidden built-in function in mod.
func forbiddenCalls(mod *ast.Module) ast.Errors {
	var errs ast.Errors
	ast.WalkTerms(mod, func(t *ast.Term) bool {
		ref, ok := t.Value.(ast.Ref)
		if !ok {
			return false
		}
		name := ref.String()
		if why := forbiddenReason(name); why != "" {
			errs = append(errs, ast.NewError("rego_forbidden_builtin_error", t.Location,
				"%s is not allowed in a volume-healer policy: %s", name, why))
		}
		return false
	})
	return errs
}

// errorFiles lists the distinct files that errors point at.
func errorFiles(errs ast.Errors) []string {
	var files []string
	for _, e := range errs {
		if e.Location != nil && e.Location.File != "" && !slices.Contains(files, e.Location.File) {
			files = append(files, e.Location.File)
		}
	}
	return files
}

// revisionID names a policy set by the content of its modules as delivered (the built-in library
// is part of the binary), so that reloading the same modules is a no-op.
func revisionID(modules []Module) string {
	sorted := slices.Clone(modules)
	slices.SortFunc(sorted, func(a, b Module) int { return strings.Compare(a.File, b.File) })
	h := sha256.New()
	for _, m := range sorted {
		fmt.Fprintf(h, "%d:%s%d:%s", len(m.File), m.File, len(m.Text), m.Text)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// Compile turns modules into a revision ready to serve: it parses, rejects forbidden built-in
// functions, compiles in strict mode, prepares the decision, restart and propagation queries,
// works out whether decisions can be memoized, and finally evaluates the revision against canned
// inputs (every trigger, with and without probe results; pods to restart; pods being created) to
// catch runtime errors, conflicts, wrong output types, undefined decisions and slow evaluation
// before the revision serves. Every failure is a *LoadError.
func Compile(ctx context.Context, modules []Module, opts CompileOptions) (*Revision, error) {
	opts = opts.withDefaults()
	all, parsed, err := parseModules(modules)
	if err != nil {
		return nil, err
	}

	compiler := newCompiler()
	if compiler.Compile(parsed); compiler.Failed() {
		return nil, &LoadError{Kind: KindCompile, Files: errorFiles(compiler.Errors), Err: compiler.Errors}
	}
	decisionRef := ast.MustParseRef(DecisionQuery)
	if len(compiler.GetRules(decisionRef)) == 0 {
		return nil, &LoadError{Kind: KindUndefined, Err: fmt.Errorf(
			"%w: no module defines it; a policy needs `package volumehealer` and a `decision` rule", ErrUndefinedDecision)}
	}

	query, err := rego.New(
		rego.Query(DecisionQuery),
		rego.Compiler(compiler),
		rego.Store(inmem.New()),
		rego.StrictBuiltinErrors(true),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, &LoadError{Kind: KindCompile, Err: fmt.Errorf("preparing %s: %w", DecisionQuery, err)}
	}

	restartQuery, err := rego.New(
		rego.Query(RestartQuery),
		rego.Compiler(compiler),
		rego.Store(inmem.New()),
		rego.StrictBuiltinErrors(true),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, &LoadError{Kind: KindCompile, Err: fmt.Errorf("preparing %s: %w", RestartQuery, err)}
	}

	propagationQuery, err := rego.New(
		rego.Query(PropagationQuery),
		rego.Compiler(compiler),
		rego.Store(inmem.New()),
		rego.StrictBuiltinErrors(true),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, &LoadError{Kind: KindCompile, Err: fmt.Errorf("preparing %s: %w", PropagationQuery, err)}
	}

	rev := &Revision{
		id:               revisionID(modules),
		modules:          all,
		compiler:         compiler,
		query:            query,
		restartQuery:     restartQuery,
		propagationQuery: propagationQuery,
		hasPropagation:   len(compiler.GetRules(ast.MustParseRef(PropagationQuery))) > 0,
		timeout:          opts.EvalTimeout,
	}
	for _, m := range modules {
		rev.files = append(rev.files, m.File)
	}
	rev.plan, rev.memoOff = analyse(compiler, decisionRef)
	switch {
	case opts.DisableMemo:
		rev.memoOff = "disabled by configuration"
	case rev.plan != nil:
		rev.memo = newMemo(opts.MemoSize)
	}

	if err := rev.validate(ctx); err != nil {
		return nil, err
	}
	return rev, nil
}

// validate evaluates the revision against the canned inputs and turns the first failure into a
// *LoadError that points at the offending file where OPA says which.
func (r *Revision) validate(ctx context.Context) error {
	for _, c := range validationInputs() {
		if _, err := r.evaluate(ctx, &c.input); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("validating policy revision: %w", ctx.Err()) // the caller gave up; not the policy's fault
			}
			kind := errorKindOf(err)
			files := r.decisionFiles()
			var te *topdown.Error
			if errors.As(err, &te) && te.Location != nil && te.Location.File != "" {
				files = []string{te.Location.File}
			}
			return &LoadError{Kind: kind, Files: files, Err: fmt.Errorf("evaluating %s: %w", c.name, err)}
		}
	}
	for _, c := range restartValidationInputs() {
		if _, err := r.decideRestart(ctx, &c.input); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("validating policy revision: %w", ctx.Err())
			}
			files := r.ruleFiles(RestartQuery)
			var te *topdown.Error
			if errors.As(err, &te) && te.Location != nil && te.Location.File != "" {
				files = []string{te.Location.File}
			}
			return &LoadError{Kind: errorKindOf(err), Files: files, Err: fmt.Errorf("evaluating %s for %s: %w", RestartQuery, c.name, err)}
		}
	}
	for _, c := range propagationValidationInputs() {
		if _, err := r.decidePropagation(ctx, &c.input); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("validating policy revision: %w", ctx.Err())
			}
			files := r.ruleFiles(PropagationQuery)
			var te *topdown.Error
			if errors.As(err, &te) && te.Location != nil && te.Location.File != "" {
				files = []string{te.Location.File}
			}
			return &LoadError{Kind: errorKindOf(err), Files: files, Err: fmt.Errorf("evaluating %s for %s: %w", PropagationQuery, c.name, err)}
		}
	}
	return nil
}

// decisionFiles lists the files that define the decision rule, to blame for a decision of the
// wrong shape. The built-in library is not blamed: it is tested with the binary.
func (r *Revision) decisionFiles() []string { return r.ruleFiles(DecisionQuery) }

// ruleFiles lists the files that define the rule of query.
func (r *Revision) ruleFiles(query string) []string {
	var files []string
	for _, rule := range r.compiler.GetRules(ast.MustParseRef(query)) {
		if rule.Location != nil && !slices.Contains(files, rule.Location.File) {
			files = append(files, rule.Location.File)
		}
	}
	slices.Sort(files)
	return files
}
