package realcluster

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/test/cluster"
)

// The soak's settings: go test -run TestSoak ./test/realcluster/ -args -soak.duration=30m.
var (
	soakSeed     = flag.Uint64("soak.seed", 0, "seed of the soak's faults; 0: a new one, printed at the start")
	soakDuration = flag.Duration("soak.duration", 4*time.Minute, "how long the soak injects faults once the node and its workloads are up")
	soakFaults   = flag.Int("soak.faults", 0, "the most faults the soak injects; 0: as many as fit in -soak.duration")
)

// TestSoak runs the real node of TestRealNode with the charts installed the same way and three
// volumes (a StatefulSet of two pods with HostToContainer propagation, a Deployment with None),
// and injects faults at random, seeded, one at a time, for -soak.duration: the node plugin's
// driver container killed and its DaemonSet restarted, a mounter killed or stopped and
// continued, the controller killed, a broken policy stored while a mounter dies. After each
// fault every workload must write and read again within the recovery bound, each failure have
// an Event of the controller, and the node come back to the same mounts and mounters; the
// invariants of invariants.go are checked every second meanwhile. The summary prints the faults
// by kind, heals, evictions, violations and leaks (both must be none) and the slowest recovery.
//
// make test runs it for 4 minutes of faults; make soak for longer (SOAK_DURATION).
func TestSoak(t *testing.T) {
	seed := *soakSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("soak: seed %d (replay with -args -soak.seed=%d)", seed, seed)
	c, assets := cluster.StartForTest(t)
	e := Install(t, c, assets)
	e.WaitOneCSIAddonsNode(t, 2*time.Minute)
	e.OptInToPodRestarts()
	shared := e.StatefulSet("shared", corev1.MountPropagationHostToContainer, 2)
	private := e.Deployment("private", corev1.MountPropagationNone)
	shared.WaitAllWriting(t, 3*time.Minute)
	private.WaitWriting(t, time.Time{}, 3*time.Minute, nil)

	r := e.Soak(t, []*Workload{shared, private}, SoakOptions{Seed: seed, Duration: *soakDuration, Faults: *soakFaults})
	if len(r.Violations) > 0 {
		t.Errorf("%d invariants violated", len(r.Violations))
	}
	if len(r.Leaks) > 0 {
		t.Errorf("%d leaks", len(r.Leaks))
	}
}
