package sidecar_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/refdriver/simulated"
	"github.com/volume-healer/volume-healer/sidecar"
)

// TestStoppingSidecarTakesItsEndpointOff stops a registered sidecar: the endpoint it wrote leaves
// its CSIAddonsNode, so that the controller does not sweep a restart through a sidecar that is
// gone, and the restart marker stays. When a successor pod has written its own endpoint and
// marker meanwhile (on another address, or on the same one with host networking), they stay.
func TestStoppingSidecarTakesItsEndpointOff(t *testing.T) {
	tests := map[string]struct {
		// successor, when set, is the endpoint another pod writes while the sidecar runs; "self"
		// stands for the sidecar's own (a pod on the host network).
		successor string
	}{
		"its own endpoint goes":                            {},
		"a successor's endpoint stays":                     {successor: "10.0.0.8:9070"},
		"a successor's endpoint on the same address stays": {successor: "self"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.startDriver(simulated.Options{}, nil)
			// Once the successor has written, the sidecar's own registration writes (which put its
			// annotations back while it runs) fail: the two pods would otherwise take turns.
			var successorWrote atomic.Bool
			sc := f.startSidecar(func(o *sidecar.Options) {
				o.KubeConfig.Wrap(func(rt http.RoundTripper) http.RoundTripper {
					return roundTripFunc(func(req *http.Request) (*http.Response, error) {
						if !successorWrote.Load() || req.Method != http.MethodPatch || !strings.Contains(req.URL.Path, "/csiaddonsnodes/") {
							return rt.RoundTrip(req)
						}
						body, err := io.ReadAll(req.Body)
						if err != nil {
							return nil, err
						}
						if bytes.Contains(body, []byte(annotations.HealerRestart)) {
							return nil, errors.New("the successor owns the object now")
						}
						req.Body = io.NopCloser(bytes.NewReader(body))
						return rt.RoundTrip(req)
					})
				})
			})
			select {
			case <-sc.s.Registered():
			case <-time.After(20 * time.Second):
				t.Fatal("not registered within 20s")
			}
			key := client.ObjectKey{Namespace: f.namespace, Name: sidecar.DefaultCSIAddonsNodeName(f.nodeName, f.driverName)}
			var before csiaddonsv1alpha1.CSIAddonsNode
			if err := f.env.Client.Get(f.ctx, key, &before); err != nil {
				t.Fatal(err)
			}
			if got := before.Annotations[annotations.Endpoint]; got != sc.s.Endpoint() {
				t.Fatalf("registered endpoint %q, want %q", got, sc.s.Endpoint())
			}
			wantEndpoint, wantMarker := "", before.Annotations[annotations.HealerRestart]
			if tc.successor != "" {
				wantEndpoint = tc.successor
				if wantEndpoint == "self" {
					wantEndpoint = sc.s.Endpoint()
				}
				wantMarker = annotations.HealerRestartValue(time.Now(), "uid-successor")
				successorWrote.Store(true)
				patch := annotations.MergePatch(map[string]string{annotations.Endpoint: wantEndpoint, annotations.HealerRestart: wantMarker})
				if err := f.env.Client.Patch(f.ctx, &before, client.RawPatch(types.MergePatchType, patch)); err != nil {
					t.Fatal(err)
				}
			}
			if err := sc.stop(); err != nil {
				t.Fatal(err)
			}
			var after csiaddonsv1alpha1.CSIAddonsNode
			if err := f.env.Client.Get(f.ctx, key, &after); err != nil {
				t.Fatal(err)
			}
			if got := after.Annotations[annotations.Endpoint]; got != wantEndpoint {
				t.Errorf("endpoint after the stop = %q, want %q", got, wantEndpoint)
			}
			if got := after.Annotations[annotations.HealerRestart]; got != wantMarker {
				t.Errorf("restart marker after the stop = %q, want %q unchanged", got, wantMarker)
			}
		})
	}
}
