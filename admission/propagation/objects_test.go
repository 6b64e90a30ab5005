package propagation

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestCachesReadTheAPIServerOnlyOnAMiss: what the caches hold is served from them; a claim they
// miss (created a moment before its pod) is read from the API server; one that exists nowhere is
// ErrNotFound.
func TestCachesReadTheAPIServerOnlyOnAMiss(t *testing.T) {
	cached := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cached"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-cached"}}
	fresh := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "fresh"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-fresh"}}
	client := fake.NewClientset(fresh)
	claims := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := claims.Add(cached); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		withClient bool
		name       string
		wantPV     string
		wantErr    error
		wantGETs   int
	}{
		"cached":                    {withClient: true, name: "cached", wantPV: "pv-cached"},
		"missed, read":              {withClient: true, name: "fresh", wantPV: "pv-fresh", wantGETs: 1},
		"nowhere":                   {withClient: true, name: "none", wantErr: ErrNotFound, wantGETs: 1},
		"missed, no client to read": {name: "fresh", wantErr: ErrNotFound},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			client.ClearActions()
			c := &Caches{Claims: claims}
			if tc.withClient {
				c.Client = client
			}
			pvc, err := c.Claim(context.Background(), "shop", tc.name)
			switch {
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Errorf("Claim = %v, %v; want %v", pvc, err, tc.wantErr)
			case tc.wantErr == nil && (err != nil || pvc.Spec.VolumeName != tc.wantPV):
				t.Errorf("Claim = %v, %v; want the claim bound to %s", pvc, err, tc.wantPV)
			}
			if n := len(client.Actions()); n != tc.wantGETs {
				t.Errorf("%d requests to the API server, want %d", n, tc.wantGETs)
			}
		})
	}
}
