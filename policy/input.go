package policy

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Trigger says why a volume is being looked at.
type Trigger string

const (
	// TriggerRestart is a sweep after a node plugin (re)started: its userspace mounters may have died
	// with it.
	TriggerRestart Trigger = "restart"
	// TriggerSchedule is a periodic sweep.
	TriggerSchedule Trigger = "schedule"
	// TriggerManual is a sweep an operator asked for.
	TriggerManual Trigger = "manual"
)

// Valid reports whether t is one of the documented triggers.
func (t Trigger) Valid() bool {
	return t == TriggerRestart || t == TriggerSchedule || t == TriggerManual
}

// HealthStatus is the CSI VolumeHealth status vocabulary.
type HealthStatus string

const (
	// HealthDegraded means the volume works with reduced function or performance.
	HealthDegraded HealthStatus = "DEGRADED"
	// HealthInaccessible means the volume cannot be used, for example because its mount is gone.
	HealthInaccessible HealthStatus = "INACCESSIBLE"
	// HealthDataLoss means data on the volume may be lost. Never healed automatically by the default
	// policy.
	HealthDataLoss HealthStatus = "DATA_LOSS"
)

// Input is the document a policy sees as `input`. The controller builds one per volume and
// evaluates the policy twice: first without Probe (probe, heal or skip?), then, when the first
// answer was probe, with the probe result (heal or skip?).
//
// The JSON form (field names below) is the Rego form. Absent optional parts are left out rather
// than null, and maps and lists are always present (empty when there is nothing), so a policy can
// write `input.volume.attributes.mounter` or `count(input.volume.mountOptions)` without guards.
type Input struct {
	// Trigger is why the volume is looked at: "restart", "schedule" or "manual".
	Trigger Trigger `json:"trigger"`
	// Volume describes the PersistentVolume and what it is bound to.
	Volume Volume `json:"volume"`
	// Attachment is the volume's VolumeAttachment; absent for drivers that need no attach step
	// (CSIDriver attachRequired: false, such as CephFS).
	Attachment *Attachment `json:"attachment,omitempty"`
	// Node is the node the volume is used on; absent when not known.
	Node *Node `json:"node,omitempty"`
	// Driver is what the CSI driver advertises about itself.
	Driver DriverInfo `json:"driver"`
	// History is what the controller remembers about earlier probes and heals of this volume.
	History History `json:"history"`
	// Probe is the result of probing the volume; present only in the second evaluation.
	Probe *ProbeResult `json:"probe,omitempty"`
	// Remedies says which remedies the driver, its sidecar and the controller's configuration
	// allow for the volume on its node.
	Remedies Remedies `json:"remedies"`

	// Terms are parts of the input already in their Rego form, shared with other inputs, which
	// the engine takes instead of converting the fields they stand for (see InputTerms). The
	// zero value converts every field.
	Terms InputTerms `json:"-"`
}

// Volume describes a PersistentVolume.
type Volume struct {
	// PV is the PersistentVolume name.
	PV string `json:"pv"`
	// Handle is the CSI volume handle.
	Handle string `json:"handle"`
	// Driver is the CSI driver name from the PV.
	Driver string `json:"driver"`
	// Attributes are the PV's spec.csi.volumeAttributes (for Ceph RBD, `mounter: rbd-nbd` selects
	// the userspace mounter).
	Attributes map[string]string `json:"attributes"`
	// MountOptions are the PV's spec.mountOptions.
	MountOptions []string `json:"mountOptions"`
	// AccessModes are the PV's spec.accessModes, such as "ReadWriteOnce".
	AccessModes []string `json:"accessModes"`
	// StorageClass is the PV's StorageClass; absent when the PV names none.
	StorageClass *StorageClass `json:"storageClass,omitempty"`
	// PVC is the claim the PV is bound to; absent when the PV is not bound.
	PVC *Claim `json:"pvc,omitempty"`
}

