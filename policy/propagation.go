package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
)

// PropagationQuery is the document the propagation admission webhook evaluates, once per pod
// being created: on which of its PVC-backed volumes it sets mountPropagation HostToContainer, so
// that a heal of the node's mount reaches the pod's containers without a restart. A policy set
// that does not define it changes no pod (PropagationNoRule).
const PropagationQuery = "data.volumehealer.propagation"

// PropagationNoRule is the reason of the decisions for a policy set without a propagation rule.
const PropagationNoRule = "NoPropagationRule"

// PropagationInput is the document the propagation decision sees as `input`: the pod being
// created, its namespace, and its volumes that name a PersistentVolumeClaim.
type PropagationInput struct {
	// Pod is the pod being created.
	Pod AdmittedPod `json:"pod"`
	// Namespace is the pod's namespace with its labels (empty when the namespace is not known).
	Namespace Labeled `json:"namespace"`
	// Volumes are the pod's volumes that name a PersistentVolumeClaim, in the pod's order.
	Volumes []ClaimVolume `json:"volumes"`
}

// AdmittedPod is the part of a pod being created that the propagation decision sees. It has no
// UID and may have no name yet (generateName).
type AdmittedPod struct {
	// Namespace is the pod's namespace.
	Namespace string `json:"namespace"`
	// Name is the pod's name; empty when the API server generates it from GenerateName.
	Name string `json:"name"`
	// GenerateName is the prefix of a generated name; empty when the pod is named.
	GenerateName string `json:"generateName"`
	// OwnerKind is the kind of the pod's controller; empty for a bare pod.
	OwnerKind string `json:"ownerKind"`
	// Labels are the pod's labels.
	Labels map[string]string `json:"labels"`
}

// ClaimVolume is one volume of the pod that names a PersistentVolumeClaim, with what the
// controller's caches know of it.
type ClaimVolume struct {
	// Name is the volume's name in the pod; the decision is keyed by it.
	Name string `json:"name"`
	// Claim is the PersistentVolumeClaim's name, in the pod's namespace.
	Claim string `json:"claim"`
	// PersistentVolume is the name of the PV the claim is bound to; empty while it is not bound.
	PersistentVolume string `json:"persistentVolume"`
	// Driver is the CSI driver of the PV (spec.csi.driver); while the claim is not bound, its
	// StorageClass's provisioner when a CSIDriver object of that name exists. Empty for a volume
	// that is not (or will not be) a CSI volume.
	Driver string `json:"driver"`
	// StorageClass is the PV's StorageClass (the claim's while it is not bound); absent when
	// neither names one.
	StorageClass *ClassInfo `json:"storageClass,omitempty"`
	// Mounts are the volume's mounts in the pod's containers.
	Mounts []VolumeMountInfo `json:"mounts"`
}

// ClassInfo is a StorageClass as the propagation decision sees it.
type ClassInfo struct {
	// Name is the StorageClass's name.
	Name string `json:"name"`
	// Labels are its labels; empty when it does not exist.
	Labels map[string]string `json:"labels"`
	// Parameters are its parameters; empty when it does not exist.
	Parameters map[string]string `json:"parameters"`
}

// VolumeMountInfo is one mount of a volume in one container of the pod.
type VolumeMountInfo struct {
	// Container is the container's name.
	Container string `json:"container"`
	// ContainerKind is "container", "initContainer" or "ephemeralContainer".
	ContainerKind string `json:"containerKind"`
	// MountPath is where the volume is mounted in the container.
	MountPath string `json:"mountPath"`
	// Propagation is the mount's mountPropagation as the pod says it: "" (unset, which is None),
	// "None", "HostToContainer" or "Bidirectional".
	Propagation string `json:"propagation"`
}

// PropagationDecision is the decision for one volume of the pod.
type PropagationDecision struct {
	// Set is true when the webhook sets mountPropagation HostToContainer on the volume's mounts
	// whose propagation is unset or None; it never changes another value.
	Set bool `json:"set"`
	// Reason explains the decision to operators (logs, Events); required, never empty.
	Reason string `json:"reason"`
}

