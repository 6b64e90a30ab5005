package sidecar

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A call whose handling panics is answered Internal and counted; the sidecar, and the calls
// after it, go on.
func TestPanickingCallIsAnsweredInternal(t *testing.T) {
	s := &Sidecar{metrics: NewMetrics(prometheus.NewRegistry())}
	info := &grpc.UnaryServerInfo{FullMethod: "/healer.v1alpha1.NodeHealer/HealVolume"}
	_, err := s.recoverPanics(context.Background(), nil, info, func(context.Context, any) (any, error) {
		panic("index out of range")
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("a panicking call answered %v, want Internal", err)
	}
	if n := testutil.ToFloat64(s.metrics.panics.WithLabelValues("HealVolume")); n != 1 {
		t.Errorf("volume_healer_sidecar_panics_total{rpc=HealVolume} = %v, want 1", n)
	}
	resp, err := s.recoverPanics(context.Background(), nil, info, func(context.Context, any) (any, error) { return "ok", nil })
	if err != nil || resp != "ok" {
		t.Errorf("the next call answered %v, %v; want it served", resp, err)
	}
}
