package healer

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
)

// recordingDecider remembers the inputs of the second evaluations, by PV, before the policy
// decides them.
type recordingDecider struct {
	Decider
	mu     sync.Mutex
	second map[string]policy.Input
	first  map[string]policy.Input
}

func (r *recordingDecider) Decide(ctx context.Context, in *policy.Input) (policy.Decision, error) {
	r.mu.Lock()
	if in.Probe != nil {
		r.second[in.Volume.PV] = *in
	} else {
		r.first[in.Volume.PV] = *in
	}
	r.mu.Unlock()
	return r.Decider.Decide(ctx, in)
}

// TestRestartSweepRecordsKeptVolumes sweeps the restart of a node plugin whose driver keeps its
// volumes alive across such restarts: the kept volumes that probe healthy are recorded kept and
// get no heal; a kept volume that is broken anyway is healed as any other; a volume the driver
// does not keep is healthy as before. The sweep's summary, its Event, the result recorded with
// the handled marker and the kept counter say so; a manual sweep of the same volumes records
// nothing kept.
func TestRestartSweepRecordsKeptVolumes(t *testing.T) {
	f := newFixture(t, 4, false)
	m := NewMetrics(prometheus.NewRegistry())
	f.sweeper.opts.Metrics = m
	rec := &recordingDecider{Decider: f.sweeper.opts.Policy, second: map[string]policy.Input{}, first: map[string]policy.Input{}}
	f.sweeper.opts.Policy = rec
	f.sidecars.set(func(sc *fakeSidecars) {
		sc.caps.VolumeKeeping = probe.VolumeKeeping{PluginRestart: true}
		sc.kept = map[string]bool{"v1": true, "v2": true, "v3": true}
		sc.health["v3"], sc.healable["v3"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
		sc.healable["v1"], sc.healable["v2"], sc.healable["v4"] = true, true, true
	})
	ctx := context.Background()

	sum := f.sweeper.Run(ctx, f.restart())
	if sum.Volumes != 4 || sum.Probed != 4 || sum.Kept != 2 || sum.Healed != 1 || sum.Failed != 0 || sum.Incomplete != "" {
		t.Fatalf("summary = %+v, want 4 probed, 2 kept, 1 healed", sum)
	}
	if !strings.Contains(sum.String(), "1 healed, 2 kept, ") {
		t.Errorf("summary line %q does not show kept beside healed", sum.String())
	}
	for pv, want := range map[string]int{"v1": 0, "v2": 0, "v3": 1, "v4": 0} {
		if got := f.sidecars.heals[pv]; got != want {
			t.Errorf("heals of %s = %d, want %d", pv, got, want)
		}
	}
	if got := testutil.ToFloat64(m.volumesKept.WithLabelValues("rbd")); got != 2 {
		t.Errorf("volume_healer_volumes_kept_total{driver=rbd} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.heals.WithLabelValues("rbd", "healed")); got != 1 {
		t.Errorf("volume_healer_heals_total{driver=rbd,result=healed} = %v, want 1", got)
	}
	events := f.events()
	if !strings.Contains(events, ReasonRestartSweepFinished) || !strings.Contains(events, "2 kept") {
		t.Errorf("the sweep's Events do not say 2 kept:\n%s", events)
	}

	// The policy saw the driver's keeping in both evaluations and the broken volume's kept.
	in, ok := rec.second["v3"]
	if !ok || !in.Probe.Kept || !in.Driver.Healer.VolumeKeeping.PluginRestart || in.Driver.Healer.VolumeKeeping.MounterRestart {
		t.Errorf("second evaluation of v3: %+v, probe %+v; want probe.kept and driver.healer.volumeKeeping.pluginRestart", in.Driver.Healer, in.Probe)
	}
	if in := rec.first["v1"]; !in.Driver.Healer.VolumeKeeping.PluginRestart {
		t.Errorf("first evaluation of v1: driver %+v; want its volume keeping", in.Driver.Healer)
	}

	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.client.Get(ctx, client.ObjectKeyFromObject(f.node), &n); err != nil {
		t.Fatal(err)
	}
	if n.Annotations[annotations.HandledMarker] != "start-2" {
		t.Errorf("handled marker = %q, want start-2", n.Annotations[annotations.HandledMarker])
	}
	var res RestartSweepResult
	if err := json.Unmarshal([]byte(n.Annotations[annotations.RestartSweep]), &res); err != nil {
		t.Fatalf("restart sweep result %q: %v", n.Annotations[annotations.RestartSweep], err)
	}
	if res.Marker != "start-2" || res.Volumes != 4 || res.Kept != 2 || res.Healed != 1 {
		t.Errorf("recorded restart sweep result %+v, want marker start-2, 4 volumes, 2 kept, 1 healed", res)
	}

	sum = f.sweeper.Run(ctx, scheduler.Sweep{Trigger: scheduler.TriggerManual, Driver: "rbd", Node: "node-a"})
	if sum.Kept != 0 || sum.Probed != 4 || sum.Healed != 0 {
		t.Errorf("manual sweep summary = %+v, want 4 probed, none kept or healed: no restart, nothing lived through one", sum)
	}
	if got := testutil.ToFloat64(m.volumesKept.WithLabelValues("rbd")); got != 2 {
		t.Errorf("a manual sweep moved volume_healer_volumes_kept_total to %v", got)
	}
}

// TestKeptVolumeDecision is the built-in policy's decision for a kept volume after a restart:
// confirmed when healthy, healed when broken, whatever the driver keeps.
func TestKeptVolumeDecision(t *testing.T) {
	ctx := context.Background()
	engine, err := policy.NewEngine(ctx, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	driver := policy.DriverInfo{Name: "rbd", Healer: policy.HealerCapabilities{Probe: true, Heal: true,
		VolumeKeeping: policy.VolumeKeeping{PluginRestart: true}}, Tier: policy.TierHealer, ProbeSource: "driver"}
	gone := []policy.Health{{Status: policy.HealthInaccessible, Reason: "MountGone"}}
	tests := map[string]struct {
		probe      *policy.ProbeResult
		want       policy.Action
		wantReason string
	}{
		"kept and healthy: confirmed":      {probe: &policy.ProbeResult{Healthy: true, Healable: true, Kept: true}, want: policy.ActionSkip, wantReason: "Kept"},
		"not kept and healthy":             {probe: &policy.ProbeResult{Healthy: true, Healable: true}, want: policy.ActionSkip, wantReason: "Healthy"},
		"kept but broken: healed anyway":   {probe: &policy.ProbeResult{Health: gone, Healable: true, Kept: true}, want: policy.ActionHeal, wantReason: "HealAfterRestart"},
		"kept, broken and not healable":    {probe: &policy.ProbeResult{Health: gone, Kept: true}, want: policy.ActionSkip, wantReason: "NotHealable"},
		"before the probe: probe as today": {want: policy.ActionProbe, wantReason: "ProbeAfterRestart"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			in := policy.Input{Trigger: policy.TriggerRestart, Volume: policy.Volume{PV: "v1", Driver: "rbd"}, Driver: driver,
				Attachment: &policy.Attachment{Node: "node-a", Attached: true}, Remedies: policy.Remedies{Heal: true}, Probe: tt.probe}
			d, err := engine.Decide(ctx, &in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tt.want || d.Reason != tt.wantReason {
				t.Errorf("decision %s (%s), want %s (%s)", d.Action, d.Reason, tt.want, tt.wantReason)
			}
		})
	}
}
