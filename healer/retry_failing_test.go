package healer

import (
	"context"
	"testing"

	"github.com/volume-healer/volume-healer/probe"
)

// A retry of an incomplete restart sweep calls the sidecar for the volumes that did not finish
// well only: the volumes probed healthy on the first try are not probed again while one volume's
// heal keeps failing, and the restart is recorded once that volume heals.
func TestRestartRetryCallsOnlyTheFailedVolumes(t *testing.T) {
	f := newFixture(t, 3, false)
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	// The fixture's dispatcher makes two attempts per try: four failures fail two tries.
	f.sidecars.healFails = map[string]int{"v1": 4}
	f.sidecars.healCalls = map[string]int{}

	sum := summaryOf(t, f.runAsync(context.Background()), "the restart sweep did not finish once v1 healed")
	if sum.Incomplete != "" || sum.Volumes != 3 || sum.Healed != 1 || sum.Probed != 3 || sum.Failed != 0 {
		t.Fatalf("summary %+v, want 3 volumes, 3 probed, v1 healed, complete", sum)
	}
	for _, pv := range []string{"v2", "v3"} {
		if got := f.sidecars.calls(pv); got != 1 {
			t.Errorf("%s was called %d times; probed healthy on the first try, it must not be called again (want 1)", pv, got)
		}
	}
	if got := f.sidecars.healCalls["v1"]; got != 5 {
		t.Errorf("v1 was asked to heal %d times, want 5 (4 failures, then the heal)", got)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q once v1 healed, want %q", m, f.restart().Marker)
	}
}
