package sanity

import healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"

// Tier is what volume-healer gets from a driver, by what the driver serves on its CSI-Addons
// socket. The values are those of the policy input's driver.tier (docs/policy.md), which the
// controller derives from the sidecar's capabilities answer the same way.
type Tier string

const (
	// TierHealer: the driver serves the Healer service with HEAL: volume-healer probes through
	// it and heals its volumes in place.
	TierHealer Tier = "healer"
	// TierProbeOnly: the driver serves PROBE and no HEAL: volume-healer probes through it and
	// cannot heal in place.
	TierProbeOnly Tier = "probe-only"
	// TierNone: the driver serves no Healer service, or one with neither PROBE nor HEAL: the
	// healer sidecar probes its volumes itself, on the node, and nothing heals them in place.
	TierNone Tier = "none"
)

// tierOf is the tier of a driver that advertises caps.
func tierOf(caps []*healerv1alpha1.HealerCapability) Tier {
	switch {
	case healerv1alpha1.HasRPC(caps, healerv1alpha1.HealerCapability_RPC_HEAL):
		return TierHealer
	case healerv1alpha1.HasRPC(caps, healerv1alpha1.HealerCapability_RPC_PROBE):
		return TierProbeOnly
	default:
		return TierNone
	}
}

// Describe says in one sentence what the tier means for the driver's volumes.
func (t Tier) Describe() string {
	switch t {
	case TierHealer:
		return "the driver serves the Healer service with HEAL: volume-healer probes its volumes through it and heals them in place"
	case TierProbeOnly:
		return "the driver serves PROBE and no HEAL: volume-healer probes its volumes through it and cannot heal them in place"
	case TierNone:
		return "the driver serves no Healer probe: the healer sidecar probes its volumes itself, on the node, and nothing heals them in place"
	default:
		return "unknown: the driver's Healer capabilities could not be read"
	}
}
