package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestAPIWritesEndWithinTheirTimeout writes through the controller's API client to an API server
// that never answers, with a context that has no deadline (a sweep's): every write must end with
// DeadlineExceeded within the write timeout instead of holding the sweep.
func TestAPIWritesEndWithinTheirTimeout(t *testing.T) {
	hang := func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, _ client.WithWatch, _ client.Object, _ ...client.CreateOption) error {
			return hang(ctx)
		},
		Update: func(ctx context.Context, _ client.WithWatch, _ client.Object, _ ...client.UpdateOption) error {
			return hang(ctx)
		},
		Patch: func(ctx context.Context, _ client.WithWatch, _ client.Object, _ client.Patch, _ ...client.PatchOption) error {
			return hang(ctx)
		},
		Delete: func(ctx context.Context, _ client.WithWatch, _ client.Object, _ ...client.DeleteOption) error {
			return hang(ctx)
		},
	}).Build()
	const timeout = 100 * time.Millisecond
	w := boundWrites(c, timeout)
	pvc := func() *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim"}}
	}
	tests := map[string]func(context.Context) error{
		"create": func(ctx context.Context) error { return w.Create(ctx, pvc()) },
		"update": func(ctx context.Context) error { return w.Update(ctx, pvc()) },
		"patch": func(ctx context.Context) error {
			return w.Patch(ctx, pvc(), client.RawPatch(types.MergePatchType, []byte(`{}`)))
		},
		"delete": func(ctx context.Context) error { return w.Delete(ctx, pvc()) },
	}
	for name, write := range tests {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- write(context.Background()) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("write to a hung API server = %v, want DeadlineExceeded", err)
				}
			case <-time.After(10 * timeout):
				t.Fatalf("write to a hung API server still waiting after %s, with a write timeout of %s", 10*timeout, timeout)
			}
		})
	}
}
