package trigger

import (
	"context"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// A replaced node plugin pod whose csi-addons sidecar registers first leaves the object naming
// the old pod's healer sidecar (its marker, its endpoint). The restart is swept once the new
// pod's healer sidecar has registered, through it, not after the debounce through the old pod's
// dead sidecar; a healer sidecar that never comes leaves the sweep to start after the wait.
func TestRestartOfANewPodWaitsForItsHealerSidecar(t *testing.T) {
	r, fc, sweeps := runRestarts(t, 2*time.Second)
	ctx := context.Background()
	oldHealer := annotations.HealerRestartValue(epoch.Add(-time.Hour), "old-pod")
	replaced := map[string]string{
		annotations.CSIAddonsPod: "new-pod", annotations.CSIAddonsRestart: "t1",
		annotations.HealerRestart: oldHealer, annotations.Endpoint: "10.0.0.1:9070",
	}
	r.Observe(ctx, csiAddonsNode(replaced))
	step(t, fc, 3*time.Second)
	expectNoSweep(t, sweeps)

	newHealer := annotations.HealerRestartValue(epoch.Add(4*time.Second), "new-pod")
	registered := map[string]string{
		annotations.CSIAddonsPod: "new-pod", annotations.CSIAddonsRestart: "t1",
		annotations.HealerRestart: newHealer, annotations.Endpoint: "10.0.0.2:9070",
	}
	// Swept at once, without the clock moving: the restart is a lone one, and its healer sidecar
	// is there. (Stepping the clock here would race with the sweep: once it is made, nothing
	// waits on the clock.)
	r.Observe(ctx, csiAddonsNode(registered))
	s := expectSweep(t, sweeps)
	if want := RestartMarker(csiAddonsNode(registered)); s.Marker != want {
		t.Errorf("swept marker %q, want the new pod's %q", s.Marker, want)
	}
	expectNoSweep(t, sweeps)

	// Another replacement whose healer sidecar never registers: swept after the wait, as before.
	lost := map[string]string{
		annotations.CSIAddonsPod: "newer-pod", annotations.CSIAddonsRestart: "t2",
		annotations.HealerRestart: newHealer, annotations.Endpoint: "10.0.0.2:9070",
	}
	r.Observe(ctx, csiAddonsNode(lost))
	step(t, fc, 2*time.Second)
	expectNoSweep(t, sweeps)
	step(t, fc, DefaultNewPodWait)
	expectSweep(t, sweeps)
}
