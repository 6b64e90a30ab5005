package healer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/probe"
)

// handledMarker reads the restart marker recorded on the fixture's CSIAddonsNode, "" when none.
func (f *fixture) handledMarker(t *testing.T) string {
	t.Helper()
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := f.client.Get(context.Background(), client.ObjectKeyFromObject(f.node), &n); err != nil {
		t.Fatal(err)
	}
	return n.Annotations[annotations.HandledMarker]
}

// runAsync runs a sweep of sw in the background; the summary arrives on the channel.
func (f *fixture) runAsync(ctx context.Context) <-chan Summary {
	done := make(chan Summary, 1)
	sw := f.restart()
	go func() { done <- f.sweeper.Run(ctx, sw) }()
	return done
}

// waitEvents collects the recorder's Events until one contains want, failing after 10 seconds.
func (f *fixture) waitEvents(t *testing.T, want string) string {
	t.Helper()
	var seen []string
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-f.recorder.Events:
			seen = append(seen, e)
			if strings.Contains(e, want) {
				return strings.Join(seen, "\n")
			}
		case <-deadline:
			t.Fatalf("no Event containing %q within 10s; got:\n%s", want, strings.Join(seen, "\n"))
		}
	}
}

// A restart whose sidecar cannot be reached yet (starting, TokenReview down, a NetworkPolicy) must
// not be recorded as handled: its volumes were never looked at. The sweep says it is pending, is
// tried again, and is recorded only once a try reaches every volume.
func TestRestartSweepWithUnreachableSidecarIsRetriedUntilItAnswers(t *testing.T) {
	f := newFixture(t, 2, false)
	reg := prometheus.NewRegistry()
	f.sweeper.opts.Metrics = NewMetrics(reg)
	f.sidecars.health["v1"], f.sidecars.healable["v1"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}, true
	f.sidecars.capsDown = true

	done := f.runAsync(context.Background())
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "2 of 2 volumes failed") {
		t.Errorf("the pending Event does not say why:\n%s", events)
	}
	f.waitEvents(t, ReasonRestartSweepPending) // a second try, still unreachable
	if m := f.handledMarker(t); m != "" {
		t.Fatalf("restart recorded as handled (%q) while its sidecar could not be reached", m)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.restartsPending.WithLabelValues("rbd")); got != 1 {
		t.Errorf("volume_healer_restart_sweeps_pending{driver=rbd} = %v while pending, want 1", got)
	}

	f.sidecars.set(func(s *fakeSidecars) { s.capsDown = false })
	var sum Summary
	select {
	case sum = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the restart sweep did not finish after the sidecar answered")
	}
	if sum.Incomplete != "" || sum.Healed != 1 || sum.Failed != 0 {
		t.Fatalf("summary %+v, want complete with v1 healed", sum)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q after the sweep completed, want %q", m, f.restart().Marker)
	}
	f.waitEvents(t, ReasonRestartSweepFinished)
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.restartsPending.WithLabelValues("rbd")); got != 0 {
		t.Errorf("volume_healer_restart_sweeps_pending{driver=rbd} = %v once complete, want 0", got)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.restartRetries.WithLabelValues("rbd")); got < 2 {
		t.Errorf("volume_healer_restart_sweep_retries_total{driver=rbd} = %v, want at least 2", got)
	}
}

// For a driver without VolumeAttachments the sidecar's list is the only list of a node's
// volumes: a list that failed is not an empty node.
func TestRestartSweepWhoseStagedListFailedIsNotEmpty(t *testing.T) {
	f := newFixture(t, 2, false)
	driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "rbd"}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)}}
	if err := f.caches.Add(driver); err != nil {
		t.Fatal(err)
	}
	f.sidecars.stagedErr = fmt.Errorf("%w: connection refused", probe.ErrUnreachable)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := f.runAsync(ctx)
	events := f.waitEvents(t, ReasonRestartSweepPending)
	if !strings.Contains(events, "staged volumes of rbd on node node-a could not be listed") {
		t.Errorf("the pending Event does not say why:\n%s", events)
	}
	if m := f.handledMarker(t); m != "" {
		t.Fatalf("restart recorded as handled (%q) with its node's volumes unknown", m)
	}

	f.sidecars.set(func(s *fakeSidecars) {
		s.stagedErr = nil
		s.staged = []probe.StagedVolume{{PV: "v1"}, {PV: "v2"}}
	})
	select {
	case sum := <-done:
		if sum.Incomplete != "" || sum.Volumes != 2 || sum.Probed != 2 {
			t.Fatalf("summary %+v, want both staged volumes probed", sum)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the restart sweep did not finish once the sidecar listed its volumes")
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q, want %q", m, f.restart().Marker)
	}
}

// An incomplete restart sweep stops trying when the node plugin restarts again (the new restart
// has its own sweep) or when the controller stops (leadership lost); neither records the old
// marker.
func TestIncompleteRestartSweepStops(t *testing.T) {
	t.Run("superseded by a new restart", func(t *testing.T) {
		f := newFixture(t, 1, false)
		f.sidecars.capsDown = true
		done := f.runAsync(context.Background())
		f.waitEvents(t, ReasonRestartSweepPending)
		again := f.node.DeepCopy()
		again.Annotations[annotations.HealerRestart] = "start-3"
		f.targets.Set(again)
		select {
		case sum := <-done:
			if !strings.Contains(sum.Incomplete, "restarted again") {
				t.Errorf("summary %+v, want it incomplete because of the new restart", sum)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the old restart sweep kept trying after a new restart")
		}
		if m := f.handledMarker(t); m != "" {
			t.Errorf("handled marker %q recorded by a sweep that never completed", m)
		}
	})
	t.Run("controller stops", func(t *testing.T) {
		f := newFixture(t, 1, false)
		f.sidecars.capsDown = true
		ctx, cancel := context.WithCancel(context.Background())
		done := f.runAsync(ctx)
		f.waitEvents(t, ReasonRestartSweepPending)
		cancel()
		select {
		case sum := <-done:
			if !sum.Cancelled {
				t.Errorf("summary %+v, want cancelled", sum)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the restart sweep kept trying after its context ended")
		}
		if m := f.handledMarker(t); m != "" {
			t.Errorf("handled marker %q recorded by a sweep that never completed", m)
		}
	})
}

// panickingPolicy stands in for a policy engine that hits a bug on some input.
type panickingPolicy struct{}

func (panickingPolicy) Decide(context.Context, *policy.Input) (policy.Decision, error) {
	panic("assignment to entry in nil map")
}

// A sweep that panics ends alone, counted, and unrecorded: the restart is swept again later
// rather than recorded as handled or crashing the controller.
func TestPanickingSweepEndsUnrecorded(t *testing.T) {
	f := newFixture(t, 1, false)
	reg := prometheus.NewRegistry()
	f.sweeper.opts.Metrics = NewMetrics(reg)
	f.sweeper.opts.Policy = panickingPolicy{}
	sum := f.sweeper.Run(context.Background(), f.restart())
	if !strings.Contains(sum.Incomplete, "panicked") {
		t.Errorf("summary %+v, want it incomplete because the sweep panicked", sum)
	}
	if m := f.handledMarker(t); m != "" {
		t.Errorf("handled marker %q recorded by a sweep that panicked", m)
	}
	if n := testutil.ToFloat64(f.sweeper.opts.Metrics.sweepPanics.WithLabelValues("restart")); n != 1 {
		t.Errorf("volume_healer_sweep_panics_total{trigger=restart} = %v, want 1", n)
	}
}
