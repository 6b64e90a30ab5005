package healer

import (
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/volume-healer/volume-healer/probe"
)

func TestSidecarCallErrorReasons(t *testing.T) {
	tests := map[string]struct {
		err  error
		want string
	}{
		"sidecar down":                 {fmt.Errorf("probe of pv on node: %w", probe.ErrUnreachable), "unreachable"},
		"no endpoint published":        {probe.ErrNoEndpoint, "unreachable"},
		"staged list past its bounds":  {fmt.Errorf("node-a: %w", probe.ErrListTooLarge), "malformed"},
		"hung driver":                  {probe.ErrTimeout, "timeout"},
		"token refused":                {probe.ErrRejected, "rejected"},
		"volume busy":                  {probe.ErrBusy, "busy"},
		"bad answer":                   {probe.ErrMalformed, "malformed"},
		"volume not staged there":      {probe.ErrNotStaged, "not_staged"},
		"volume unknown to the driver": {probe.ErrNotFound, "not_found"},
		"anything else":                {errors.New("boom"), "other"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := NewMetrics(prometheus.NewRegistry())
			m.callError("rbd", tc.err)
			if got := testutil.ToFloat64(m.callErrors.WithLabelValues("rbd", tc.want)); got != 1 {
				t.Fatalf("volume_healer_call_errors_total{reason=%q} = %v, want 1", tc.want, got)
			}
		})
	}
}