// StorageClass is the part of a StorageClass a policy sees.
type StorageClass struct {
	// Name is the StorageClass name.
	Name string `json:"name"`
	// Parameters are the StorageClass parameters; empty when the StorageClass no longer exists.
	Parameters map[string]string `json:"parameters"`
}

// Claim is the part of a PersistentVolumeClaim a policy sees.
type Claim struct {
	// Namespace is the claim's namespace.
	Namespace string `json:"namespace"`
	// Name is the claim's name.
	Name string `json:"name"`
	// Labels are the claim's labels.
	Labels map[string]string `json:"labels"`
	// Annotations are the claim's annotations.
	Annotations map[string]string `json:"annotations"`
}

// Attachment is the state of the volume's VolumeAttachment.
type Attachment struct {
	// Node is the node the volume is attached to.
	Node string `json:"node"`
	// Attached is the VolumeAttachment's status.attached.
	Attached bool `json:"attached"`
	// Detaching is true once the VolumeAttachment is being deleted.
	Detaching bool `json:"detaching"`
}

// Node is the part of a Node a policy sees.
type Node struct {
	// Name is the node name.
	Name string `json:"name"`
	// Labels are the node's labels.
	Labels map[string]string `json:"labels"`
}

// DriverInfo is what a CSI driver advertises: its CSI-Addons identity capabilities and its healer
// capabilities.
type DriverInfo struct {
	// Name is the CSI driver name.
	Name string `json:"name"`
	// IdentityCapabilities are the driver's CSI-Addons identity capabilities as strings, such as
	// "SERVICE:NODE_SERVICE".
	IdentityCapabilities []string `json:"identityCapabilities"`
	// Healer is what the driver's healer service supports.
	Healer HealerCapabilities `json:"healer"`
	// Tier is what volume-healer gets from the driver on the node: TierHealer (the driver heals
	// its volumes), TierProbeOnly (it probes them and does not heal), TierNone (it serves neither:
	// the sidecar probes its volumes itself, node-locally, and only remedies outside the driver
	// are left).
	Tier string `json:"tier"`
	// ProbeSource is who probes the driver's volumes on the node: "driver", or "sidecar" when the
	// driver does not and the sidecar probes them itself.
	ProbeSource string `json:"probeSource"`
}

// The tiers of DriverInfo.Tier.
const (
	TierHealer    = "healer"
	TierProbeOnly = "probe-only"
	TierNone      = "none"
)

// TierOf is the tier of a driver that advertises probe and heal, whose volumes probeSource
// ("driver" or "sidecar") probes.
func TierOf(probe, heal bool, probeSource string) string {
	switch {
	case heal:
		return TierHealer
	case probe && probeSource != "sidecar":
		return TierProbeOnly
	default:
		return TierNone
	}
}

// Remedies says which remedies are allowed for a volume on its node, least disruptive first. The
// decision picks among them: heal needs Heal, recycle needs Evict, and a pod's restartContainers
// needs RestartContainers (the controller checks again before it acts).
type Remedies struct {
	// Heal is true when the driver heals volumes on the node (it serves HEAL).
	Heal bool `json:"heal"`
	// RestartContainers is true when the node's healer sidecar can restart a pod's containers in
	// place (its capabilities answered container_restart: it was given the container runtime's
	// socket, which the chart grants only when the operator opts in).
	RestartContainers bool `json:"restartContainers"`
	// Evict is true when the controller may evict pods: evictions are configured on and the
	// controller does not run in dry-run mode.
	Evict bool `json:"evict"`
}

// HealerCapabilities is the driver's answer to the healer capability call.
type HealerCapabilities struct {
	// Probe is true when the driver can probe a volume.
	Probe bool `json:"probe"`
	// Heal is true when the driver can heal a volume.
	Heal bool `json:"heal"`
	// ListVolumes is true when the driver can list the volumes staged on its node.
	ListVolumes bool `json:"listVolumes"`
	// Attributes are free-form attributes the driver publishes, such as
	// "healMounters": "rbd-nbd,fuse".
	Attributes map[string]string `json:"attributes"`
	// VolumeKeeping says which restarts the driver's kept volumes live through (its
	// VolumeKeeping capabilities); a probe says which volumes are kept (ProbeResult.Kept).
	VolumeKeeping VolumeKeeping `json:"volumeKeeping"`
}

