package healer

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/probe"
	"github.com/volume-healer/volume-healer/scheduler"
)

// panickingStaged panics while listing the staged volumes of node-b, as a bug in the decoding of
// one sidecar's answer would, and lists v1 on node-a.
type panickingStaged struct {
	*fakeSidecars
}

func (p panickingStaged) ListStaged(_ context.Context, t probe.Target) ([]probe.StagedVolume, error) {
	if t.Node == "node-b" {
		panic("index out of range")
	}
	return []probe.StagedVolume{{PV: "v1"}}, nil
}

// A panic in the goroutine that lists one node's staged volumes fails that node, not the
// controller: the sweep says which node failed, the other node's volume is probed, and the panic
// is counted.
func TestPanicListingOneNodeFailsThatNodeOnly(t *testing.T) {
	f := newFixture(t, 1, false)
	reg := prometheus.NewRegistry()
	f.sweeper.opts.Metrics = NewMetrics(reg)
	driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "rbd"}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false)}}
	if err := f.caches.Add(driver); err != nil {
		t.Fatal(err)
	}
	b := f.node.DeepCopy()
	b.Name, b.Spec.Driver.NodeID = "node-b-rbd", "node-b"
	b.Annotations[annotations.Endpoint] = "127.0.0.2:9070"
	f.targets.Set(b)
	f.sweeper.opts.Sidecars = panickingStaged{f.sidecars}

	sum := f.sweeper.Run(context.Background(), scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "v1", Marker: "now"})
	if !strings.Contains(sum.Incomplete, "node node-b") || !strings.Contains(sum.Incomplete, "panicked") {
		t.Errorf("incomplete %q, want node-b's list failed by a panic", sum.Incomplete)
	}
	if sum.Probed != 1 {
		t.Errorf("summary %+v, want v1 on node-a probed", sum)
	}
	if got := testutil.ToFloat64(f.sweeper.opts.Metrics.goroutinePanics.WithLabelValues(goroutineStagedList)); got != 1 {
		t.Errorf("volume_healer_sweep_goroutine_panics_total{goroutine=%q} = %v, want 1", goroutineStagedList, got)
	}
	// The controller goes on: the next sweep runs.
	if sum := f.sweeper.Run(context.Background(), scheduler.Sweep{Trigger: scheduler.TriggerManual, PV: "v1", Marker: "again"}); sum.Probed != 1 {
		t.Errorf("the next sweep's summary %+v, want v1 probed", sum)
	}
}
