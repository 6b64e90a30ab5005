package probe

import (
	"testing"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// TestProbeSource: who probed, as the sidecar says it, reaches the capabilities and the probe
// result; an older sidecar, which says nothing, relayed the driver's probe.
func TestProbeSource(t *testing.T) {
	tests := map[string]struct {
		source healerv1alpha1.ProbeSource
		want   string
	}{
		"the sidecar":      {healerv1alpha1.ProbeSource_PROBE_SOURCE_SIDECAR, ProbeSourceSidecar},
		"the driver":       {healerv1alpha1.ProbeSource_PROBE_SOURCE_DRIVER, ProbeSourceDriver},
		"an older sidecar": {healerv1alpha1.ProbeSource_PROBE_SOURCE_UNSPECIFIED, ProbeSourceDriver},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			caps, err := capabilitiesOf(&healerv1alpha1.NodeGetHealerCapabilitiesResponse{DriverName: "d", ProbeSource: tc.source}, Target{Driver: "d"})
			if err != nil || caps.ProbeSource != tc.want {
				t.Fatalf("capabilities: %+v, %v; want probe source %q", caps, err, tc.want)
			}
			r, err := probeResult(&healerv1alpha1.NodeProbeVolumeResponse{VolumeId: "vol-1", ProbeSource: tc.source})
			if err != nil || r.ProbeSource != tc.want {
				t.Fatalf("probe result: %+v, %v; want probe source %q", r, err, tc.want)
			}
		})
	}
}
