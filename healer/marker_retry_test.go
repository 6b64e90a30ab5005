package healer

import (
	"context"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// A restart sweep that finished but whose marker patch failed (the API server briefly
// unavailable) records the marker again with backoff, instead of waiting for the object's next
// change, which may never come.
func TestFailedMarkerPatchIsRetried(t *testing.T) {
	f := newFixture(t, 1, false)
	var failures atomic.Int32
	f.sweeper.opts.Client = interceptor.NewClient(f.client.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if obj.GetName() == f.node.Name && failures.Add(1) <= 2 {
				return apierrors.NewServiceUnavailable("etcd leader election")
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	done := make(chan Summary, 1)
	go func() { done <- f.sweeper.Run(context.Background(), f.restart()) }()
	sum := summaryOf(t, done, "the sweep did not end")
	if !sum.Recorded {
		t.Errorf("summary %+v: the marker was not recorded after the patch failed twice", sum)
	}
	if m := f.handledMarker(t); m != f.restart().Marker {
		t.Errorf("handled marker %q, want %q", m, f.restart().Marker)
	}
}
