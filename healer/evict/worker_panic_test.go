package evict

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volume-healer/volume-healer/policy"
	"github.com/volume-healer/volume-healer/test/harness/poll"
)

type neverDecides struct{}

func (neverDecides) DecideRestart(context.Context, *policy.RestartInput) (policy.RestartDecision, error) {
	panic("no pod is listed, nothing is decided")
}

// A panic while the worker handles one request drops that request, not the controller: the
// worker counts it and goes on with the next request.
func TestWorkerPanicDropsThatRequestOnly(t *testing.T) {
	cs := fake.NewClientset()
	var lists atomic.Int32
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) == 1 {
			panic("a malformed pod list")
		}
		return true, &corev1.PodList{}, nil
	})
	m := NewMetrics(prometheus.NewRegistry())
	e, err := New(Options{Client: cs, Policy: neverDecides{}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- e.Start(ctx) }()
	defer func() {
		cancel()
		<-stopped
	}()

	e.Add(Request{PV: "pv-1", Node: "node-a", Claim: types.NamespacedName{Namespace: "app", Name: "claim-1"}, HealedAt: time.Now()})
	poll.Eventually(t, 10*time.Second, "the panicking request to be dropped", func() (bool, string) {
		return lists.Load() == 1 && e.Idle(), fmt.Sprintf("%d lists, idle %t", lists.Load(), e.Idle())
	})
	e.Add(Request{PV: "pv-2", Node: "node-a", Claim: types.NamespacedName{Namespace: "app", Name: "claim-2"}, HealedAt: time.Now()})
	poll.Eventually(t, 10*time.Second, "the next request to be handled", func() (bool, string) {
		return lists.Load() == 2 && e.Idle(), fmt.Sprintf("%d lists, idle %t", lists.Load(), e.Idle())
	})
	if got := testutil.ToFloat64(m.goroutinePanics.WithLabelValues(goroutineWorker)); got != 1 {
		t.Errorf("volume_healer_evictions_goroutine_panics_total{goroutine=%q} = %v, want 1", goroutineWorker, got)
	}
}
