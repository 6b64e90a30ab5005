package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// RestartQuery is the document the controller evaluates, once per pod, when a remedy of a volume
// on its node needs the pod to restart: a heal repaired the node's mount but the pod still sees the
// dead one (remedy "heal"), or the volume is recycled on the node (remedy "recycle"). It answers
// restartContainers (in place), evict, or leave. A policy set that does not define it leaves every
// pod alone (RestartNoRule).
const RestartQuery = "data.volumehealer.restart"

// RestartAction is what the controller does with a pod that still sees a volume's dead mount.
type RestartAction string

const (
	// RestartEvict evicts the pod through the Eviction API; its controller recreates it with the
	// repaired mount.
	RestartEvict RestartAction = "evict"
	// RestartLeave leaves the pod alone; an Event on the pod and the claim says why.
	RestartLeave RestartAction = "leave"
	// RestartContainers restarts the pod's containers that mount the volume in place, through the
	// node's healer sidecar and the container runtime: the pod keeps its UID, name, node and IP,
	// and kubelet gives the new containers the node's repaired mount. Only for remedy "heal" (a
	// container restart cannot remount a dead staging mount) and only where
	// input.remedies.restartContainers is true; where the sidecar cannot after all, the controller
	// asks again with it false.
	RestartContainers RestartAction = "restartContainers"
)

// Valid reports whether a is one of the documented restart actions.
func (a RestartAction) Valid() bool {
	return a == RestartEvict || a == RestartLeave || a == RestartContainers
}

// Remedies that ask pods to restart (RestartInput.Remedy).
const (
	// RemedyHeal: a heal repaired the volume's mount on the node, and the pod still sees the dead
	// one (its mount propagation is None).
	RemedyHeal = "heal"
	// RemedyRecycle: the volume is recycled on the node: every pod using it there must go so that
	// kubelet unstages it and the driver mounts it again.
	RemedyRecycle = "recycle"
)

// RestartNoRule is the reason of the decision for a policy set without a restart rule.
const RestartNoRule = "NoRestartRule"

// RestartDecision is the typed form of data.volumehealer.restart.
type RestartDecision struct {
	// Action is restartContainers, evict or leave.
	Action RestartAction `json:"action"`
	// Reason explains the decision to operators (Events, logs); required, never empty.
	Reason string `json:"reason"`
}

// Pod is the part of a Pod the restart decision sees.
type Pod struct {
	// Namespace is the pod's namespace, the claim's.
	Namespace string `json:"namespace"`
	// Name is the pod's name.
	Name string `json:"name"`
	// OwnerKind is the kind of the pod's controller (ReplicaSet, StatefulSet, DaemonSet, Job,
	// ...); empty for a bare pod, which nothing recreates.
	OwnerKind string `json:"ownerKind"`
	// Labels are the pod's labels.
	Labels map[string]string `json:"labels"`
	// DisruptionBudget is true when a PodDisruptionBudget of the namespace selects the pod.
	DisruptionBudget bool `json:"disruptionBudget"`
	// RestartPolicy is the pod's spec.restartPolicy: Always, OnFailure or Never. Containers of a
	// pod with Never are not started again after a restart in place.
	RestartPolicy string `json:"restartPolicy"`
}

// Labeled is an object's name and labels, for the pod's namespace and the volume's StorageClass.
type Labeled struct {
	// Name is the object's name.
	Name string `json:"name"`
	// Labels are its labels; empty when the object is not known.
	Labels map[string]string `json:"labels"`
}

// RestartInput is the document the restart decision sees as `input`: the volume's Input as the
// remedy saw it (probe included), which remedy asks and for what finding, and the pod, its
// namespace, the volume's StorageClass and the time of the decision.
type RestartInput struct {
	Input
	// Remedy is the remedy that asks the pod to restart: RemedyHeal or RemedyRecycle.
	Remedy string
	// Finding is the probe's reason that led to the remedy, such as "StaleMountInPods",
	// "MountGone" or "PublishTargetNotMounted"; empty when the probe named none.
	Finding string
	// Pod is the pod that still sees the dead mount.
	Pod Pod
	// Namespace is the pod's namespace with its labels.
	Namespace Labeled
	// StorageClass is the volume's StorageClass with its labels; absent when the PV names none.
	StorageClass *Labeled
	// Time is when the decision is made; RFC 3339 in Rego, for maintenance windows.
	Time time.Time
}

// validate checks the volume's input and the remedy.
func (in *RestartInput) validate() error {
	if err := in.Input.validate(); err != nil {
		return err
	}
	if in.Remedy != RemedyHeal && in.Remedy != RemedyRecycle {
		return fmt.Errorf("%w: remedy %q is not one of heal, recycle", ErrInvalidInput, in.Remedy)
	}
	return nil
}

