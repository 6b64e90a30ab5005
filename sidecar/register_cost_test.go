package sidecar

import (
	"context"
	"sync"
	"testing"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/volume-healer/volume-healer/api/annotations"
)

// TestRegistrationAndDeregistrationWrites: a start's registration on the csi-addons sidecar's
// object costs one LIST and one PATCH (the listed object is not read again), and a stop takes the
// endpoint off with a single conditional PATCH; when a successor wrote its own endpoint
// meanwhile, that PATCH is refused and the object keeps the successor's.
func TestRegistrationAndDeregistrationWrites(t *testing.T) {
	owned := &csiaddonsv1alpha1.CSIAddonsNode{
		ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: "node-a-rbd", Annotations: map[string]string{annotations.CSIAddonsPod: "pod-1"}},
		Spec: csiaddonsv1alpha1.CSIAddonsNodeSpec{Driver: csiaddonsv1alpha1.CSIAddonsNodeDriver{
			Name: "rbd.csi.ceph.com", NodeID: "node-a", EndPoint: "pod://plugin.csi:9070",
		}},
	}
	var mu sync.Mutex
	calls := map[string]int{}
	count := func(verb string) {
		mu.Lock()
		calls[verb]++
		mu.Unlock()
	}
	c := fakeClient(t, &interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			count("GET")
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			count("LIST")
			return c.List(ctx, list, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			count("PATCH")
			return c.Patch(ctx, obj, patch, opts...)
		},
	}, owned)
	r := newRegistrar(t, c, "")
	ctx := context.Background()
	if _, err := r.run(ctx, "rbd.csi.ceph.com"); err != nil {
		t.Fatal(err)
	}
	if calls["GET"] != 0 || calls["LIST"] != 1 || calls["PATCH"] != 1 {
		t.Errorf("registration made %v, want one LIST and one PATCH", calls)
	}
	if _, _, rv := r.currentState(); rv == "" {
		t.Error("the registration kept no resourceVersion for its watch to start from")
	}
	calls = map[string]int{}
	if err := r.deregister(ctx); err != nil {
		t.Fatal(err)
	}
	if calls["GET"] != 0 || calls["PATCH"] != 1 {
		t.Errorf("deregistration made %v, want one PATCH", calls)
	}
	var got csiaddonsv1alpha1.CSIAddonsNode
	if err := c.Get(ctx, types.NamespacedName{Namespace: "csi", Name: "node-a-rbd"}, &got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Annotations[annotations.Endpoint]; ok || got.Annotations[annotations.HealerRestart] == "" {
		t.Errorf("after deregistration the annotations are %v: want the endpoint gone and the marker kept", got.Annotations)
	}

	// A successor's endpoint and marker stay.
	successor := map[string]string{annotations.Endpoint: "10.0.0.8:9070", annotations.HealerRestart: "later/pod-3"}
	patch := annotations.MergePatch(successor)
	if err := c.Patch(ctx, &got, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	if err := r.deregister(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "csi", Name: "node-a-rbd"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Annotations[annotations.Endpoint] != "10.0.0.8:9070" {
		t.Errorf("a stopping sidecar took its successor's endpoint off: %v", got.Annotations)
	}
}
