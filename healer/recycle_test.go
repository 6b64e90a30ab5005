package healer

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/volume-healer/volume-healer/healer/evict"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
)

// stockFixture is a fixture whose driver serves no Healer service: the sidecar probes its volumes
// itself, and nothing heals them. Pods may be evicted.
func stockFixture(t *testing.T, n int) (*fixture, *recordingRestarter) {
	t.Helper()
	f := newFixture(t, n, false)
	f.sidecars.caps = probe.Capabilities{Driver: "rbd", Probe: true, ProbeSource: probe.ProbeSourceSidecar}
	r := &recordingRestarter{}
	f.sweeper.opts.Restarter, f.sweeper.opts.Evict = r, true
	return f, r
}

func recycles(r *recordingRestarter) []evict.Request {
	var out []evict.Request
	for _, req := range r.requests() {
		if req.Remedy == policy.RemedyRecycle {
			out = append(out, req)
		}
	}
	return out
}

// A dead volume of a driver that cannot heal is recycled; the restart sweep of its node stays
// pending, trying only that volume again, until a probe finds it healthy: then the recycle is
// finished (VolumeRecycled, with the time it took) and the restart recorded.
func TestRecycleKeepsTheRestartPendingUntilTheVolumeProbesHealthy(t *testing.T) {
	f, r := stockFixture(t, 2)
	f.sweeper.opts.Metrics = NewMetrics(prometheus.NewRegistry())
	f.sidecars.health["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone", Message: "transport endpoint is not connected"}}

	done := f.runAsync(context.Background())
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "1 volume(s) being recycled") {
		t.Errorf("the pending Event does not say a volume is being recycled:\n%s", events)
	}
	f.waitEvents(t, ReasonRestartSweepPending) // tried again, still dead
	if m := f.handledMarker(t); m != "" {
		t.Fatalf("restart recorded as handled (%q) while its volume is being recycled", m)
	}
	gauge := f.sweeper.opts.Metrics.recyclingSince
	if got := testutil.ToFloat64(gauge.WithLabelValues("app", "claim-v1", "rbd")); got <= 0 {
		t.Errorf("volume_healer_volume_recycling_since_timestamp_seconds of app/claim-v1 = %v while recycling, want its start", got)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.healFailing.WithLabelValues("app", "claim-v1", "rbd")); got != 0 {
		t.Errorf("volume_healer_volume_heal_failing of app/claim-v1 = %v while recycling, want 0: a recycle under way is no failed heal", got)
	}
	f.sweeper.opts.Metrics.healFailing.Reset()
	reqs := recycles(r)
	if len(reqs) < 2 {
		t.Fatalf("recycle requests %+v; want one per try", reqs)
	}
	for _, req := range reqs {
		if req.PV != "v1" || req.Node != "node-a" || req.Finding != "MountGone" || req.Claim.Name != "claim-v1" || !req.Input.Remedies.Evict {
			t.Errorf("recycle request %+v; want v1 on node-a, finding MountGone, for claim-v1, evictions allowed", req)
		}
		// A restart sweep's recycle evicts only once kubelet has had time to register the
		// restarted driver again: RecycleAfterRestart after the restart was seen.
		if req.NotBefore.IsZero() || time.Until(req.NotBefore) > RecycleAfterRestart || time.Since(req.NotBefore) > time.Minute {
			t.Errorf("recycle request NotBefore %s (now %s); want %s after the restart was seen", req.NotBefore, time.Now(), RecycleAfterRestart)
		}
	}
	f.sidecars.set(func(s *fakeSidecars) {
		if s.probes["v2"] != 1 {
			t.Errorf("v2 probed %d times; the healthy volume must not be probed again", s.probes["v2"])
		}
	})

	f.sidecars.set(func(s *fakeSidecars) { delete(s.health, "v1") })
	sum := summaryOf(t, done, "the restart sweep did not finish once the recycled volume probed healthy")
	if sum.Incomplete != "" || sum.Recycling != 0 || !sum.Recorded {
		t.Fatalf("summary %+v; want complete and recorded", sum)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q, want %q", m, f.restart().Marker)
	}
	if n := testutil.CollectAndCount(gauge); n != 0 {
		t.Errorf("%d recycling series left once the volume probed healthy, want none", n)
	}
	if !slices.Contains(r.finishes(), "v1/node-a recycled=true") {
		t.Errorf("finishes %v; want v1 on node-a finished as recycled", r.finishes())
	}
	events = f.events()
	if !strings.Contains(events, ReasonVolumeRecycled+" Volume recycled: found healthy on node node-a") {
		t.Errorf("events lack %s:\n%s", ReasonVolumeRecycled, events)
	}
}