// VolumeKeeping is the restarts a driver's kept volumes live through: their mounters run
// outside the node plugin (driverkit's mount supervisor), and a new mounter may take over the
// live connection of a dead one.
type VolumeKeeping struct {
	// PluginRestart is true when a restart of the node plugin kills no mounter of a kept volume.
	PluginRestart bool `json:"pluginRestart"`
	// MounterRestart is true when a new mounter takes over the live connection of a kept volume
	// whose mounter died or was upgraded.
	MounterRestart bool `json:"mounterRestart"`
}

// History is what the controller remembers about a volume.
type History struct {
	// LastProbe is the most recent probe; absent when the volume was never probed.
	LastProbe *ProbeRecord `json:"lastProbe,omitempty"`
	// ConsecutiveFailures counts failed probes and heals since the last success.
	ConsecutiveFailures int `json:"consecutiveFailures"`
	// LastHeal is when the volume was last healed; absent when it never was. RFC 3339 in Rego.
	LastHeal *time.Time `json:"lastHeal,omitempty"`
}

// ProbeRecord is a remembered probe.
type ProbeRecord struct {
	// Time is when the probe ran. RFC 3339 in Rego (time.parse_rfc3339_ns reads it).
	Time time.Time `json:"time"`
	// Healthy is the probe's verdict.
	Healthy bool `json:"healthy"`
	// Health lists the problems found.
	Health []Health `json:"health"`
}

// ProbeResult is the driver's answer to a probe, handed to the second evaluation.
type ProbeResult struct {
	// Healthy is true when the driver found nothing wrong.
	Healthy bool `json:"healthy"`
	// Health lists the problems found, in the CSI VolumeHealth vocabulary.
	Health []Health `json:"health"`
	// Healable is the driver's statement whether this volume can be healed at all.
	Healable bool `json:"healable"`
	// RecheckAfterSeconds is the driver's hint to probe again after that many seconds; 0 means none.
	RecheckAfterSeconds int64 `json:"recheckAfterSeconds"`
	// Kept is true when the driver keeps the volume alive across the restarts
	// driver.healer.volumeKeeping names: its mounter runs outside the node plugin. It says how
	// the volume is served, not that it is healthy.
	Kept bool `json:"kept"`
}

// Health is one problem a probe found.
type Health struct {
	// Status is DEGRADED, INACCESSIBLE or DATA_LOSS.
	Status HealthStatus `json:"status"`
	// Reason is a CamelCase reason, such as "MountGone".
	Reason string `json:"reason"`
	// Message is a human-readable explanation.
	Message string `json:"message"`
}

// validate checks what the engine relies on before evaluating.
func (in *Input) validate() error {
	if !in.Trigger.Valid() {
		return fmt.Errorf("%w: trigger %q is not one of restart, schedule, manual", ErrInvalidInput, in.Trigger)
	}
	return nil
}

// MarshalJSON writes the input exactly as the policy sees it.
func (in Input) MarshalJSON() ([]byte, error) {
	v, err := ast.JSON(in.astValue())
	if err != nil {
		return nil, fmt.Errorf("converting policy input to JSON: %w", err)
	}
	return json.Marshal(v)
}

// RegoValue returns the input as the policy sees it, the parts in Terms included.
func (in *Input) RegoValue() ast.Value { return in.astValue() }

