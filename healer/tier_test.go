package healer

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
)

// The tier the driver gets on a node is recorded on its CSIAddonsNode from the capabilities the
// sidecar answered, for healerctl status; a sweep that finds it in place writes nothing.
func TestTierIsRecordedOnTheCSIAddonsNode(t *testing.T) {
	tests := map[string]struct {
		volumes int
		caps    probe.Capabilities
		want    DriverTier
	}{
		"a driver that probes and heals": {
			volumes: 2,
			caps:    probe.Capabilities{Driver: "rbd", Probe: true, Heal: true, ListVolumes: true, ProbeSource: probe.ProbeSourceDriver},
			want:    DriverTier{Tier: "healer", ProbeSource: "driver"},
		},
		"a driver that probes only": {
			volumes: 2,
			caps:    probe.Capabilities{Driver: "rbd", Probe: true, ProbeSource: probe.ProbeSourceDriver},
			want:    DriverTier{Tier: "probe-only", ProbeSource: "driver"},
		},
		"a driver without a Healer service, probed by the sidecar": {
			volumes: 2,
			caps:    probe.Capabilities{Driver: "rbd", Probe: true, ListVolumes: true, ProbeSource: probe.ProbeSourceSidecar},
			want:    DriverTier{Tier: "none", ProbeSource: "sidecar"},
		},
		"an older sidecar that does not say who probes": {
			volumes: 1,
			caps:    probe.Capabilities{Driver: "rbd", Probe: true, Heal: true},
			want:    DriverTier{Tier: "healer", ProbeSource: "driver"},
		},
		"a restart of a node without volumes": {
			caps: probe.Capabilities{Driver: "rbd", Probe: true, ListVolumes: true, ProbeSource: probe.ProbeSourceSidecar},
			want: DriverTier{Tier: "none", ProbeSource: "sidecar"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tt.volumes, false)
			f.sidecars.caps = tt.caps
			ctx := context.Background()
			if sum := f.sweeper.Run(ctx, f.restart()); sum.Incomplete != "" {
				t.Fatalf("sweep incomplete: %s", sum.Incomplete)
			}
			var n csiaddonsv1alpha1.CSIAddonsNode
			if err := f.client.Get(ctx, client.ObjectKeyFromObject(f.node), &n); err != nil {
				t.Fatal(err)
			}
			raw, ok := n.Annotations[annotations.DriverTier]
			if !ok {
				t.Fatalf("CSIAddonsNode has no %s annotation: %v", annotations.DriverTier, n.Annotations)
			}
			var got DriverTier
			if err := json.Unmarshal([]byte(raw), &got); err != nil || got != tt.want {
				t.Fatalf("%s = %s (%v), want %+v", annotations.DriverTier, raw, err, tt.want)
			}

			// The informer delivers the patched object; the next sweeps find the tier in place.
			f.targets.Set(n.DeepCopy())
			f.sweeper.Run(ctx, f.restart())
			f.sweeper.Run(ctx, f.restart())
			var again csiaddonsv1alpha1.CSIAddonsNode
			if err := f.client.Get(ctx, client.ObjectKeyFromObject(f.node), &again); err != nil {
				t.Fatal(err)
			}
			if again.Annotations[annotations.DriverTier] != raw {
				t.Errorf("tier after the next sweeps = %s, want %s", again.Annotations[annotations.DriverTier], raw)
			}
		})
	}
}

// A tier that changes (the node plugin restarted as a driver that serves the Healer service) is
// written again, and sweeps that run before the informer delivers the patched object write it
// once.
func TestTierChangeIsWrittenOnce(t *testing.T) {
	f := newFixture(t, 1, false)
	var tierPatches atomic.Int32
	f.sweeper.opts.Client = interceptor.NewClient(f.client.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if body, err := patch.Data(obj); err == nil && strings.Contains(string(body), annotations.DriverTier) {
				tierPatches.Add(1)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	f.sidecars.caps = probe.Capabilities{Driver: "rbd", Probe: true, ListVolumes: true, ProbeSource: probe.ProbeSourceSidecar}
	ctx := context.Background()
	f.sweeper.Run(ctx, f.restart())
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.client.Get(ctx, client.ObjectKeyFromObject(f.node), &n); err != nil {
		t.Fatal(err)
	}
	f.targets.Set(n.DeepCopy())

	f.sidecars.set(func(s *fakeSidecars) {
		s.caps = probe.Capabilities{Driver: "rbd", Probe: true, Heal: true, ListVolumes: true, ProbeSource: probe.ProbeSourceDriver}
	})
	// Two sweeps while the cache still holds the object from before the second patch.
	f.sweeper.Run(ctx, f.restart())
	f.sweeper.Run(ctx, f.restart())
	var changed csiaddonsv1alpha1.CSIAddonsNode
	if err := f.client.Get(ctx, client.ObjectKeyFromObject(f.node), &changed); err != nil {
		t.Fatal(err)
	}
	if got, want := changed.Annotations[annotations.DriverTier], `{"tier":"healer","probeSource":"driver"}`; got != want {
		t.Fatalf("tier after the driver adopted the Healer service = %s, want %s", got, want)
	}
	if n := tierPatches.Load(); n != 2 {
		t.Errorf("%d patches of the tier, want 2: one for none, one for healer", n)
	}
}
