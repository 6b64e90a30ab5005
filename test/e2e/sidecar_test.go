package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// goroutineSlack is how many goroutines more than before the faults the controller may keep once
// everything has settled: connections to the new sidecars and timers come and go. A leak of one
// goroutine per timed-out or cut-off call would exceed it, as the test makes more such calls.
const goroutineSlack = 10

// TestSidecarHungAndKilledMidCall freezes one node's sidecar (SIGSTOP) while the controller's calls
// to it are in flight, then kills another node's sidecar (SIGKILL) in the middle of calls. The
// calls to the frozen sidecar time out and give their budget slots back: with a global budget of
// two, the other node's restart sweep completes while the frozen sidecar still holds its socket
// open. Each broken sidecar's restart stays pending, never recorded as handled, while its calls
// fail; new sidecars replace them, as the kubelet restarts a crashed container after its back-off,
// and their restart sweeps heal every broken volume. Afterwards the controller has nothing in flight and no more goroutines
// than before the faults.
func TestSidecarHungAndKilledMidCall(t *testing.T) {
	f := newFixture(t, "sidecar")
	sc := f.StorageClass("sidecar-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 2, perDriver: 2, perNode: 2}
	hungNode, killedNode := f.newNode("sidecar-node-1"), f.newNode("sidecar-node-2")
	hungVols := f.newVolumes(hungNode, sc, "rbd-nbd", "n1", 4)
	killedVols := f.newVolumes(killedNode, sc, "rbd-nbd", "n2", 5)
	f.CreateVolumes(append(append([]*volume{}, hungVols...), killedVols...), true)
	detaching := killedVols[4]
	f.Detach(detaching)
	hungNode.start()
	killedNode.start()
	c := f.startController("sidecar", b.withSettings(sidecarFaultSettings))
	f.sweepsFinished([]*node{hungNode, killedNode}, time.Minute)
	c.WaitIdle(time.Minute)
	before := goroutines(c)

	// The hung sidecar: its node plugin restarts with slow volumes (1s, inside the 2s deadline)
	// and the sidecar freezes while the restart sweep's calls are in flight.
	for _, v := range hungVols {
		v.SetCondition(t, control.Hung, time.Second)
	}
	hungNode.restart()
	waitInFlight(t, hungNode)
	frozen := hungNode.sidecarProc()
	if err := frozen.Pause(); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	// While it is frozen, the other node plugin restarts with broken volumes; its sweep needs
	// the budget slots the frozen sidecar's calls held.
	for _, v := range killedVols[:4] {
		v.SetCondition(t, control.Gone, 0)
	}
	detaching.SetCondition(t, control.Gone, 0)
	killedNode.restart()
	f.SweepFinished(killedNode.name, 2*time.Minute)
	if !frozen.Running() {
		t.Fatal("the frozen sidecar exited")
	}
	t.Logf("the other node's sweep finished %s after the sidecar froze", time.Since(pausedAt).Round(100*time.Millisecond))
	harness.Eventually(t, time.Minute, "calls to the frozen sidecar to time out", func() (bool, string) {
		n := c.Metric("volume_healer_call_errors_total", map[string]string{"reason": "timeout"})
		return n >= 4, fmt.Sprintf("%v calls timed out", n)
	})
	// The frozen sidecar is killed, as a failed liveness probe would have it; its restart stays
	// pending while nothing answers, and a new sidecar takes its place.
	if err := frozen.Kill(); err != nil {
		t.Fatal(err)
	}
	f.SweepPending(hungNode.name, 2*time.Minute)
	hungNode.startSidecar(true)

	// The killed sidecar: its node plugin restarts with slow volumes and the sidecar dies with
	// calls in flight, then comes back while its restart is pending.
	for _, v := range killedVols[:4] {
		v.SetCondition(t, control.Hung, time.Second)
	}
	killedNode.restart()
	waitInFlight(t, killedNode)
	if err := killedNode.sidecarProc().Kill(); err != nil {
		t.Fatal(err)
	}
	f.SweepPending(killedNode.name, 2*time.Minute)
	killedNode.startSidecar(true)

	f.sweepsFinished([]*node{hungNode, killedNode}, 2*time.Minute)
	c.WaitIdle(time.Minute)
	c.MustRun()
	timeouts := c.Metric("volume_healer_call_errors_total", map[string]string{"reason": "timeout"})
	failures := c.Metric("volume_healer_call_errors_total", nil) - timeouts
	var after int
	harness.Eventually(t, time.Minute, "the controller's goroutines to come back down", func() (bool, string) {
		after = goroutines(c)
		return after <= before+goroutineSlack, fmt.Sprintf("%d goroutines before the faults, %d now (slack %d)", before, after, goroutineSlack)
	})
	t.Logf("goroutines: %d before the faults, %d after; %v calls timed out, %v failed otherwise", before, after, timeouts, failures)
	if timeouts+failures <= goroutineSlack {
		t.Errorf("only %v calls timed out or failed: too few for the goroutine check to see a leak of one per call", timeouts+failures)
	}
	f.verify([]*node{hungNode, killedNode}, b, outcome{
		healed:    append(append([]*volume{}, hungVols...), killedVols[:4]...),
		untouched: []*volume{detaching},
	})
}

// sidecarFaultSettings make calls to a dead or frozen sidecar end and be given up within seconds.
var sidecarFaultSettings = map[string]string{
	"TIMEOUTS_PROBE": "2s",
	"TIMEOUTS_HEAL":  "2s",
	"BACKOFF_BASE":   "300ms",
	"BACKOFF_MAX":    "1s",
}

// TestSidecarReplacedWhileCallsRetry kills a sidecar with calls in flight and starts its
// replacement at once, as the kubelet restarts a crashed container the first time, while the
// controller still retries the calls that failed against the dead sidecar. The replacement's
// restart marker must bring a sweep that calls the new sidecar and heals the broken volumes; the
// retries aimed at the dead sidecar's address must not stand in for it.
func TestSidecarReplacedWhileCallsRetry(t *testing.T) {
	f := newFixture(t, "replaced")
	sc := f.StorageClass("replaced-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 2, perDriver: 2, perNode: 2}
	n := f.newNode("replaced-node-1")
	vols := f.newVolumes(n, sc, "rbd-nbd", "vol", 4)
	f.CreateVolumes(vols, true)
	n.start()
	// Retries far enough apart that the replacement registers while they still go on.
	c := f.startController("replaced", b.withSettings(map[string]string{
		"TIMEOUTS_PROBE": "2s",
		"TIMEOUTS_HEAL":  "2s",
		"BACKOFF_BASE":   "1s",
		"BACKOFF_MAX":    "4s",
	}))
	f.SweepFinished(n.name, time.Minute)

	for _, v := range vols {
		v.SetCondition(t, control.Hung, time.Second)
	}
	n.restart()
	waitInFlight(t, n)
	if err := n.sidecarProc().Kill(); err != nil {
		t.Fatal(err)
	}
	n.startSidecar(true)
	f.SweepFinished(n.name, 2*time.Minute)
	c.WaitIdle(time.Minute)
	c.MustRun()
	f.verify([]*node{n}, b, outcome{healed: vols})
}

// waitInFlight waits until the node's driver serves at least one call.
func waitInFlight(t *testing.T, n *node) {
	t.Helper()
	harness.Eventually(t, time.Minute, "a call in flight on "+n.name, func() (bool, string) {
		inFlight := n.inFlight()
		return inFlight > 0, fmt.Sprintf("%d calls in flight", inFlight)
	})
}

// goroutines reads the controller's go_goroutines.
func goroutines(c *harness.TestController) int {
	return int(c.Metric("go_goroutines", nil))
}

// TestRestartSweptOnceTheSidecarAnswers: a node plugin restarts and its sidecar stops answering
// right after it registered (frozen, as a sidecar stuck on an unreachable TokenReview or behind a
// NetworkPolicy would look) for 30 seconds. The restart must not be recorded as handled in that
// time: it stays pending, said by an Event. Once the sidecar answers again, the same restart is
// swept, its broken volumes healed, and only then is its marker recorded.
func TestRestartSweptOnceTheSidecarAnswers(t *testing.T) {
	const unreachable = 30 * time.Second
	f := newFixture(t, "late")
	sc := f.StorageClass("late-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 4, perDriver: 4, perNode: 4}
	n := f.newNode("late-node-1")
	vols := f.newVolumes(n, sc, "rbd-nbd", "late", 3)
	f.CreateVolumes(vols, true)
	n.start()
	c := f.startController("late", b.withSettings(sidecarFaultSettings))
	f.sweepsFinished([]*node{n}, time.Minute)

	for _, v := range vols {
		v.SetCondition(t, control.Gone, 0)
	}
	n.restart()
	frozen := n.sidecarProc()
	if err := frozen.Pause(); err != nil {
		t.Fatal(err)
	}
	marker := f.SweepPending(n.name, time.Minute)
	for deadline := time.Now().Add(unreachable); time.Now().Before(deadline); time.Sleep(time.Second) {
		if handled := f.AddonsNode(n.name).Annotations[annotations.HandledMarker]; handled == marker {
			t.Fatalf("restart %q recorded as handled while its sidecar did not answer", marker)
		}
	}
	if tries := c.Metric("volume_healer_restart_sweep_retries_total", nil); tries < 2 {
		t.Errorf("volume_healer_restart_sweep_retries_total = %v after %s unreachable, want the sweep tried again", tries, unreachable)
	}
	// What an operator sees meanwhile: the restart pending, and past the threshold a human's job.
	code, st := f.healerctlStatus(n.name, "--pending-threshold=20s")
	if code != 2 || st.State != "pending" || !st.NeedsHuman || st.LastSweep == nil || st.LastSweep.Reason != healer.ReasonRestartSweepPending {
		t.Errorf("healerctl status while the sidecar is frozen: exit %d, %+v; want exit 2 and the restart pending with its %s Event, needing a human",
			code, st, healer.ReasonRestartSweepPending)
	}
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if got := f.SweepFinished(n.name, 2*time.Minute); got != marker {
		t.Errorf("handled marker %q, want the restart that was pending (%q)", got, marker)
	}
	// The reference driver serves the Healer service: the controller recorded its tier from the
	// capabilities the sidecar answered.
	if _, st := f.healerctlStatus(n.name, "--pending-threshold=20s"); st.State != "handled" || st.NeedsHuman || st.Tier != "healer" || st.ProbeSource != "driver" {
		t.Errorf("healerctl status once the restart is swept: %+v, want it handled, tier healer, probed by the driver", st)
	}
	c.WaitIdle(time.Minute)
	f.verify([]*node{n}, b, outcome{healed: vols})
}
