package trigger

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
)

func csiAddonsNode(annotations map[string]string) *csiaddonsv1alpha1.CSIAddonsNode {
	return &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-a-rbd", UID: "0b1c", Annotations: annotations},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: "rbd.csi.ceph.com", NodeID: "node-a", EndPoint: "pod://plugin.csi:9070",
		}},
	}
}

func TestRestartMarker(t *testing.T) {
	tests := map[string]struct {
		annotations map[string]string
		want        string
	}{
		"csi-addons sidecar": {
			annotations: map[string]string{annotations.CSIAddonsPod: "pod-1", annotations.CSIAddonsRestart: "2026-11-29T10:00:00Z"},
			want:        "pod-1|2026-11-29T10:00:00Z",
		},
		"healer sidecar alone":        {annotations: map[string]string{annotations.HealerRestart: "r7"}, want: "r7"},
		"no marker: the object's UID": {want: "uid:0b1c"},
		"handled marker is not part of the marker": {
			annotations: map[string]string{annotations.HealerRestart: "r7", annotations.HandledMarker: "r6"}, want: "r7",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := RestartMarker(csiAddonsNode(tc.annotations)); got != tc.want {
				t.Fatalf("marker = %q, want %q", got, tc.want)
			}
		})
	}
}

func runRestarts(t *testing.T, debounce time.Duration) (*Restarts, *clocktesting.FakeClock, <-chan scheduler.Sweep) {
	t.Helper()
	fc := clocktesting.NewFakeClock(epoch)
	sweeps := make(chan scheduler.Sweep, 16)
	r, err := NewRestarts(RestartOptions{Debounce: debounce, Clock: fc, Sweeps: func(s scheduler.Sweep) { sweeps <- s }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	return r, fc, sweeps
}

// TestRestartsDebounce: a lone restart is swept at once, without waiting for the debounce window;
// the restarts that follow within the window (a crash-looping plugin) are folded into one sweep
// of the last marker at the window's end, and none is made when the marker did not change again.
func TestRestartsDebounce(t *testing.T) {
	r, fc, sweeps := runRestarts(t, 2*time.Second)
	ctx := context.Background()
	r.Observe(ctx, withEndpoint("r1"))
	s := expectSweep(t, sweeps)
	if s.Trigger != scheduler.TriggerRestart || s.Driver != "rbd.csi.ceph.com" || s.Node != "node-a" || s.Marker != "r1" ||
		s.Source.Name != "node-a-rbd" || s.Source.Namespace != "csi" || !s.Fired.Equal(epoch) {
		t.Fatalf("sweep = %+v, want a restart sweep of rbd.csi.ceph.com on node-a for marker r1 at once", s)
	}
	// The plugin crash-loops: two more starts within the window. (Nothing is pending, so
	// nothing waits on the clock.)
	fc.Step(500 * time.Millisecond)
	r.Observe(ctx, withEndpoint("r2"))
	step(t, fc, 500*time.Millisecond)
	r.Observe(ctx, withEndpoint("r3"))
	expectNoSweep(t, sweeps)
	step(t, fc, time.Second)
	s = expectSweep(t, sweeps)
	if s.Marker != "r3" || !s.Fired.Equal(epoch.Add(2*time.Second)) {
		t.Fatalf("sweep = %+v, want one sweep of marker r3 at the window's end (2s)", s)
	}
	expectNoSweep(t, sweeps)
	if r.Pending() != 0 {
		t.Errorf("pending = %d after the sweep, want 0", r.Pending())
	}
	// Still within the window after that sweep, the object changes without a new marker (the
	// handled marker written): nothing to sweep, now or at the window's end.
	r.Observe(ctx, withEndpoint("r3"))
	if r.Pending() != 0 {
		t.Errorf("pending = %d for a marker already swept, want 0", r.Pending())
	}
	fc.Step(3 * time.Second)
	expectNoSweep(t, sweeps)
	// A restart long after the last is again swept at once.
	r.Observe(ctx, withEndpoint("r4"))
	if s = expectSweep(t, sweeps); s.Marker != "r4" || !s.Fired.Equal(epoch.Add(5*time.Second)) {
		t.Fatalf("sweep = %+v, want marker r4 at once (5s)", s)
	}
	// An object without the healer sidecar's endpoint (recreated by the csi-addons sidecar) waits
	// the window for the sidecar to write it back, even as a lone change.
	r.Forget(types.NamespacedName{Namespace: "csi", Name: "node-a-rbd"})
	r.Observe(ctx, csiAddonsNode(map[string]string{annotations.HealerRestart: "r5"}))
	expectNoSweep(t, sweeps)
	step(t, fc, 2*time.Second)
	if s = expectSweep(t, sweeps); s.Marker != "r5" || !s.Fired.Equal(epoch.Add(7*time.Second)) {
		t.Fatalf("sweep = %+v, want marker r5 after the window (7s)", s)
	}
}

// withEndpoint is the CSIAddonsNode of a healer sidecar that registered with marker.
func withEndpoint(marker string) *csiaddonsv1alpha1.CSIAddonsNode {
	return csiAddonsNode(map[string]string{annotations.HealerRestart: marker, annotations.Endpoint: "10.0.0.5:9070"})
}

func TestRestartsSkipHandledAndDeleted(t *testing.T) {
	r, _, sweeps := runRestarts(t, 0)
	ctx := context.Background()

	r.Observe(ctx, csiAddonsNode(map[string]string{annotations.HealerRestart: "r1", annotations.HandledMarker: "r1"}))
	if r.Pending() != 0 {
		t.Fatal("a marker already handled became a pending sweep")
	}

	// The same marker seen again (a resync) while pending does not restart the wait or double up.
	n := csiAddonsNode(map[string]string{annotations.HealerRestart: "r2", annotations.HandledMarker: "r1"})
	r.Observe(ctx, n)
	r.Observe(ctx, n)
	if s := expectSweep(t, sweeps); s.Marker != "r2" {
		t.Fatalf("sweep marker = %q, want r2", s.Marker)
	}
	expectNoSweep(t, sweeps)

	// A CSIAddonsNode being deleted drops its pending restart.
	rd, fc2, sweeps2 := runRestarts(t, time.Second)
	gone := csiAddonsNode(map[string]string{annotations.HealerRestart: "r9"})
	rd.Observe(ctx, gone)
	now := metav1.Now()
	gone.DeletionTimestamp = &now
	rd.Observe(ctx, gone)
	if rd.Pending() != 0 {
		t.Fatalf("pending = %d after the CSIAddonsNode went away, want 0", rd.Pending())
	}
	fc2.Step(2 * time.Second)
	expectNoSweep(t, sweeps2)
}

// A change of the csi-addons sidecar's lastUpdatedAt alone (same pod, same healer sidecar start)
// is that container restarting, which kills no mounter: no sweep by default, one with the
// setting. A new healer start or a new pod is a restart either way.
func TestCSIAddonsSidecarRestartAlone(t *testing.T) {
	handled := func(lastUpdated, healer string) map[string]string {
		a := map[string]string{
			annotations.CSIAddonsPod:     "0b1c2d3e-0000-4000-8000-000000000001",
			annotations.CSIAddonsRestart: "2026-12-01T10:00:00Z",
			annotations.HealerRestart:    "2026-12-01T10:00:01.5Z/0b1c2d3e-0000-4000-8000-000000000001",
		}
		a[annotations.HandledMarker] = RestartMarker(csiAddonsNode(a))
		a[annotations.CSIAddonsRestart] = lastUpdated
		a[annotations.HealerRestart] = healer
		return a
	}
	const sameHealer = "2026-12-01T10:00:01.5Z/0b1c2d3e-0000-4000-8000-000000000001"
	tests := map[string]struct {
		annotations map[string]string
		setting     bool
		wantSweep   bool
	}{
		"csi-addons container restarted alone":             {annotations: handled("2026-12-01T10:05:00Z", sameHealer)},
		"csi-addons container restarted alone, setting on": {annotations: handled("2026-12-01T10:05:00Z", sameHealer), setting: true, wantSweep: true},
		"the healer sidecar saw the driver restart":        {annotations: handled("2026-12-01T10:05:00Z", "2026-12-01T10:04:59Z/0b1c2d3e-0000-4000-8000-000000000001"), wantSweep: true},
		"only the healer marker changed":                   {annotations: handled("2026-12-01T10:00:00Z", "2026-12-01T10:04:59Z/0b1c2d3e-0000-4000-8000-000000000001"), wantSweep: true},
		"nothing changed":                                  {annotations: handled("2026-12-01T10:00:00Z", sameHealer)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fc := clocktesting.NewFakeClock(epoch)
			var got []scheduler.Sweep
			r, err := NewRestarts(RestartOptions{Clock: fc, SweepCSIAddonsSidecarRestarts: tc.setting, Sweeps: func(s scheduler.Sweep) { got = append(got, s) }})
			if err != nil {
				t.Fatal(err)
			}
			r.Observe(context.Background(), csiAddonsNode(tc.annotations))
			if pending := r.Pending() > 0; pending != tc.wantSweep {
				t.Errorf("restart pending = %v, want %v", pending, tc.wantSweep)
			}
		})
	}
}

// A CSIAddonsNode written by 0.1.0 (the healer's restart marker and the handled marker under the
// keys of healer.csiaddons.openshift.io) is a restart already swept, as the same object written
// under the new keys is; a new start of the healer sidecar, which writes the new key and removes
// the old one, is a restart to sweep.
func TestRestartMarkerUnderEitherKey(t *testing.T) {
	const (
		pod     = "0b1c2d3e-0000-4000-8000-000000000001"
		started = "2026-12-01T10:00:01.5Z/" + pod
	)
	previous := annotations.Previous
	swept := pod + "|2026-12-01T10:00:00Z|" + started
	tests := map[string]struct {
		annotations map[string]string
		wantMarker  string
		wantSweep   bool
	}{
		"written by 0.1.0, swept": {annotations: map[string]string{
			previous(annotations.HealerRestart): started, previous(annotations.HandledMarker): swept}, wantMarker: swept},
		"written by now, swept": {annotations: map[string]string{
			annotations.HealerRestart: started, annotations.HandledMarker: swept}, wantMarker: swept},
		"marker of 0.1.0, handled by now": {annotations: map[string]string{
			previous(annotations.HealerRestart): started, annotations.HandledMarker: swept}, wantMarker: swept},
		"new start after 0.1.0 swept": {annotations: map[string]string{
			annotations.HealerRestart: "2026-12-02T08:00:00Z/" + pod, previous(annotations.HandledMarker): swept},
			wantMarker: pod + "|2026-12-01T10:00:00Z|2026-12-02T08:00:00Z/" + pod, wantSweep: true},
		"written by 0.1.0, never swept": {annotations: map[string]string{previous(annotations.HealerRestart): started},
			wantMarker: swept, wantSweep: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.annotations[annotations.CSIAddonsPod] = pod
			tc.annotations[annotations.CSIAddonsRestart] = "2026-12-01T10:00:00Z"
			marker, unswept := Unswept(csiAddonsNode(tc.annotations), false)
			if marker != tc.wantMarker || unswept != tc.wantSweep {
				t.Errorf("Unswept = %q, %v; want %q, %v", marker, unswept, tc.wantMarker, tc.wantSweep)
			}
		})
	}
}

