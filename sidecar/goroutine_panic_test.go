package sidecar

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	csiaddonsv1alpha1 "github.com/csi-addons/kubernetes-csi-addons/api/csiaddons/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

// panickingWatcher panics on its first Watch, as a bug in following the CSIAddonsNode would.
type panickingWatcher struct {
	client.WithWatch
	calls atomic.Int32
}

func (p *panickingWatcher) Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
	if p.calls.Add(1) == 1 {
		panic("nil map")
	}
	return p.WithWatch.Watch(ctx, list, opts...)
}

// A panic while writing the restart marker, and one while keeping the CSIAddonsNode's
// annotations, are logged, counted and survived: the marker is written in the end, the
// annotations are put back after they were stripped, and the sidecar lives on.
func TestRegistrationSurvivesPanics(t *testing.T) {
	var patches atomic.Int32
	c := fakeClient(t, &interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if patches.Add(1) == 1 {
			panic("index out of range")
		}
		return c.Patch(ctx, obj, patch, opts...)
	}}, csiAddonsNode("node-a-rbd", "rbd.csi.ceph.com", "node-a", map[string]string{annotations.CSIAddonsPod: "pod-1"}))
	r := newRegistrar(t, c, "")
	r.watcher = &panickingWatcher{WithWatch: c.(client.WithWatch)}
	s := &Sidecar{
		opts:            Options{RegisterBackoff: time.Millisecond, RegisterMaxBackoff: 5 * time.Millisecond, Clock: clock.RealClock{}},
		metrics:         NewMetrics(prometheus.NewRegistry()),
		reg:             r,
		driver:          loadedDriver(&driverInfo{name: "rbd.csi.ceph.com"}),
		registered:      make(chan struct{}),
		driverRestarted: make(chan struct{}, 1),
	}
	s.healer = &nodeHealer{nodeName: "node-a", driver: s.driver, metrics: s.metrics}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.runRegistration(ctx)
	}()

	select {
	case <-s.Registered():
	case <-time.After(10 * time.Second):
		t.Fatal("the restart marker was not written after a panic while writing it")
	}
	if got := testutil.ToFloat64(s.metrics.goroutinePanics.WithLabelValues(goroutineRegistration)); got != 1 {
		t.Errorf("volume_healer_sidecar_goroutine_panics_total{goroutine=%q} = %v, want 1", goroutineRegistration, got)
	}
	// keep panicked on its first watch; it must still put the annotations back.
	poll.Eventually(t, 10*time.Second, "keep to watch the CSIAddonsNode again after its panic", func() (bool, string) {
		n := r.watcher.(*panickingWatcher).calls.Load()
		return n >= 2, fmt.Sprintf("%d watches", n)
	})
	name, marker := r.current()
	var n csiaddonsv1alpha1.CSIAddonsNode
	if err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	delete(n.Annotations, annotations.Endpoint)
	if err := c.Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, "the CSIAddonsNode to carry the sidecar's annotations again", func() (bool, string) {
		var n csiaddonsv1alpha1.CSIAddonsNode
		err := c.Get(ctx, client.ObjectKey{Namespace: "csi", Name: name}, &n)
		return err == nil && n.Annotations[annotations.HealerRestart] == marker && n.Annotations[annotations.Endpoint] == "10.0.0.7:9070",
			fmt.Sprintf("%v, %v", n.Annotations, err)
	})
	if got := testutil.ToFloat64(s.metrics.goroutinePanics.WithLabelValues(goroutineRegistrationWatch)); got != 1 {
		t.Errorf("volume_healer_sidecar_goroutine_panics_total{goroutine=%q} = %v, want 1", goroutineRegistrationWatch, got)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the registration did not stop with its context")
	}
}

// loadedDriver is a driver client whose driver has answered, as info says.
func loadedDriver(info *driverInfo) *driverClient {
	d := &driverClient{info: info, loaded: make(chan struct{})}
	close(d.loaded)
	return d
}
