package policy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/tester"
)

// TestOptions configure RunTests.
type TestOptions struct {
	// Run runs only the tests whose name matches this regular expression. Default "": all.
	Run string
	// Timeout bounds each test. Default 5s.
	Timeout time.Duration
}

// Outcome is how a Rego unit test ended.
type Outcome string

const (
	// OutcomePass is a test whose body held.
	OutcomePass Outcome = "PASS"
	// OutcomeFail is a test whose body did not hold.
	OutcomeFail Outcome = "FAIL"
	// OutcomeError is a test whose evaluation failed.
	OutcomeError Outcome = "ERROR"
	// OutcomeSkip is a test named todo_test_*.
	OutcomeSkip Outcome = "SKIP"
)

// TestResult is the result of one Rego unit test.
type TestResult struct {
	// Name is the test rule, such as data.volumehealer_test.test_restart_probes.
	Name string
	// File is the module that holds the test.
	File string
	// Line is the test's line in File.
	Line int
	// Outcome is how the test ended.
	Outcome Outcome
	// Duration is how long it ran.
	Duration time.Duration
	// Detail says where a failed test stopped, or what error it ran into.
	Detail string
}

// String renders the result on one line.
func (r TestResult) String() string {
	s := fmt.Sprintf("%-5s %s (%s:%d) %s", r.Outcome, r.Name, r.File, r.Line, r.Duration.Round(time.Microsecond))
	if r.Detail != "" {
		s += ": " + strings.ReplaceAll(r.Detail, "\n", " ")
	}
	return s
}

// RunTests runs the Rego unit tests (rules named test_*) of modules, the way `opa test` does but
// through the engine's own loader: the same parser, forbidden built-in functions, strict
// compiler, strict built-in errors, and the built-in library added when the modules do not define
// package volumehealer.builtin. Results are sorted by location.
func RunTests(ctx context.Context, modules []Module, opts TestOptions) ([]TestResult, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	_, parsed, err := parseModules(modules)
	if err != nil {
		return nil, err
	}
	runner := tester.NewRunner().
		SetCompiler(newCompiler()).
		SetModules(parsed).
		SetTimeout(opts.Timeout).
		RaiseBuiltinErrors(true).
		Filter(opts.Run)
	ch, err := runner.RunTests(ctx, nil)
	if err != nil {
		return nil, &LoadError{Kind: KindCompile, Err: err}
	}
	var results []TestResult
	for r := range ch {
		tr := TestResult{Name: r.Package + "." + r.Name, Duration: r.Duration}
		if r.Location != nil {
			tr.File, tr.Line = r.Location.File, r.Location.Row
		}
		switch {
		case r.Skip:
			tr.Outcome = OutcomeSkip
		case r.Error != nil:
			tr.Outcome, tr.Detail = OutcomeError, r.Error.Error()
		case r.Fail:
			tr.Outcome = OutcomeFail
			if r.FailedAt != nil && r.FailedAt.Location != nil {
				tr.Detail = fmt.Sprintf("failed at %s:%d: %s", r.FailedAt.Location.File, r.FailedAt.Location.Row, r.FailedAt.Location.Text)
			}
		default:
			tr.Outcome = OutcomePass
		}
		results = append(results, tr)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("running policy tests: %w", err)
	}
	slices.SortFunc(results, func(a, b TestResult) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
	return results, nil
}

// CheckTests returns an error wrapping ErrTestsFailed when a test failed or errored, and
// ErrNoTests when there were none.
func CheckTests(results []TestResult) error {
	if len(results) == 0 {
		return ErrNoTests
	}
	bad := 0
	for _, r := range results {
		if r.Outcome == OutcomeFail || r.Outcome == OutcomeError {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w: %d of %d", ErrTestsFailed, bad, len(results))
	}
	return nil
}