// astValue adds the pod, its namespace, the StorageClass and the time to the volume's input.
func (in *RestartInput) astValue() ast.Value {
	obj := in.Input.astValue().(ast.Object)
	obj.Insert(ast.InternedTerm("pod"), ast.ObjectTerm(
		item("namespace", ast.StringTerm(in.Pod.Namespace)),
		item("name", ast.StringTerm(in.Pod.Name)),
		item("ownerKind", ast.StringTerm(in.Pod.OwnerKind)),
		item("labels", stringMapTerm(in.Pod.Labels)),
		item("disruptionBudget", ast.InternedTerm(in.Pod.DisruptionBudget)),
		item("restartPolicy", ast.StringTerm(in.Pod.RestartPolicy)),
	))
	obj.Insert(ast.InternedTerm("remedy"), ast.StringTerm(in.Remedy))
	obj.Insert(ast.InternedTerm("finding"), ast.StringTerm(in.Finding))
	obj.Insert(ast.InternedTerm("namespace"), labeledTerm(in.Namespace))
	if in.StorageClass != nil {
		obj.Insert(ast.InternedTerm("storageClass"), labeledTerm(*in.StorageClass))
	}
	obj.Insert(ast.InternedTerm("time"), ast.StringTerm(formatTime(in.Time)))
	return obj
}

func labeledTerm(l Labeled) *ast.Term {
	return ast.ObjectTerm(item("name", ast.StringTerm(l.Name)), item("labels", stringMapTerm(l.Labels)))
}

// MarshalJSON writes the input exactly as the restart decision sees it.
func (in RestartInput) MarshalJSON() ([]byte, error) {
	v, err := ast.JSON(in.astValue())
	if err != nil {
		return nil, fmt.Errorf("converting restart input to JSON: %w", err)
	}
	return json.Marshal(v)
}

// decodeRestart turns the policy's restart output into a RestartDecision; anything but the
// documented object is an error that names the problem.
func decodeRestart(v ast.Value) (RestartDecision, error) {
	obj, ok := v.(ast.Object)
	if !ok {
		return RestartDecision{}, fmt.Errorf("%w: restart is %s %v, want an object with action and reason",
			ErrInvalidDecision, ast.ValueName(v), truncate(v.String(), 200))
	}
	var d RestartDecision
	var err error
	obj.Foreach(func(k, val *ast.Term) {
		if err != nil {
			return
		}
		key, _ := k.Value.(ast.String)
		s, isStr := val.Value.(ast.String)
		switch string(key) {
		case "action":
			d.Action = RestartAction(s)
			if !isStr || !d.Action.Valid() {
				err = fmt.Errorf("action %v is not one of restartContainers, evict, leave", val)
			}
		case "reason":
			d.Reason = string(s)
			if !isStr || d.Reason == "" {
				err = fmt.Errorf("reason %v is not a non-empty string", val)
			}
		default:
			err = fmt.Errorf("unknown key %v (known: action, reason)", k)
		}
	})
	switch {
	case err != nil:
	case d.Action == "":
		err = fmt.Errorf("action is missing")
	case d.Reason == "":
		err = fmt.Errorf("reason is missing")
	}
	if err != nil {
		return RestartDecision{}, fmt.Errorf("%w %s: %w", ErrInvalidDecision, truncate(v.String(), 200), err)
	}
	return d, nil
}

// DecideRestart evaluates the restart decision for one pod. It is never memoized: the input
// holds the time. A policy set without a restart rule leaves the pod alone (RestartNoRule).
func (r *Revision) DecideRestart(ctx context.Context, in *RestartInput) (RestartDecision, error) {
	if err := in.validate(); err != nil {
		return RestartDecision{}, &EvalError{Kind: KindRuntime, Err: err}
	}
	return r.decideRestart(ctx, in)
}

// decideRestart runs the prepared restart query once under the evaluation timeout.
func (r *Revision) decideRestart(ctx context.Context, in *RestartInput, opts ...rego.EvalOption) (RestartDecision, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	opts = append(opts, rego.EvalParsedInput(in.astValue()), rego.EvalGenerateJSON(rawValue))
	rs, err := r.restartQuery.Eval(ctx, opts...)
	if err != nil {
		return RestartDecision{}, r.classify(ctx, err)
	}
	switch {
	case len(rs) == 0:
		return RestartDecision{Action: RestartLeave, Reason: RestartNoRule}, nil
	case len(rs) > 1 || len(rs[0].Expressions) != 1:
		return RestartDecision{}, &EvalError{Kind: KindConflict, Err: fmt.Errorf("%w: %d results", ErrConflict, len(rs))}
	}
	v, ok := rs[0].Expressions[0].Value.(ast.Value)
	if !ok {
		return RestartDecision{}, &EvalError{Kind: KindInvalidOutput, Err: fmt.Errorf("%w: result of type %T", ErrInvalidDecision, rs[0].Expressions[0].Value)}
	}
	d, err := decodeRestart(v)
	if err != nil {
		return RestartDecision{}, &EvalError{Kind: KindInvalidOutput, Err: err}
	}
	return d, nil
}

// DecideRestart returns the restart decision of the serving revision for one pod.
func (e *Engine) DecideRestart(ctx context.Context, in *RestartInput) (RestartDecision, error) {
	rev := e.Revision()
	d, err := rev.DecideRestart(ctx, in)
	if err != nil {
		return RestartDecision{}, fmt.Errorf("policy revision %s, %s: %w", rev.id, RestartQuery, err)
	}
	return d, nil
}