// PropagationDecisions are the decisions per volume name. A volume the policy does not name is
// left as it is.
type PropagationDecisions map[string]PropagationDecision

// MarshalJSON writes the input exactly as the propagation decision sees it.
func (in PropagationInput) MarshalJSON() ([]byte, error) {
	v, err := ast.JSON(in.astValue())
	if err != nil {
		return nil, fmt.Errorf("converting propagation input to JSON: %w", err)
	}
	return json.Marshal(v)
}

// astValue builds the input document. Empty maps and lists are written as {} and [] so that a
// policy reads them without a default.
func (in *PropagationInput) astValue() ast.Value {
	volumes := make([]*ast.Term, len(in.Volumes))
	for i, v := range in.Volumes {
		mounts := make([]*ast.Term, len(v.Mounts))
		for j, m := range v.Mounts {
			mounts[j] = ast.ObjectTerm(
				item("container", ast.StringTerm(m.Container)),
				item("containerKind", ast.StringTerm(m.ContainerKind)),
				item("mountPath", ast.StringTerm(m.MountPath)),
				item("propagation", ast.StringTerm(m.Propagation)),
			)
		}
		items := [][2]*ast.Term{
			item("name", ast.StringTerm(v.Name)),
			item("claim", ast.StringTerm(v.Claim)),
			item("persistentVolume", ast.StringTerm(v.PersistentVolume)),
			item("driver", ast.StringTerm(v.Driver)),
			item("mounts", ast.ArrayTerm(mounts...)),
		}
		if sc := v.StorageClass; sc != nil {
			items = append(items, item("storageClass", ast.ObjectTerm(
				item("name", ast.StringTerm(sc.Name)),
				item("labels", stringMapTerm(sc.Labels)),
				item("parameters", stringMapTerm(sc.Parameters)),
			)))
		}
		volumes[i] = ast.ObjectTerm(items...)
	}
	return ast.NewObject(
		item("pod", ast.ObjectTerm(
			item("namespace", ast.StringTerm(in.Pod.Namespace)),
			item("name", ast.StringTerm(in.Pod.Name)),
			item("generateName", ast.StringTerm(in.Pod.GenerateName)),
			item("ownerKind", ast.StringTerm(in.Pod.OwnerKind)),
			item("labels", stringMapTerm(in.Pod.Labels)),
		)),
		item("namespace", labeledTerm(in.Namespace)),
		item("volumes", ast.ArrayTerm(volumes...)),
	)
}

// validate checks what the webhook must hand over: a namespace and uniquely named volumes.
func (in *PropagationInput) validate() error {
	if in.Pod.Namespace == "" {
		return fmt.Errorf("%w: the pod has no namespace", ErrInvalidInput)
	}
	seen := make(map[string]bool, len(in.Volumes))
	for _, v := range in.Volumes {
		if v.Name == "" || seen[v.Name] {
			return fmt.Errorf("%w: volume name %q is empty or repeated", ErrInvalidInput, v.Name)
		}
		seen[v.Name] = true
	}
	return nil
}

// decodePropagation turns the policy's propagation output into decisions; anything but an
// object of the input's volume names to {set, reason} objects is an error that names the problem.
func decodePropagation(v ast.Value, in *PropagationInput) (PropagationDecisions, error) {
	obj, ok := v.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("%w: propagation is %s %v, want an object of volume names to {\"set\": bool, \"reason\": string}",
			ErrInvalidDecision, ast.ValueName(v), truncate(v.String(), 200))
	}
	out := make(PropagationDecisions, obj.Len())
	var err error
	obj.Foreach(func(k, val *ast.Term) {
		if err != nil {
			return
		}
		name, isStr := k.Value.(ast.String)
		if !isStr || !slices.ContainsFunc(in.Volumes, func(cv ClaimVolume) bool { return cv.Name == string(name) }) {
			err = fmt.Errorf("key %v is not the name of one of the pod's claim volumes", k)
			return
		}
		var d PropagationDecision
		if d, err = decodeVolumePropagation(val.Value); err != nil {
			err = fmt.Errorf("volume %s: %w", name, err)
			return
		}
		out[string(name)] = d
	})
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrInvalidDecision, truncate(v.String(), 200), err)
	}
	return out, nil
}

