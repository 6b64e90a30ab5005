package probe

import (
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	healerv1alpha1 "github.com/volume-healer/volume-healer/api/healer/v1alpha1"
)

// FuzzDriverResponses feeds arbitrary bytes, decoded as each answer a sidecar relays from its
// driver, to the client's conversions: none may panic; what they accept keeps the protocol's
// promises (every health entry has a status and a reason, a recheck hint is positive), and what
// they refuse is ErrMalformed.
func FuzzDriverResponses(f *testing.F) {
	seeds := []proto.Message{
		&healerv1alpha1.NodeProbeVolumeResponse{Healable: true, VolumeId: "0001-abc", RecheckAfter: durationpb.New(30e9),
			HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "MountGone"}}},
		&healerv1alpha1.NodeProbeVolumeResponse{RecheckAfter: &durationpb.Duration{Seconds: -5}},
		&healerv1alpha1.NodeProbeVolumeResponse{RecheckAfter: &durationpb.Duration{Seconds: 1, Nanos: -1}},
		&healerv1alpha1.NodeHealVolumeResponse{VolumeId: "v", HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: 99, Reason: "Future"}}},
		&healerv1alpha1.NodeHealVolumeResponse{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DATA_LOSS}}},
		&healerv1alpha1.NodeGetHealerCapabilitiesResponse{DriverName: "rbd.csi.ceph.com", Attributes: map[string]string{"mounter": "rbd-nbd"}},
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0x01})
	check := func(t *testing.T, r *Result, err error) {
		t.Helper()
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("refused with %v, want ErrMalformed", err)
			}
			return
		}
		for i, h := range r.Health {
			if h.Status == "" || h.Reason == "" {
				t.Fatalf("accepted health entry %d without status or reason: %+v", i, h)
			}
		}
		if r.RecheckAfter < 0 {
			t.Fatalf("accepted a negative recheck hint %s", r.RecheckAfter)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var probe healerv1alpha1.NodeProbeVolumeResponse
		if proto.Unmarshal(data, &probe) == nil {
			r, err := probeResult(&probe)
			check(t, r, err)
		}
		var heal healerv1alpha1.NodeHealVolumeResponse
		if proto.Unmarshal(data, &heal) == nil {
			r, err := healResult(&heal)
			check(t, r, err)
		}
		var caps healerv1alpha1.NodeGetHealerCapabilitiesResponse
		if proto.Unmarshal(data, &caps) == nil {
			target := Target{Driver: "rbd.csi.ceph.com", Node: "node-a", Endpoint: "10.0.0.1:9072"}
			c, err := capabilitiesOf(&caps, target)
			switch {
			case err != nil && !errors.Is(err, ErrMalformed):
				t.Fatalf("capabilities refused with %v, want ErrMalformed", err)
			case err == nil && c.Driver != target.Driver:
				t.Fatalf("accepted capabilities of driver %q for %q", c.Driver, target.Driver)
			}
		}
	})
}
