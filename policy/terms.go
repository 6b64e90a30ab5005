package policy

import (
	"github.com/open-policy-agent/opa/v1/ast"
)

// Most of an input is the same for many volumes: the driver's description is the same for every
// volume of a node, the node and its attachment state for every volume on it, a StorageClass for
// every volume of the class, and label and attribute sets repeat across the claims of an
// application. Converting them to Rego for every evaluation that misses the memo costs more
// allocations than OPA's own evaluation of a small policy. A builder that knows which parts are
// shared (the planner does: its records share them) converts each once into a Term and hands it
// over in Input.Terms; the engine then builds only the per-volume part of the value.

// Term is a part of an input in its Rego form, built once and shared by the inputs that carry
// it, or built only when an evaluation needs it (LazyTerm). The zero Term is unset. A Term is
// immutable and safe for concurrent use.
type Term struct {
	t     *ast.Term
	build func() Term
}

// LazyTerm returns a Term that build makes when an evaluation needs it, and not when the memo
// answers: for a part that is the volume's own, such as an attribute set with the volume's image
// name, which would cost more to convert for every volume than the memo saves.
func LazyTerm(build func() Term) Term { return Term{build: build} }

// IsSet reports whether t holds a value.
func (t Term) IsSet() bool { return t.t != nil || t.build != nil }

// term returns the Rego form, building it when it is lazy; nil when t is unset.
func (t Term) term() *ast.Term {
	if t.t == nil && t.build != nil {
		return t.build().term()
	}
	return t.t
}

// InputTerms are parts of an input already in their Rego form. A part that is set is used in
// place of the field it stands for, so it must be the Rego form of that field's value, built
// with the constructor named beside it (or a LazyTerm that calls it); whoever changes the field
// afterwards must unset it. A part left unset is converted from the field at each evaluation.
type InputTerms struct {
	// Attributes stands for Volume.Attributes: StringMapTerm or ExtendStringMapTerm.
	Attributes Term
	// MountOptions stands for Volume.MountOptions: StringsTerm.
	MountOptions Term
	// AccessModes stands for Volume.AccessModes: StringsTerm.
	AccessModes Term
	// StorageClass stands for Volume.StorageClass, which must be set: StorageClassTerm.
	StorageClass Term
	// ClaimLabels and ClaimAnnotations stand for Volume.PVC.Labels and Volume.PVC.Annotations:
	// StringMapTerm or ExtendStringMapTerm.
	ClaimLabels, ClaimAnnotations Term
	// Attachment stands for Attachment, which must be set: AttachmentTerm.
	Attachment Term
	// Node stands for Node, which must be set: NodeTerm.
	Node Term
	// Driver stands for Driver: DriverTerm.
	Driver Term
	// Remedies stands for Remedies: RemediesTerm.
	Remedies Term
}

// StringMapTerm returns the Rego form of m: an object of strings, empty when m is.
func StringMapTerm(m map[string]string) Term { return Term{t: stringMapTerm(m)} }

// ExtendStringMapTerm returns the Rego form of the entries of base, a StringMapTerm or unset
// (no entries), together with n more entries, the i-th of which entry(i) returns. The entries of
// base are reused, not converted again. Keys must not repeat.
func ExtendStringMapTerm(base Term, n int, entry func(i int) (key, value string)) Term {
	var obj ast.Object
	if bt := base.term(); bt != nil {
		b := bt.Value.(ast.Object)
		obj = ast.NewObjectWithCapacity(b.Len() + n)
		b.Foreach(obj.Insert)
	} else {
		obj = ast.NewObjectWithCapacity(n)
	}
	for i := range n {
		k, v := entry(i)
		obj.Insert(ast.StringTerm(k), ast.StringTerm(v))
	}
	return Term{t: ast.NewTerm(obj)}
}

// StringsTerm returns the Rego form of s: an array of strings.
func StringsTerm(s []string) Term { return Term{t: stringsTerm(s)} }

// StorageClassTerm returns the Rego form of sc.
func StorageClassTerm(sc *StorageClass) Term { return Term{t: sc.term()} }