func decodeVolumePropagation(v ast.Value) (PropagationDecision, error) {
	obj, ok := v.(ast.Object)
	if !ok {
		return PropagationDecision{}, fmt.Errorf("%s %v is not an object with set and reason", ast.ValueName(v), truncate(v.String(), 100))
	}
	var d PropagationDecision
	var err error
	hasSet := false
	obj.Foreach(func(k, val *ast.Term) {
		if err != nil {
			return
		}
		key, _ := k.Value.(ast.String)
		switch string(key) {
		case "set":
			b, isBool := val.Value.(ast.Boolean)
			if !isBool {
				err = fmt.Errorf("set %v is not a boolean", val)
			}
			d.Set, hasSet = bool(b), true
		case "reason":
			s, isStr := val.Value.(ast.String)
			if !isStr || s == "" {
				err = fmt.Errorf("reason %v is not a non-empty string", val)
			}
			d.Reason = string(s)
		default:
			err = fmt.Errorf("unknown key %v (known: set, reason)", k)
		}
	})
	switch {
	case err != nil:
	case !hasSet:
		err = fmt.Errorf("set is missing")
	case d.Reason == "":
		err = fmt.Errorf("reason is missing")
	}
	return d, err
}

// DecidePropagation evaluates the propagation decision for one pod being created. It is never
// memoized. A policy set without a propagation rule decides nothing: every volume is left as it
// is (the map is empty, and NoRule reports it).
func (r *Revision) DecidePropagation(ctx context.Context, in *PropagationInput) (PropagationDecisions, error) {
	if err := in.validate(); err != nil {
		return nil, &EvalError{Kind: KindRuntime, Err: err}
	}
	return r.decidePropagation(ctx, in)
}

// decidePropagation runs the prepared propagation query once under the evaluation timeout.
func (r *Revision) decidePropagation(ctx context.Context, in *PropagationInput, opts ...rego.EvalOption) (PropagationDecisions, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	opts = append(opts, rego.EvalParsedInput(in.astValue()), rego.EvalGenerateJSON(rawValue))
	rs, err := r.propagationQuery.Eval(ctx, opts...)
	if err != nil {
		return nil, r.classify(ctx, err)
	}
	switch {
	case len(rs) == 0:
		return PropagationDecisions{}, nil
	case len(rs) > 1 || len(rs[0].Expressions) != 1:
		return nil, &EvalError{Kind: KindConflict, Err: fmt.Errorf("%w: %d results", ErrConflict, len(rs))}
	}
	v, ok := rs[0].Expressions[0].Value.(ast.Value)
	if !ok {
		return nil, &EvalError{Kind: KindInvalidOutput, Err: fmt.Errorf("%w: result of type %T", ErrInvalidDecision, rs[0].Expressions[0].Value)}
	}
	d, err := decodePropagation(v, in)
	if err != nil {
		return nil, &EvalError{Kind: KindInvalidOutput, Err: err}
	}
	return d, nil
}

// DefinesPropagation reports whether the revision defines the propagation rule; without it,
// DecidePropagation leaves every pod as it is, for the reason PropagationNoRule.
func (r *Revision) DefinesPropagation() bool { return r.hasPropagation }

// DecidePropagation returns the propagation decisions of the serving revision for one pod, and
// whether the serving revision defines the propagation rule at all.
func (e *Engine) DecidePropagation(ctx context.Context, in *PropagationInput) (PropagationDecisions, bool, error) {
	rev := e.Revision()
	d, err := rev.DecidePropagation(ctx, in)
	if err != nil {
		return nil, false, fmt.Errorf("policy revision %s, %s: %w", rev.id, PropagationQuery, err)
	}
	return d, rev.DefinesPropagation(), nil
}
