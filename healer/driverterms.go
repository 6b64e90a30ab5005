package healer

import (
	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
)

// driverInfo is the driver part of the policy input: the capabilities its sidecar reported and the
// CSI-Addons identity capabilities its CSIAddonsNode lists.
func driverInfo(caps *probe.Capabilities, n *csiaddonsv1alpha1.CSIAddonsNode) policy.DriverInfo {
	d := policy.DriverInfo{
		Name: caps.Driver,
		Healer: policy.HealerCapabilities{
			Probe: caps.Probe, Heal: caps.Heal, ListVolumes: caps.ListVolumes, Attributes: caps.Attributes,
			VolumeKeeping: policy.VolumeKeeping{
				PluginRestart:  caps.VolumeKeeping.PluginRestart,
				MounterRestart: caps.VolumeKeeping.MounterRestart,
			},
		},
		IdentityCapabilities: []string{},
		Tier:                 policy.TierOf(caps.Probe, caps.Heal, caps.ProbeSource),
		ProbeSource:          caps.ProbeSource,
	}
	if d.ProbeSource == "" {
		d.ProbeSource = probe.ProbeSourceDriver
	}
	if n != nil {
		d.IdentityCapabilities = append(d.IdentityCapabilities, n.Status.Capabilities...)
	}
	if d.Healer.Attributes == nil {
		d.Healer.Attributes = map[string]string{}
	}
	return d
}

// driverTerms remembers the driver part of the policy input, with its Rego form, for each
// capability answer and CSIAddonsNode: every volume of a node shares it. Entries are keyed by the
// objects themselves, which the capability cache and the target map replace rather than change,
// and the cache (policy.TermCache) is emptied when it outgrows maxDriverTerms, which bounds what
// replaced objects keep alive.
type driverTerms = policy.TermCache[driverKey, driverTerm]

// maxDriverTerms is more than the node plugins of the largest clusters Kubernetes supports.
const maxDriverTerms = 16384

// driverKey is one capability answer and the CSIAddonsNode it came with.
type driverKey struct {
	caps *probe.Capabilities
	node *csiaddonsv1alpha1.CSIAddonsNode
}

// driverTerm is the driver part of the policy input and its Rego form, with the remedies the
// driver, its sidecar and the controller allow, and theirs.
type driverTerm struct {
	info         policy.DriverInfo
	term         policy.Term
	remedies     policy.Remedies
	remediesTerm policy.Term
}

// newDriverTerms returns an empty cache of driver terms.
func newDriverTerms() *driverTerms { return policy.NewTermCache[driverKey, driverTerm](maxDriverTerms) }

// driverTermOf returns the driver part of the input; its maps and slices are shared: read-only.
// evict is the controller's Options.Evict, the same for every call of a Sweeper.
func driverTermOf(t *driverTerms, caps *probe.Capabilities, n *csiaddonsv1alpha1.CSIAddonsNode, evict bool) driverTerm {
	return t.Get(driverKey{caps, n}, func() driverTerm {
		d := driverTerm{info: driverInfo(caps, n)}
		d.term = policy.DriverTerm(&d.info)
		d.remedies = policy.Remedies{Heal: caps.Heal, RestartContainers: caps.ContainerRestart, Evict: evict}
		d.remediesTerm = policy.RemediesTerm(&d.remedies)
		return d
	})
}
