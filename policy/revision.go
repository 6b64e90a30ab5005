package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// Revision is one compiled, validated policy set. It is immutable and safe for concurrent use.
type Revision struct {
	id       string
	files    []string // the modules handed to Compile, without the added built-in library
	modules  []Module // every module compiled, the built-in library included
	compiler *ast.Compiler
	query    rego.PreparedEvalQuery
	// restartQuery evaluates RestartQuery, the per-pod decision after a heal pods cannot see.
	restartQuery rego.PreparedEvalQuery
	// propagationQuery evaluates PropagationQuery, the per-pod decision of the propagation
	// admission webhook; hasPropagation says whether a module defines it.
	propagationQuery rego.PreparedEvalQuery
	hasPropagation   bool
	timeout          time.Duration

	plan    *keyPlan // the input fields decisions depend on; nil when they cannot be memoized
	memoOff string   // why decisions are not memoized, when they are not
	memo    *memo    // nil when decisions are not memoized
	keyBufs sync.Pool
}

// ID names the revision by the content of its modules.
func (r *Revision) ID() string { return r.id }

// Files lists the modules the revision was compiled from, as handed to Compile.
func (r *Revision) Files() []string { return slices.Clone(r.files) }

// Memoized reports whether decisions are memoized by the input fields the policy reads, and when
// they are not, why.
func (r *Revision) Memoized() (bool, string) { return r.memo != nil, r.memoOff }

// InputPaths lists the input fields decisions depend on, such as "input.volume.attributes.mounter"
// or "input.probe.health[_].status"; nil when decisions are not memoized.
func (r *Revision) InputPaths() []string {
	if r.plan == nil {
		return nil
	}
	out := make([]string, len(r.plan.paths))
	for i, p := range r.plan.paths {
		out[i] = p.String()
	}
	return out
}

// Decide returns the decision for one volume, from the memo when the revision has already
// decided for an input that agrees on every field the policy reads.
func (r *Revision) Decide(ctx context.Context, in *Input) (Decision, error) {
	d, _, err := r.decide(ctx, in)
	return d, err
}

// decide is Decide, also reporting whether the memo answered.
func (r *Revision) decide(ctx context.Context, in *Input) (Decision, bool, error) {
	if err := in.validate(); err != nil {
		return Decision{}, false, &EvalError{Kind: KindRuntime, Err: err}
	}
	if r.memo == nil {
		d, err := r.evaluate(ctx, in)
		return d, false, err
	}
	bp, _ := r.keyBufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, 0, 256)
		bp = &b
	}
	key := r.plan.appendKey((*bp)[:0], in)
	defer func() {
		*bp = key
		r.keyBufs.Put(bp)
	}()
	if d, ok := r.memo.get(key); ok {
		return d, true, nil
	}
	d, err := r.evaluate(ctx, in)
	if err == nil {
		// Errors are not remembered: a timeout may not repeat, and a runtime error is reported
		// for every volume it concerns.
		r.memo.put(string(key), d)
	}
	return d, false, err
}

// Evaluate returns the decision for one volume by evaluating the policy, never from the memo.
func (r *Revision) Evaluate(ctx context.Context, in *Input) (Decision, error) {
	if err := in.validate(); err != nil {
		return Decision{}, &EvalError{Kind: KindRuntime, Err: err}
	}
	return r.evaluate(ctx, in)
}

// rawValue hands the evaluated term to decodeDecision without a detour through encoding/json.
func rawValue(t *ast.Term, _ *rego.EvalContext) (any, error) { return t.Value, nil }

// generateRaw is the evaluation option of rawValue, made once.
var generateRaw = rego.EvalGenerateJSON(rawValue)

