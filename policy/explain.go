package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// Explanation is a decision together with the rules that produced it.
type Explanation struct {
	// Revision is the revision that decided.
	Revision string
	// Input is what the policy saw.
	Input Input
	// Decision is the decision, when Err is nil and Restart is nil.
	Decision Decision
	// Restart is the restart input of a pod, for an explanation of the restart decision
	// (ExplainRestart); nil for the volume's decision.
	Restart *RestartInput
	// RestartDecision is the restart decision, when Err is nil and Restart is set.
	RestartDecision RestartDecision
	// Err is the evaluation error, if any.
	Err error
	// Fired lists the rules whose body held, in the order they first did.
	Fired []RuleTrace
	// NotFired lists the rules that were tried and whose body did not hold.
	NotFired []RuleTrace
	// Trace is OPA's full evaluation trace.
	Trace []*topdown.Event
}

// RuleTrace names one rule of a trace.
type RuleTrace struct {
	// Rule is the document the rule defines, such as data.volumehealer.builtin.second_pass.
	Rule string
	// Location is file:line of the rule.
	Location string
	// Source is the rule's source text.
	Source string
}

// Explain evaluates the policy for in with tracing on, never from the memo, and reports which
// rules fired. It calls nothing outside the process.
func (r *Revision) Explain(ctx context.Context, in *Input) (*Explanation, error) {
	if err := in.validate(); err != nil {
		return nil, err
	}
	tracer := topdown.NewBufferTracer()
	// Without rule indexing every candidate rule is entered, so rules that did not fire show up.
	d, err := r.evaluate(ctx, in, rego.EvalQueryTracer(tracer), rego.EvalRuleIndexing(false))
	x := &Explanation{Revision: r.id, Input: *in, Decision: d, Err: err, Trace: *tracer}
	x.rules()
	return x, nil
}

// ExplainRestart evaluates the restart decision for one pod with tracing on and reports which
// rules fired, as Explain does for the volume's decision.
func (r *Revision) ExplainRestart(ctx context.Context, in *RestartInput) (*Explanation, error) {
	if err := in.validate(); err != nil {
		return nil, err
	}
	tracer := topdown.NewBufferTracer()
	d, err := r.decideRestart(ctx, in, rego.EvalQueryTracer(tracer), rego.EvalRuleIndexing(false))
	x := &Explanation{Revision: r.id, Input: in.Input, Restart: in, RestartDecision: d, Err: err, Trace: *tracer}
	x.rules()
	return x, nil
}

// rules sorts the rules of the trace into those that fired and those that did not.
func (x *Explanation) rules() {
	entered := map[*ast.Rule]bool{}
	exited := map[*ast.Rule]bool{}
	var order []*ast.Rule
	for _, ev := range x.Trace {
		rule, ok := ev.Node.(*ast.Rule)
		if !ok {
			continue
		}
		switch ev.Op {
		case topdown.EnterOp:
			if !entered[rule] {
				entered[rule] = true
				order = append(order, rule)
			}
		case topdown.ExitOp:
			if !exited[rule] {
				exited[rule] = true
				x.Fired = append(x.Fired, ruleTrace(rule))
			}
		}
	}
	for _, rule := range order {
		if !exited[rule] {
			x.NotFired = append(x.NotFired, ruleTrace(rule))
		}
	}
}

func ruleTrace(rule *ast.Rule) RuleTrace {
	t := RuleTrace{Rule: rule.Head.Ref().String()}
	if rule.Module != nil {
		t.Rule = rule.Ref().String()
	}
	if loc := rule.Location; loc != nil {
		t.Location = fmt.Sprintf("%s:%d", loc.File, loc.Row)
		t.Source = ownSource(string(loc.Text))
	}
	return t
}

// ownSource cuts a rule's source text before the else branches that follow it: OPA's location
// text of a rule with else branches spans the whole chain.
func ownSource(text string) string {
	lines := strings.Split(text, "\n")
	for i := 1; i < len(lines); i++ {
		if strings.HasPrefix(strings.TrimSpace(lines[i]), "} else") {
			return strings.Join(append(lines[:i:i], "}"), "\n")
		}
	}
	return text
}

// WriteText prints the explanation for a person: the decision, the rules that fired with their
// source, the rules that did not, and with full set OPA's whole trace.
func (x *Explanation) WriteText(w io.Writer, full bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "policy revision: %s\n", x.Revision)
	fmt.Fprintf(&b, "volume: %s (driver %s", x.Input.Volume.PV, x.Input.Volume.Driver)
	if x.Input.Node != nil {
		fmt.Fprintf(&b, ", node %s", x.Input.Node.Name)
	}
	fmt.Fprintf(&b, "), trigger %s", x.Input.Trigger)
	if x.Input.Probe != nil {
		fmt.Fprintf(&b, ", after a probe (healthy: %t)", x.Input.Probe.Healthy)
	}
	b.WriteString("\n")
	var decision any = x.Decision
	if p := x.Restart; p != nil {
		fmt.Fprintf(&b, "pod: %s/%s (owner %s, disruption budget: %t), time %s\n", p.Pod.Namespace, p.Pod.Name,
			orNone(p.Pod.OwnerKind), p.Pod.DisruptionBudget, formatTime(p.Time))
		fmt.Fprintf(&b, "namespace labels: %s\n", formatLabels(p.Namespace.Labels))
		if p.StorageClass != nil {
			fmt.Fprintf(&b, "storage class %s labels: %s\n", p.StorageClass.Name, formatLabels(p.StorageClass.Labels))
		}
		decision = x.RestartDecision
	}
	if x.Err != nil {
		fmt.Fprintf(&b, "error: %v\n", x.Err)
	} else {
		dj, err := json.Marshal(decision)
		if err != nil {
			return fmt.Errorf("encoding decision: %w", err)
		}
		if x.Restart != nil {
			fmt.Fprintf(&b, "restart decision: %s\n", dj)
		} else {
			fmt.Fprintf(&b, "decision: %s\n", dj)
		}
	}
	writeRules(&b, "rules that fired", x.Fired, -1)
	writeRules(&b, "rules tried that did not fire", x.NotFired, 1)
	if full {
		b.WriteString("\ntrace:\n")
		topdown.PrettyTraceWithLocation(&b, x.Trace)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRules lists rules with up to lines lines of their source each, all of it when lines < 0.
func writeRules(b *strings.Builder, title string, rules []RuleTrace, lines int) {
	fmt.Fprintf(b, "\n%s:\n", title)
	if len(rules) == 0 {
		b.WriteString("  (none)\n")
	}
	for _, r := range rules {
		fmt.Fprintf(b, "  %s  %s\n", r.Location, r.Rule)
		src := strings.Split(r.Source, "\n")
		if lines >= 0 && len(src) > lines {
			src = src[:lines]
		}
		for _, line := range src {
			fmt.Fprintf(b, "      %s\n", line)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// formatLabels prints labels sorted, "(none)" when there are none.
func formatLabels(l map[string]string) string {
	if len(l) == 0 {
		return "(none)"
	}
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ", ")
}
