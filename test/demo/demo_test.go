package main

import (
	"context"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/harness"
)

// TestDemo runs the demo end to end, small, in both modes, so that `make demo` cannot rot: the
// controller as a process, real sidecars and reference drivers, a node plugin restart healed and a
// periodic sweep's heal. run fails unless every promise of the story held: in the real mode every
// healable mount healed and its workload writing again, the workload that cannot see a heal and
// the lost volume reported, healerctl status showing an operator exactly that, and nothing
// mounted or running left behind.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the controller and runs a control plane")
	}
	bin, err := harness.Build(harness.BuildOptions{NodePlugin: true, Healerctl: true})
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		mode    string
		volumes int
		real    bool
	}{
		// The restarted node needs a lost volume, one seen by a workload with propagation None
		// and one seen with HostToContainer; the other node a read-only and a frozen mount.
		"real mounts killed and healed": {mode: modeReal, volumes: 3, real: true},
		"simulated volumes":             {mode: modeSimulated, volumes: 8},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.real {
				harness.RequireRealMounts(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			err := run(ctx, options{
				mode: tc.mode, nodes: 2, volumes: tc.volumes, controller: bin.Controller, refdriver: bin.Driver, healerctl: bin.Healerctl,
				dir: t.TempDir(), schedule: "@every 2s", timeout: 2 * time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