// evaluate runs the prepared query once under the evaluation timeout.
func (r *Revision) evaluate(ctx context.Context, in *Input, opts ...rego.EvalOption) (Decision, error) {
	// The evaluation stops at the timeout or when ctx ends, through a cancel of its own: a
	// context with a deadline would cost more allocations than the rest of the decision around
	// OPA's evaluation, and OPA would start a goroutine per evaluation to watch it.
	cancel := topdown.NewCancel()
	timer := time.AfterFunc(r.timeout, cancel.Cancel)
	defer timer.Stop()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, cancel.Cancel)
		defer stop()
	}
	var rs rego.ResultSet
	var err error
	if len(opts) == 0 {
		rs, err = r.query.Eval(ctx, rego.EvalParsedInput(in.astValue()), generateRaw, rego.EvalExternalCancel(cancel))
	} else {
		opts = append(opts, rego.EvalParsedInput(in.astValue()), generateRaw, rego.EvalExternalCancel(cancel))
		rs, err = r.query.Eval(ctx, opts...)
	}
	if err != nil {
		return Decision{}, r.classify(ctx, err)
	}
	switch {
	case len(rs) == 0:
		return Decision{}, &EvalError{Kind: KindUndefined, Err: ErrUndefinedDecision}
	case len(rs) > 1 || len(rs[0].Expressions) != 1:
		return Decision{}, &EvalError{Kind: KindConflict, Err: fmt.Errorf("%w: %d results", ErrConflict, len(rs))}
	}
	v, ok := rs[0].Expressions[0].Value.(ast.Value)
	if !ok {
		return Decision{}, &EvalError{Kind: KindInvalidOutput, Err: fmt.Errorf("%w: result of type %T", ErrInvalidDecision, rs[0].Expressions[0].Value)}
	}
	d, err := decodeDecision(v)
	if err != nil {
		return Decision{}, &EvalError{Kind: KindInvalidOutput, Err: err}
	}
	return d, nil
}

// classify wraps an evaluation error with its kind and sentinel.
func (r *Revision) classify(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || topdown.IsCancel(err) {
		return &EvalError{Kind: KindTimeout, Err: fmt.Errorf("%w after %v: %w", ErrEvaluationTimeout, r.timeout, err)}
	}
	var te *topdown.Error
	if errors.As(err, &te) && te.Code == topdown.ConflictErr {
		return &EvalError{Kind: KindConflict, Err: fmt.Errorf("%w: %w", ErrConflict, err)}
	}
	return &EvalError{Kind: KindRuntime, Err: fmt.Errorf("evaluating %s: %w", DecisionQuery, err)}
}

// Describe summarises the revision for logs and the CLI.
func (r *Revision) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "revision %s from %s", r.id, strings.Join(r.files, ", "))
	if r.memo != nil {
		fmt.Fprintf(&b, "; decisions memoized by %s", strings.Join(r.InputPaths(), ", "))
	} else {
		fmt.Fprintf(&b, "; decisions not memoized: %s", r.memoOff)
	}
	return b.String()
}

// memo remembers decisions by key, bounded: when the current generation is full it becomes the old
// one and the previous old one is dropped, so recently used keys survive and memory stays bounded
// at twice the generation size.
type memo struct {
	mu    sync.Mutex
	limit int
	cur   map[string]Decision
	old   map[string]Decision
}

func newMemo(size int) *memo {
	limit := max(size/2, 1)
	return &memo{limit: limit, cur: make(map[string]Decision, limit)}
}

func (m *memo) get(key []byte) (Decision, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.cur[string(key)]; ok {
		return d, true
	}
	if d, ok := m.old[string(key)]; ok {
		m.insert(string(key), d)
		return d, true
	}
	return Decision{}, false
}

func (m *memo) put(key string, d Decision) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.insert(key, d)
}

func (m *memo) insert(key string, d Decision) {
	if len(m.cur) >= m.limit {
		m.old, m.cur = m.cur, make(map[string]Decision, m.limit)
	}
	m.cur[key] = d
}

// len returns how many decisions the memo holds.
func (m *memo) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.cur) + len(m.old)
}
