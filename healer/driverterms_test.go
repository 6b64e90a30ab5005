package healer

import (
	"testing"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
)

// TestDriverTier checks the tier and probe source the policy reads for each kind of driver.
func TestDriverTier(t *testing.T) {
	tests := map[string]struct {
		caps                 probe.Capabilities
		wantTier, wantSource string
	}{
		"the driver probes and heals": {
			caps:     probe.Capabilities{Probe: true, Heal: true, ProbeSource: probe.ProbeSourceDriver},
			wantTier: policy.TierHealer, wantSource: "driver",
		},
		"the driver probes only": {
			caps:     probe.Capabilities{Probe: true, ProbeSource: probe.ProbeSourceDriver},
			wantTier: policy.TierProbeOnly, wantSource: "driver",
		},
		"the driver serves no Healer: the sidecar probes": {
			caps:     probe.Capabilities{Probe: true, ListVolumes: true, ProbeSource: probe.ProbeSourceSidecar},
			wantTier: policy.TierNone, wantSource: "sidecar",
		},
		"an older sidecar names no source: the driver probed": {
			caps:     probe.Capabilities{Probe: true},
			wantTier: policy.TierProbeOnly, wantSource: "driver",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := driverInfo(&tc.caps, nil)
			if d.Tier != tc.wantTier || d.ProbeSource != tc.wantSource {
				t.Fatalf("tier %q, probe source %q; want %q, %q", d.Tier, d.ProbeSource, tc.wantTier, tc.wantSource)
			}
		})
	}
}
