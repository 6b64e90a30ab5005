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

// TestRemediesOfTheInput checks input.remedies for each kind of driver and sidecar: heal from the
// driver's HEAL, restartContainers from the sidecar's container_restart, evict from the
// controller's configuration, and that the Rego form the policy reads says the same.
func TestRemediesOfTheInput(t *testing.T) {
	tests := map[string]struct {
		caps  probe.Capabilities
		evict bool
		want  policy.Remedies
	}{
		"a healing driver, a sidecar with CRI access, evictions on": {
			caps: probe.Capabilities{Probe: true, Heal: true, ContainerRestart: true}, evict: true,
			want: policy.Remedies{Heal: true, RestartContainers: true, Evict: true},
		},
		"a stock driver, evictions on": {
			caps: probe.Capabilities{Probe: true, ProbeSource: probe.ProbeSourceSidecar}, evict: true,
			want: policy.Remedies{Evict: true},
		},
		"a healing driver, evictions off": {
			caps: probe.Capabilities{Probe: true, Heal: true},
			want: policy.Remedies{Heal: true},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := driverTermOf(newDriverTerms(), &tc.caps, nil, tc.evict)
			if d.remedies != tc.want {
				t.Fatalf("remedies %+v, want %+v", d.remedies, tc.want)
			}
			in := policy.Input{Trigger: policy.TriggerRestart, Remedies: d.remedies}
			withTerm := in
			withTerm.Terms.Remedies = d.remediesTerm
			if in.RegoValue().Compare(withTerm.RegoValue()) != 0 {
				t.Errorf("the Rego form of the remedies differs from the field: %v, %v", withTerm.RegoValue(), in.RegoValue())
			}
		})
	}
}
