package trigger_test

import (
	"context"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/scheduler"
	"github.com/volume-healer/volume-healer/scheduler/trigger"
	"github.com/volume-healer/volume-healer/test/controlplane"
)

// TestHandledMarkerSurvivesControllerRestart records a finished restart sweep on a real CSIAddonsNode
// and checks that a fresh Restarts (a restarted controller, a new leader) does not repeat it, keeps
// the csi-addons sidecar's own annotations, and still sweeps the next restart.
func TestHandledMarkerSurvivesControllerRestart(t *testing.T) {
	env := controlplane.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "csi"}}); err != nil {
		t.Fatal(err)
	}
	node := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-a-rbd", Annotations: map[string]string{
			annotations.CSIAddonsPod:     "pod-uid-1",
			annotations.CSIAddonsRestart: "2026-11-29T10:00:00Z",
		}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: "rbd.csi.ceph.com", NodeID: "node-a", EndPoint: "pod://plugin.csi:9070",
		}},
	}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}

	observe := func(n *csiaddonsv1alpha1.CSIAddonsNode) []scheduler.Sweep {
		var got []scheduler.Sweep
		r, err := trigger.NewRestarts(trigger.RestartOptions{Sweeps: func(s scheduler.Sweep) { got = append(got, s) }})
		if err != nil {
			t.Fatal(err)
		}
		r.Observe(ctx, n)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = r.Start(runCtx); close(done) }()
		for deadline := time.Now().Add(5 * time.Second); r.Pending() > 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		stop()
		<-done
		return got
	}
	get := func() *csiaddonsv1alpha1.CSIAddonsNode {
		var n csiaddonsv1alpha1.CSIAddonsNode
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(node), &n); err != nil {
			t.Fatal(err)
		}
		return &n
	}

	sweeps := observe(get())
	if len(sweeps) != 1 {
		t.Fatalf("a new CSIAddonsNode gave %d sweeps, want 1", len(sweeps))
	}
	if err := trigger.RecordHandled(ctx, env.Client, sweeps[0], map[string]string{annotations.RestartSweep: `{"marker":"m"}`}); err != nil {
		t.Fatal(err)
	}

	after := get()
	if after.Annotations[annotations.HandledMarker] != sweeps[0].Marker ||
		after.Annotations[annotations.CSIAddonsPod] != "pod-uid-1" || after.Annotations[annotations.RestartSweep] != `{"marker":"m"}` {
		t.Fatalf("annotations after recording = %v, want the handled marker and the sweep's result beside the sidecar's own", after.Annotations)
	}
	if again := observe(after); len(again) != 0 {
		t.Fatalf("a restarted controller repeated a finished restart sweep: %v", again)
	}

	// The node plugin restarts again: the csi-addons sidecar rewrites its marker.
	after.Annotations[annotations.CSIAddonsRestart] = "2026-11-29T11:00:00Z"
	if err := env.Client.Update(ctx, after); err != nil {
		t.Fatal(err)
	}
	if next := observe(get()); len(next) != 1 || next[0].Marker == sweeps[0].Marker {
		t.Fatalf("the next restart gave %v, want one sweep with a new marker", next)
	}
}
