package policy

import (
	"errors"
	"fmt"
	"strings"
)

// ErrUndefinedDecision is returned when the policy defines no data.volumehealer.decision for an
// input. A policy must decide for every input; `default decision := {...}` is the usual way.
var ErrUndefinedDecision = errors.New("the policy defines no data.volumehealer.decision for this input (a `default decision := {...}` rule decides for every input)")

// ErrInvalidDecision is returned when data.volumehealer.decision is not an object of the documented
// shape: an unknown action, a missing reason, a key the controller does not know, a wrong type.
var ErrInvalidDecision = errors.New("invalid decision")

// ErrConflict is returned when the rules defining the decision produce more than one value for the
// same input (OPA's eval_conflict_error).
var ErrConflict = errors.New("the policy produced conflicting decisions")

// ErrEvaluationTimeout is returned when one evaluation runs past the evaluation timeout.
var ErrEvaluationTimeout = errors.New("policy evaluation timed out")

// ErrInvalidInput is returned when the input handed to the engine cannot be evaluated, such as an
// unknown trigger.
var ErrInvalidInput = errors.New("invalid policy input")

// ErrNoModules is returned when a policy set holds no Rego module.
var ErrNoModules = errors.New("the policy set holds no Rego module")

// ErrRejected matches every *LoadError: the policy revision did not take effect.
var ErrRejected = errors.New("policy rejected")

// ErrNotSynced is returned by ConfigMapSource.Check until the source has read the policy
// ConfigMaps: without the rest of the set, a change cannot be judged.
var ErrNotSynced = errors.New("the policy ConfigMaps have not been read yet")

// ErrNoAcceptedPolicy is returned by Decide while no accepted policy serves: the configured set
// was rejected when this process started and no accepted copy of it could be read. The policy
// cannot decide; a restart sweep keeps such volumes pending until one serves.
var ErrNoAcceptedPolicy = errors.New("no accepted policy serves: the configured policy is rejected and no accepted copy of it could be read; fix the policy ConfigMaps")

// ErrTestsFailed is returned by CheckTests when a Rego unit test failed or errored.
var ErrTestsFailed = errors.New("policy tests failed")

// ErrNoTests is returned when the modules handed to RunTests hold no test rule.
var ErrNoTests = errors.New("no policy tests found (test rules are named test_*)")

// ErrorKind classifies why a policy revision was rejected. The set is closed so that it can label a
// metric and the status annotation.
type ErrorKind string

const (
	// KindParse is a syntax error.
	KindParse ErrorKind = "parse"
	// KindCompile is an error of the Rego compiler: undefined references, unsafe variables, type
	// errors, recursion, strict-mode violations.
	KindCompile ErrorKind = "compile"
	// KindForbiddenBuiltin is a call of a built-in function that reaches outside the controller.
	KindForbiddenBuiltin ErrorKind = "forbidden_builtin"
	// KindRuntime is an evaluation error such as a division by zero.
	KindRuntime ErrorKind = "runtime"
	// KindConflict is a decision with more than one value for the same input.
	KindConflict ErrorKind = "conflict"
	// KindUndefined is a policy that leaves the decision undefined.
	KindUndefined ErrorKind = "undefined"
	// KindInvalidOutput is a decision of the wrong shape or type.
	KindInvalidOutput ErrorKind = "invalid_output"
	// KindTimeout is an evaluation that ran past the evaluation timeout.
	KindTimeout ErrorKind = "timeout"
	// KindNoModules is a set of policy ConfigMaps none of which holds a data key ending in .rego
	// (a key removed or renamed): deleting the ConfigMaps, not emptying them, returns to the
	// built-in policy.
	KindNoModules ErrorKind = "no_modules"
)

// errorKinds lists every ErrorKind, so that metrics can start every label at zero.
var errorKinds = []ErrorKind{
	KindParse, KindCompile, KindForbiddenBuiltin, KindRuntime, KindConflict, KindUndefined,
	KindInvalidOutput, KindTimeout, KindNoModules,
}

// LoadError explains why a policy revision was rejected. The revision that served before keeps
// serving.
type LoadError struct {
	// Kind classifies the error.
	Kind ErrorKind
	// Files names the modules the error points at (a file path, or namespace/configmap/key for a
	// policy delivered in a ConfigMap). Empty when the error concerns the policy set as a whole.
	Files []string
	// Err is the underlying error; its message carries file and line where OPA reports them.
	Err error
}

// Error implements error.
func (e *LoadError) Error() string {
	if len(e.Files) == 0 {
		return fmt.Sprintf("policy rejected (%s): %v", e.Kind, e.Err)
	}
	return fmt.Sprintf("policy rejected (%s) in %s: %v", e.Kind, strings.Join(e.Files, ", "), e.Err)
}

// Unwrap returns the underlying error.
func (e *LoadError) Unwrap() error { return e.Err }

// Is reports whether target is ErrRejected, so callers can test any load failure with errors.Is.
func (e *LoadError) Is(target error) bool { return target == ErrRejected }

// EvalError is an error of one evaluation, classified like a LoadError so that callers and
// metrics can tell a timeout from a conflict without parsing messages.
type EvalError struct {
	// Kind classifies the error.
	Kind ErrorKind
	// Err is the underlying error.
	Err error
}

// Error implements error.
func (e *EvalError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *EvalError) Unwrap() error { return e.Err }

// errorKindOf returns the kind of an evaluation error, KindRuntime when nothing narrower applies.
func errorKindOf(err error) ErrorKind {
	var ee *EvalError
	if errors.As(err, &ee) {
		return ee.Kind
	}
	var le *LoadError
	if errors.As(err, &le) {
		return le.Kind
	}
	return KindRuntime
}

// truncate shortens s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return strings.TrimRight(s[:cut], " \n\t") + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
