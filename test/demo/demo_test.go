package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/test/cluster"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestDemo runs the demo end to end, small, in every mode, so that `make demo` cannot rot: the
// controller as a process, real sidecars and reference drivers, a node plugin restart healed and a
// periodic sweep's heal. run fails unless every promise of the story held: in the real mode every
// healable mount healed and its workload writing again, the workload that cannot see a heal and
// the lost volume reported, healerctl status showing an operator exactly that, and nothing
// mounted or running left behind. On a real node: every pod of the StatefulSet saw its writes
// fail and come back in the same container, with a VolumeHealed Event on its PVC; the controller's
// metrics show probes that found dead mounts and heals after the rollout restart; the pod with
// propagation None evicted (VolumePodsMustRestart, EvictedForStaleMount) and its replacement
// writing; the volume whose data was removed reported (VolumeDataLoss) and not healed; and
// the stock driver's node plugin (no Healer service, rclone) restarted, each of its pods evicted
// for the recycle of its volume and replaced by one that writes (realcluster's DisruptStock); and
// healerctl status listing the node's restart as handled and exactly that volume as needing a
// human, with exit code 2.
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
		node    bool
	}{
		// make demo's choice where a real node can run: its build is hack/node.sh's (make test
		// runs it first), its timeout covers the images' build.
		"on a real node": {mode: modeCluster, real: true, node: true},
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
			if why := cluster.Unavailable(); tc.node && why != "" {
				if os.Getenv("CI") == "true" {
					t.Fatalf("cannot run a node here (%s), and CI (CI=true) must run the demo on one", why)
				}
				t.Skip("cannot run a node here: " + why)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
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