// A recycled volume that its node no longer stages (kubelet unstaged it) is done only when no pod
// that used it there is left; until then its restart stays pending.
func TestRecycledVolumeUnstagedIsDoneOnlyWithNoPodLeft(t *testing.T) {
	f, r := stockFixture(t, 1)
	f.sidecars.notStaged = map[string]bool{"v1": true}
	r.set(evict.Progress{PV: "v1", Node: "node-a", Remedy: policy.RemedyRecycle, Finding: "MountGone", Since: time.Now().Add(-time.Minute), Evicted: 1, Blocked: 1})

	done := f.runAsync(context.Background())
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "being recycled") {
		t.Errorf("the pending Event does not say the volume is being recycled:\n%s", events)
	}
	r.set(evict.Progress{PV: "v1", Node: "node-a", Remedy: policy.RemedyRecycle, Finding: "MountGone", Since: time.Now().Add(-time.Minute), Evicted: 2, Cleared: true})
	sum := summaryOf(t, done, "the restart sweep did not finish once no pod was left on the unstaged volume")
	if sum.Incomplete != "" || !sum.Recorded {
		t.Fatalf("summary %+v; want complete and recorded", sum)
	}
	if events := f.events(); !strings.Contains(events, ReasonVolumeRecycled+" Volume recycled: unstaged on node node-a with no pod left on it") {
		t.Errorf("events lack %s:\n%s", ReasonVolumeRecycled, events)
	}
}

// recycleAlways probes, then recycles whatever the probe found.
type recycleAlways struct{}

func (recycleAlways) Decide(_ context.Context, in *policy.Input) (policy.Decision, error) {
	switch {
	case in.Probe == nil:
		return policy.Decision{Action: policy.ActionProbe, Reason: "Probe"}, nil
	case in.Probe.Healthy:
		return policy.Decision{Action: policy.ActionSkip, Reason: "Healthy"}, nil
	}
	return policy.Decision{Action: policy.ActionRecycle, Reason: "SiteRecycles"}, nil
}

// The policy decides: a volume whose driver could heal it is recycled when the policy says so, and
// not healed.
func TestPolicyMayRecycleAVolumeItsDriverCouldHeal(t *testing.T) {
	f := newFixture(t, 1, false)
	r := &recordingRestarter{}
	f.sweeper.opts.Restarter, f.sweeper.opts.Evict, f.sweeper.opts.Policy = r, true, recycleAlways{}
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := f.runAsync(ctx)
	f.waitEvents(t, ReasonRestartSweepPending)
	cancel()
	summaryOf(t, done, "the sweep did not stop")
	if f.sidecars.heals["v1"] != 0 {
		t.Errorf("v1 healed %d times; the policy recycles it", f.sidecars.heals["v1"])
	}
	if reqs := recycles(r); len(reqs) == 0 || reqs[0].Input.Remedies.Heal != true {
		t.Errorf("recycle requests %+v; want v1 recycled, its input saying the driver heals", reqs)
	}
}

// A recycle where this controller evicts nothing (remediation off or in dry run) tells the
// operator on the claim, and leaves the volume unhealthy: nothing is pending that could finish.
func TestRecycleWithoutEvictionsIsReported(t *testing.T) {
	f := newFixture(t, 1, false)
	r := &recordingRestarter{}
	f.sweeper.opts.Restarter, f.sweeper.opts.Evict, f.sweeper.opts.Policy = r, false, recycleAlways{}
	f.sidecars.health["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}
	sum := f.sweeper.Run(context.Background(), f.restart())
	if sum.Unhealthy != 1 || sum.Recycling != 0 || len(r.requests()) != 0 {
		t.Fatalf("summary %+v, requests %+v; want v1 unhealthy and nothing evicted", sum, r.requests())
	}
	if events := f.events(); !strings.Contains(events, evict.ReasonVolumeRecycleBlocked) || !strings.Contains(events, "this controller evicts no pods") {
		t.Errorf("events do not say why the volume is not recycled:\n%s", events)
	}
}

// A probe answer that names no finding still recycles: the request's finding is empty, and the
// Events say "a dead mount".
func TestRecycleOfAProbeWithoutFinding(t *testing.T) {
	f, r := stockFixture(t, 1)
	f.sidecars.health["v1"] = []probe.Health{{Status: "INACCESSIBLE"}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := f.runAsync(ctx)
	f.waitEvents(t, ReasonRestartSweepPending)
	cancel()
	summaryOf(t, done, "the sweep did not stop")
	reqs := recycles(r)
	if len(reqs) == 0 || reqs[0].Finding != "" {
		t.Fatalf("recycle requests %+v; want v1 recycled with no finding", reqs)
	}
}

// recycleAtOnce recycles without a probe.
type recycleAtOnce struct{}

func (recycleAtOnce) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	return policy.Decision{Action: policy.ActionRecycle, Reason: "SiteRecycles"}, nil
}

// Dry run reports a recycle it would make, and neither probes nor recycles.
func TestDryRunReportsAWouldBeRecycle(t *testing.T) {
	f := newFixture(t, 1, true)
	r := &recordingRestarter{}
	f.sweeper.opts.Restarter, f.sweeper.opts.Evict, f.sweeper.opts.Policy = r, true, recycleAtOnce{}
	sum := f.sweeper.Run(context.Background(), f.restart())
	if sum.WouldRecycle != 1 || len(r.requests()) != 0 || f.sidecars.probes["v1"] != 0 {
		t.Fatalf("summary %+v, requests %v, probes %d; want one would-be recycle and no call", sum, r.requests(), f.sidecars.probes["v1"])
	}
	if !strings.Contains(sum.String(), "would recycle 1") {
		t.Errorf("summary %q does not say what dry run would recycle", sum)
	}
}