// Changes of a CSIAddonsNode while its restart is being swept (a status update, the healer
// sidecar writing its annotations back, the sweep's own Events) do not start a second sweep of
// the same marker; the next restart, or the same marker after its object was deleted and came
// back, does.
func TestRestartsOneSweepPerMarker(t *testing.T) {
	r, fc, sweeps := runRestarts(t, time.Second)
	ctx := context.Background()
	n := csiAddonsNode(map[string]string{annotations.HealerRestart: "r1", annotations.Endpoint: "10.0.0.5:9070"})
	r.Observe(ctx, n)
	fc.Step(2 * time.Second)
	if s := expectSweep(t, sweeps); s.Marker != "r1" {
		t.Fatalf("sweep marker = %q, want r1", s.Marker)
	}

	// The csi-addons sidecar recreated the object and the healer sidecar put its endpoint back,
	// while the sweep is still pending: same marker.
	stripped := n.DeepCopy()
	delete(stripped.Annotations, annotations.Endpoint)
	for _, update := range []*csiaddonsv1alpha1.CSIAddonsNode{stripped, n} {
		r.Observe(ctx, update)
		if r.Pending() != 0 {
			t.Errorf("pending = %d while the marker's sweep runs, want 0", r.Pending())
			fc.Step(2 * time.Second)
		}
	}
	expectNoSweep(t, sweeps)

	again := csiAddonsNode(map[string]string{annotations.HealerRestart: "r2"})
	r.Observe(ctx, again)
	fc.Step(2 * time.Second)
	if s := expectSweep(t, sweeps); s.Marker != "r2" {
		t.Fatalf("sweep marker = %q, want r2 for the next restart", s.Marker)
	}
	r.Forget(types.NamespacedName{Namespace: again.Namespace, Name: again.Name})
	r.Observe(ctx, again)
	fc.Step(2 * time.Second)
	second := expectSweep(t, sweeps)
	if second.Marker != "r2" {
		t.Fatalf("sweep marker = %q, want r2 once more for the recreated object", second.Marker)
	}

	// A sweep that recorded its marker stays counted until the object shows it; one that ended
	// without recording it (it stopped unfinished, the patch failed) is swept on the next change.
	r.Ended(second, true)
	r.Observe(ctx, again)
	if r.Pending() != 0 {
		t.Errorf("pending = %d after a sweep that recorded its marker, want 0", r.Pending())
	}
	r.Ended(second, false)
	r.Observe(ctx, again)
	fc.Step(2 * time.Second)
	if s := expectSweep(t, sweeps); s.Marker != "r2" {
		t.Fatalf("sweep marker = %q, want r2 again after its sweep ended unrecorded", s.Marker)
	}
}