// AttachmentTerm returns the Rego form of a.
func AttachmentTerm(a *Attachment) Term { return Term{t: a.term()} }

// NodeTerm returns the Rego form of n.
func NodeTerm(n *Node) Term { return Term{t: n.term()} }

// DriverTerm returns the Rego form of d.
func DriverTerm(d *DriverInfo) Term { return Term{t: d.term()} }

// RemediesTerm returns the Rego form of r.
func RemediesTerm(r *Remedies) Term { return Term{t: r.term()} }

// Keys of the input document, converted once: every input has them.
var (
	keyTrigger              = ast.StringTerm("trigger")
	keyVolume               = ast.StringTerm("volume")
	keyAttachment           = ast.StringTerm("attachment")
	keyNode                 = ast.StringTerm("node")
	keyDriver               = ast.StringTerm("driver")
	keyHistory              = ast.StringTerm("history")
	keyProbe                = ast.StringTerm("probe")
	keyPV                   = ast.StringTerm("pv")
	keyHandle               = ast.StringTerm("handle")
	keyAttributes           = ast.StringTerm("attributes")
	keyMountOptions         = ast.StringTerm("mountOptions")
	keyAccessModes          = ast.StringTerm("accessModes")
	keyStorageClass         = ast.StringTerm("storageClass")
	keyPVC                  = ast.StringTerm("pvc")
	keyNamespace            = ast.StringTerm("namespace")
	keyName                 = ast.StringTerm("name")
	keyLabels               = ast.StringTerm("labels")
	keyAnnotations          = ast.StringTerm("annotations")
	keyParameters           = ast.StringTerm("parameters")
	keyAttached             = ast.StringTerm("attached")
	keyDetaching            = ast.StringTerm("detaching")
	keyIdentityCapabilities = ast.StringTerm("identityCapabilities")
	keyHealer               = ast.StringTerm("healer")
	keyHeal                 = ast.StringTerm("heal")
	keyListVolumes          = ast.StringTerm("listVolumes")
	keyTier                 = ast.StringTerm("tier")
	keyProbeSource          = ast.StringTerm("probeSource")
	keyLastProbe            = ast.StringTerm("lastProbe")
	keyTime                 = ast.StringTerm("time")
	keyHealthy              = ast.StringTerm("healthy")
	keyHealth               = ast.StringTerm("health")
	keyConsecutiveFailures  = ast.StringTerm("consecutiveFailures")
	keyLastHeal             = ast.StringTerm("lastHeal")
	keyHealable             = ast.StringTerm("healable")
	keyRecheckAfterSeconds  = ast.StringTerm("recheckAfterSeconds")
	keyStatus               = ast.StringTerm("status")
	keyReason               = ast.StringTerm("reason")
	keyMessage              = ast.StringTerm("message")
	keyRemedies             = ast.StringTerm("remedies")
	keyRestartContainers    = ast.StringTerm("restartContainers")
	keyEvict                = ast.StringTerm("evict")
	keyVolumeKeeping        = ast.StringTerm("volumeKeeping")
	keyPluginRestart        = ast.StringTerm("pluginRestart")
	keyMounterRestart       = ast.StringTerm("mounterRestart")
	keyKept                 = ast.StringTerm("kept")
)

// triggerTerms are the Rego forms of the documented triggers.
var triggerTerms = map[Trigger]*ast.Term{
	TriggerRestart:  ast.StringTerm(string(TriggerRestart)),
	TriggerSchedule: ast.StringTerm(string(TriggerSchedule)),
	TriggerManual:   ast.StringTerm(string(TriggerManual)),
}

func triggerTerm(t Trigger) *ast.Term {
	if term, ok := triggerTerms[t]; ok {
		return term
	}
	return ast.StringTerm(string(t))
}

// freshHistoryTerm is the history of a volume never probed, healed or failed: most volumes of
// most sweeps.
var freshHistoryTerm = ast.ObjectTerm(ast.Item(keyConsecutiveFailures, ast.InternedTerm(0)))

// The empty object and array, which many parts of many inputs are.
var (
	emptyObjectTerm = ast.ObjectTerm()
	emptyArrayTerm  = ast.ArrayTerm()
)