// formatTime is how times reach Rego: RFC 3339 in UTC, with as many fractional digits as needed.
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// astValue converts the input to the Rego value the policy evaluates against. It builds the value
// directly, without a JSON round trip, because it runs for every evaluation that misses the memo,
// and takes the parts in Terms as they are.
func (in *Input) astValue() ast.Value {
	items := make([][2]*ast.Term, 0, 8)
	items = append(items,
		ast.Item(keyTrigger, triggerTerm(in.Trigger)),
		ast.Item(keyVolume, ast.NewTerm(in.Volume.astValue(&in.Terms))),
	)
	if in.Attachment != nil {
		t := in.Terms.Attachment.term()
		if t == nil {
			t = in.Attachment.term()
		}
		items = append(items, ast.Item(keyAttachment, t))
	}
	if in.Node != nil {
		t := in.Terms.Node.term()
		if t == nil {
			t = in.Node.term()
		}
		items = append(items, ast.Item(keyNode, t))
	}
	driver := in.Terms.Driver.term()
	if driver == nil {
		driver = in.Driver.term()
	}
	items = append(items, ast.Item(keyDriver, driver), ast.Item(keyHistory, in.History.term()))
	remedies := in.Terms.Remedies.term()
	if remedies == nil {
		remedies = in.Remedies.term()
	}
	items = append(items, ast.Item(keyRemedies, remedies))
	if in.Probe != nil {
		items = append(items, ast.Item(keyProbe, ast.ObjectTerm(
			ast.Item(keyHealthy, ast.InternedTerm(in.Probe.Healthy)),
			ast.Item(keyHealth, healthTerm(in.Probe.Health)),
			ast.Item(keyHealable, ast.InternedTerm(in.Probe.Healable)),
			ast.Item(keyRecheckAfterSeconds, ast.InternedTerm(in.Probe.RecheckAfterSeconds)),
			ast.Item(keyKept, ast.InternedTerm(in.Probe.Kept)),
		)))
	}
	return ast.NewObject(items...)
}

// mapOr returns the prebuilt term when it is set, or else the Rego form of m.
func mapOr(t Term, m map[string]string) *ast.Term {
	if term := t.term(); term != nil {
		return term
	}
	return stringMapTerm(m)
}

// stringsOr returns the prebuilt term when it is set, or else the Rego form of s.
func stringsOr(t Term, s []string) *ast.Term {
	if term := t.term(); term != nil {
		return term
	}
	return stringsTerm(s)
}

func (v *Volume) astValue(terms *InputTerms) ast.Value {
	// The volume's own strings, their terms in one allocation.
	strs := make([]ast.Term, 5)
	str := func(i int, s string) *ast.Term {
		strs[i].Value = ast.String(s)
		return &strs[i]
	}
	items := make([][2]*ast.Term, 0, 8)
	items = append(items,
		ast.Item(keyPV, str(0, v.PV)),
		ast.Item(keyHandle, str(1, v.Handle)),
		ast.Item(keyDriver, str(2, v.Driver)),
		ast.Item(keyAttributes, mapOr(terms.Attributes, v.Attributes)),
		ast.Item(keyMountOptions, stringsOr(terms.MountOptions, v.MountOptions)),
		ast.Item(keyAccessModes, stringsOr(terms.AccessModes, v.AccessModes)),
	)
	if v.StorageClass != nil {
		t := terms.StorageClass.term()
		if t == nil {
			t = v.StorageClass.term()
		}
		items = append(items, ast.Item(keyStorageClass, t))
	}
	if c := v.PVC; c != nil {
		items = append(items, ast.Item(keyPVC, ast.ObjectTerm(
			ast.Item(keyNamespace, str(3, c.Namespace)),
			ast.Item(keyName, str(4, c.Name)),
			ast.Item(keyLabels, mapOr(terms.ClaimLabels, c.Labels)),
			ast.Item(keyAnnotations, mapOr(terms.ClaimAnnotations, c.Annotations)),
		)))
	}
	return ast.NewObject(items...)
}

func (sc *StorageClass) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyName, ast.StringTerm(sc.Name)),
		ast.Item(keyParameters, stringMapTerm(sc.Parameters)),
	)
}

func (a *Attachment) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyNode, ast.StringTerm(a.Node)),
		ast.Item(keyAttached, ast.InternedTerm(a.Attached)),
		ast.Item(keyDetaching, ast.InternedTerm(a.Detaching)),
	)
}

