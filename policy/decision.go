package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Action is what the controller does with a volume.
type Action string

const (
	// ActionProbe asks the driver whether the volume is healthy; the policy is evaluated again with
	// the result.
	ActionProbe Action = "probe"
	// ActionHeal asks the driver to heal the volume.
	ActionHeal Action = "heal"
	// ActionSkip leaves the volume alone.
	ActionSkip Action = "skip"
	// ActionRecycle evicts every pod that uses the volume on its node (Eviction API, disruption
	// budgets respected), so that kubelet unpublishes and unstages it and the driver's own
	// NodeStage and NodePublish mount it again for the replacement pods: the remedy for a dead
	// mount of a driver that cannot heal it in place. Each pod's restart decision still decides
	// whether that pod is evicted.
	ActionRecycle Action = "recycle"
)

// actions lists every Action, so that metrics can start every label at zero.
var actions = []Action{ActionProbe, ActionHeal, ActionSkip, ActionRecycle}

// Valid reports whether a is one of the documented actions.
func (a Action) Valid() bool {
	return a == ActionProbe || a == ActionHeal || a == ActionSkip || a == ActionRecycle
}

// Decision is the typed form of data.volumehealer.decision.
type Decision struct {
	// Action is probe, heal, skip or recycle.
	Action Action
	// Reason explains the decision to operators (Events, logs); required, never empty.
	Reason string
	// Timeout bounds the probe or heal call; zero means the controller's configured default.
	Timeout time.Duration
	// Priority orders work within a sweep, higher first; zero when the policy sets none.
	Priority int
}

// decisionJSON is the wire form of a Decision: the same object the policy returns.
type decisionJSON struct {
	Action   Action `json:"action"`
	Reason   string `json:"reason"`
	Timeout  string `json:"timeout,omitempty"`
	Priority int    `json:"priority,omitempty"`
}

// MarshalJSON writes the decision in the form the policy returns it, the timeout as a Go duration.
func (d Decision) MarshalJSON() ([]byte, error) {
	w := decisionJSON{Action: d.Action, Reason: d.Reason, Priority: d.Priority}
	if d.Timeout > 0 {
		w.Timeout = d.Timeout.String()
	}
	return json.Marshal(w)
}

// decodeDecision turns the policy's output into a Decision. Everything that is not exactly the
// documented object is an error that names the problem, because a decision the controller
// misreads is worse than none.
func decodeDecision(v ast.Value) (Decision, error) {
	obj, ok := v.(ast.Object)
	if !ok {
		return Decision{}, fmt.Errorf("%w: decision is %s %v, want an object with action and reason",
			ErrInvalidDecision, ast.ValueName(v), truncate(v.String(), 200))
	}
	var d Decision
	var err error
	var haveAction, haveReason bool
	// The known keys are looked up rather than the object walked with a callback, which would
	// move the decision to the heap: this runs for every evaluated decision.
	known := 0
	for _, k := range decisionKeys {
		val := obj.Get(k)
		if val == nil {
			continue
		}
		known++
		if err = d.set(string(k.Value.(ast.String)), val, &haveAction, &haveReason); err != nil {
			break
		}
	}
	if err == nil && known != obj.Len() {
		for _, k := range obj.Keys() {
			if s, isString := k.Value.(ast.String); !isString {
				err = fmt.Errorf("key %v is not a string", k)
				break
			} else if !slices.Contains(decisionKeyNames, string(s)) {
				err = fmt.Errorf("unknown key %v (known: action, reason, timeout, priority)", k)
				break
			}
		}
	}
	switch {
	case err != nil:
	case !haveAction:
		err = fmt.Errorf("action is missing")
	case !haveReason:
		err = fmt.Errorf("reason is missing")
	}
	if err != nil {
		return Decision{}, fmt.Errorf("%w %s: %w", ErrInvalidDecision, truncate(v.String(), 200), err)
	}
	return d, nil
}

// decisionKeys are the keys of a decision object.
var (
	decisionKeyNames = []string{"action", "reason", "timeout", "priority"}
	decisionKeys     = func() []*ast.Term {
		out := make([]*ast.Term, len(decisionKeyNames))
		for i, k := range decisionKeyNames {
			out[i] = ast.StringTerm(k)
		}
		return out
	}()
)

// set decodes the value of one key of a decision object.
func (d *Decision) set(key string, val *ast.Term, haveAction, haveReason *bool) error {
	switch key {
	case "action":
		s, isStr := val.Value.(ast.String)
		if !isStr {
			return fmt.Errorf("action is %s %v, want a string", ast.ValueName(val.Value), val)
		}
		d.Action, *haveAction = Action(s), true
		if !d.Action.Valid() {
			return fmt.Errorf("action %q is not one of probe, heal, skip, recycle", string(s))
		}
	case "reason":
		s, isStr := val.Value.(ast.String)
		if !isStr {
			return fmt.Errorf("reason is %s %v, want a string", ast.ValueName(val.Value), val)
		}
		d.Reason, *haveReason = string(s), true
		if d.Reason == "" {
			return fmt.Errorf("reason is empty")
		}
	case "timeout":
		s, isStr := val.Value.(ast.String)
		if !isStr {
			return fmt.Errorf("timeout is %s %v, want a duration string such as \"30s\"", ast.ValueName(val.Value), val)
		}
		t, err := time.ParseDuration(string(s))
		if err != nil {
			return fmt.Errorf("timeout %q: %w", string(s), err)
		}
		if t <= 0 {
			return fmt.Errorf("timeout %q is not positive", string(s))
		}
		d.Timeout = t
	case "priority":
		n, isNum := val.Value.(ast.Number)
		if !isNum {
			return fmt.Errorf("priority is %s %v, want an integer", ast.ValueName(val.Value), val)
		}
		i, isInt := n.Int64()
		if !isInt || i < math.MinInt32 || i > math.MaxInt32 {
			return fmt.Errorf("priority %v is not an integer between %d and %d", n, math.MinInt32, math.MaxInt32)
		}
		d.Priority = int(i)
	}
	return nil
}