// TestRestartsBurstCoalesces: a plugin that restarts every 100ms for 5s (50 markers) is swept a
// bounded number of times, at most once per debounce window after its first sweep, and the last
// marker is always among them: no restart goes unswept. Another node's lone restart in the middle
// of the burst is swept at once, without waiting for the first node's window.
func TestRestartsBurstCoalesces(t *testing.T) {
	const window, interval, restarts = 2 * time.Second, 100 * time.Millisecond, 50
	r, fc, sweeps := runRestarts(t, window)
	ctx := context.Background()
	marker := func(i int) string { return fmt.Sprintf("r%02d", i) }
	var got []scheduler.Sweep
	// due is when the trailing sweep of the pending markers must fire: the first marker has none
	// (it is swept at once), the ones after it wait for the window after the last sweep.
	var due time.Time
	for i := range restarts {
		now := epoch.Add(time.Duration(i) * interval)
		if i > 0 {
			fc.Step(interval)
		}
		if !due.IsZero() && !now.Before(due) {
			// The window ended with this step: its sweep comes before the next marker is seen.
			s := expectSweep(t, sweeps)
			if want := marker(i - 1); s.Marker != want || !s.Fired.Equal(due) {
				t.Fatalf("sweep = %s at %s, want the window's last marker %s at %s", s.Marker, s.Fired.Sub(epoch), want, due.Sub(epoch))
			}
			got = append(got, s)
			due = time.Time{}
		}
		r.Observe(ctx, withEndpoint(marker(i)))
		switch {
		case i == 0:
			s := expectSweep(t, sweeps)
			if s.Marker != marker(0) || !s.Fired.Equal(epoch) {
				t.Fatalf("first sweep = %s at %s, want %s at once", s.Marker, s.Fired.Sub(epoch), marker(0))
			}
			got = append(got, s)
		case due.IsZero():
			due = got[len(got)-1].Fired.Add(window)
		}
		if i == restarts/2 {
			// Another node's driver restarts once, now: its sweep does not wait.
			other := csiAddonsNode(map[string]string{annotations.HealerRestart: "b1", annotations.Endpoint: "10.0.0.6:9070"})
			other.Name, other.Spec.Driver.NodeID = "node-b-rbd", "node-b"
			r.Observe(ctx, other)
			if s := expectSweep(t, sweeps); s.Source.Name != "node-b-rbd" || s.Marker != "b1" || !s.Fired.Equal(now) {
				t.Fatalf("sweep = %+v, want node-b's lone restart b1 at once (%s)", s, now.Sub(epoch))
			}
		}
		expectNoSweep(t, sweeps)
	}
	// The burst is over: the last markers are swept at the end of their window, and nothing after.
	if due.IsZero() {
		t.Fatal("no marker pending after the burst; the test lost track of the windows")
	}
	for fc.Now().Before(due) {
		expectNoSweep(t, sweeps)
		step(t, fc, interval)
	}
	s := expectSweep(t, sweeps)
	if want := marker(restarts - 1); s.Marker != want || !s.Fired.Equal(due) {
		t.Fatalf("last sweep = %s at %s, want the burst's last marker %s at %s", s.Marker, s.Fired.Sub(epoch), want, due.Sub(epoch))
	}
	got = append(got, s)
	// Nothing is pending, so nothing waits on the clock.
	fc.Step(2 * window)
	expectNoSweep(t, sweeps)
	if r.Pending() != 0 {
		t.Errorf("pending = %d after the burst was swept, want 0", r.Pending())
	}

	// 50 restarts over 4.9s with a 2s window: the first at once, then one per window.
	burst := time.Duration(restarts-1) * interval
	if limit := 1 + int(burst/window) + 1; len(got) > limit {
		t.Errorf("%d sweeps for %d restarts in %s, want at most %d (one at once, then one per %s window)", len(got), restarts, burst, limit, window)
	}
	for i := 1; i < len(got); i++ {
		if gap := got[i].Fired.Sub(got[i-1].Fired); gap < window {
			t.Errorf("sweeps %s and %s only %s apart, want at least the %s window", got[i-1].Marker, got[i].Marker, gap, window)
		}
	}
	var markers []string
	for _, s := range got {
		markers = append(markers, s.Marker)
	}
	if want := []string{"r00", "r19", "r39", "r49"}; !slices.Equal(markers, want) {
		t.Errorf("swept markers %v, want %v", markers, want)
	}
}