func (n *Node) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyName, ast.StringTerm(n.Name)),
		ast.Item(keyLabels, stringMapTerm(n.Labels)),
	)
}

func (d *DriverInfo) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyName, ast.StringTerm(d.Name)),
		ast.Item(keyIdentityCapabilities, stringsTerm(d.IdentityCapabilities)),
		ast.Item(keyHealer, ast.ObjectTerm(
			ast.Item(keyProbe, ast.InternedTerm(d.Healer.Probe)),
			ast.Item(keyHeal, ast.InternedTerm(d.Healer.Heal)),
			ast.Item(keyListVolumes, ast.InternedTerm(d.Healer.ListVolumes)),
			ast.Item(keyAttributes, stringMapTerm(d.Healer.Attributes)),
			ast.Item(keyVolumeKeeping, ast.ObjectTerm(
				ast.Item(keyPluginRestart, ast.InternedTerm(d.Healer.VolumeKeeping.PluginRestart)),
				ast.Item(keyMounterRestart, ast.InternedTerm(d.Healer.VolumeKeeping.MounterRestart)),
			)),
		)),
		ast.Item(keyTier, ast.StringTerm(d.Tier)),
		ast.Item(keyProbeSource, ast.StringTerm(d.ProbeSource)),
	)
}

func (r *Remedies) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyHeal, ast.InternedTerm(r.Heal)),
		ast.Item(keyRestartContainers, ast.InternedTerm(r.RestartContainers)),
		ast.Item(keyEvict, ast.InternedTerm(r.Evict)),
	)
}

func (h *History) term() *ast.Term {
	if h.LastProbe == nil && h.LastHeal == nil && h.ConsecutiveFailures == 0 {
		return freshHistoryTerm
	}
	items := make([][2]*ast.Term, 0, 3)
	if h.LastProbe != nil {
		items = append(items, ast.Item(keyLastProbe, ast.ObjectTerm(
			ast.Item(keyTime, ast.StringTerm(formatTime(h.LastProbe.Time))),
			ast.Item(keyHealthy, ast.InternedTerm(h.LastProbe.Healthy)),
			ast.Item(keyHealth, healthTerm(h.LastProbe.Health)),
		)))
	}
	items = append(items, ast.Item(keyConsecutiveFailures, ast.InternedTerm(h.ConsecutiveFailures)))
	if h.LastHeal != nil {
		items = append(items, ast.Item(keyLastHeal, ast.StringTerm(formatTime(*h.LastHeal))))
	}
	return ast.ObjectTerm(items...)
}

func stringMapTerm(m map[string]string) *ast.Term {
	if len(m) == 0 {
		return emptyObjectTerm
	}
	obj := ast.NewObjectWithCapacity(len(m))
	for k, v := range m {
		obj.Insert(ast.StringTerm(k), ast.StringTerm(v))
	}
	return ast.NewTerm(obj)
}

func stringsTerm(s []string) *ast.Term {
	if len(s) == 0 {
		return emptyArrayTerm
	}
	terms := make([]*ast.Term, len(s))
	for i, x := range s {
		terms[i] = ast.StringTerm(x)
	}
	return ast.ArrayTerm(terms...)
}

func healthTerm(hs []Health) *ast.Term {
	if len(hs) == 0 {
		return emptyArrayTerm
	}
	terms := make([]*ast.Term, len(hs))
	for i := range hs {
		terms[i] = ast.ObjectTerm(
			ast.Item(keyStatus, ast.StringTerm(string(hs[i].Status))),
			ast.Item(keyReason, ast.StringTerm(hs[i].Reason)),
			ast.Item(keyMessage, ast.StringTerm(hs[i].Message)),
		)
	}
	return ast.ArrayTerm(terms...)
}

func item(key string, value *ast.Term) [2]*ast.Term {
	return [2]*ast.Term{ast.InternedTerm(key), value}
}
