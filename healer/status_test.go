package healer

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
)

// A claim whose status 0.1.0 wrote under healer.csiaddons.openshift.io/status keeps one status:
// a healthy volume loses the old one, an unhealthy one gets the new key and loses the old one.
func TestStatusOfAPreviousReleaseIsReplaced(t *testing.T) {
	f := newFixture(t, 2, false)
	ctx := context.Background()
	previous := annotations.Previous(annotations.VolumeStatus)
	for _, name := range []string{"claim-v1", "claim-v2"} {
		var pvc corev1.PersistentVolumeClaim
		if err := f.client.Get(ctx, client.ObjectKey{Namespace: "app", Name: name}, &pvc); err != nil {
			t.Fatal(err)
		}
		pvc.Annotations = map[string]string{previous: `{"result":"heal-failed"}`}
		if err := f.client.Update(ctx, &pvc); err != nil {
			t.Fatal(err)
		}
		if err := f.caches.Add(&pvc); err != nil {
			t.Fatal(err)
		}
	}
	f.sidecars.health["v2"] = []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}} // not healable
	f.sidecars.healable["v1"] = true                                                        // healthy

	f.sweeper.Run(ctx, f.restart())

	tests := map[string]struct {
		claim      string
		wantStatus string // "" for none
	}{
		"healthy volume: the old status is removed":         {claim: "claim-v1"},
		"unhealthy volume: the status moves to the new key": {claim: "claim-v2", wantStatus: `"result":"unhealthy"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var pvc corev1.PersistentVolumeClaim
			if err := f.client.Get(ctx, client.ObjectKey{Namespace: "app", Name: tc.claim}, &pvc); err != nil {
				t.Fatal(err)
			}
			if v, ok := pvc.Annotations[previous]; ok {
				t.Errorf("the claim still carries %s: %q", previous, v)
			}
			st, ok := pvc.Annotations[annotations.VolumeStatus]
			switch {
			case tc.wantStatus == "" && ok:
				t.Errorf("the claim of a healthy volume carries %s: %q", annotations.VolumeStatus, st)
			case tc.wantStatus != "" && !strings.Contains(st, tc.wantStatus):
				t.Errorf("%s = %q, want %s", annotations.VolumeStatus, st, tc.wantStatus)
			}
		})
	}
}
