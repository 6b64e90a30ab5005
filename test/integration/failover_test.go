package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestLeaderFailoverFinishesTheRestartSweepOnce runs two controller replicas with leader election
// and kills the leader with SIGKILL in the middle of a restart sweep: the other replica takes the
// Lease over and finishes the sweep, no volume ever gets two calls at once, every broken volume is
// healed, and once the restart is recorded as handled nobody sweeps the node again.
func TestLeaderFailoverFinishesTheRestartSweepOnce(t *testing.T) {
	f := newFixture(t, "failover")
	sc := f.StorageClass("failover-rbd-nbd", "rbd-nbd", nil)
	p := f.newPlugin("failover-node-1")
	vols := f.newVolumes(p, sc, "rbd-nbd", "vol", 24)
	f.CreateVolumes(vols, true)
	p.start()

	settings := map[string]string{
		"LEADER_ELECTION_ENABLED":        "true",
		"LEADER_ELECTION_LEASE_NAME":     "failover-test",
		"LEADER_ELECTION_LEASE_DURATION": "3s",
		"LEADER_ELECTION_RENEW_DEADLINE": "2s",
		"LEADER_ELECTION_RETRY_PERIOD":   "500ms",
		"LEADER_ELECTION_CALL_MARGIN":    "500ms",
		// At most the lease duration less the retry period and the margin.
		"TIMEOUTS_PROBE":   "2s",
		"TIMEOUTS_HEAL":    "2s",
		"BUDGETS_PER_NODE": "2",
	}
	first := startController(t, "failover-a", settings)
	// Only the leader sweeps: the first replica leads once the plugin's first start is swept.
	f.SweepFinished(p.Node(), time.Minute)
	if n, _ := harness.MetricValue(first.Scrape(), "volume_healer_sweeps_started_total", map[string]string{"trigger": "restart"}); n != 1 {
		t.Fatalf("the first replica started %v restart sweeps, want 1 (it should lead)", n)
	}
	second := startController(t, "failover-b", settings)
	var finishedBefore int
	harness.Eventually(t, harness.EventWait, "the RestartSweepFinished Event of the first start", func() (bool, string) {
		_, finishedBefore = f.SweepMessages(p.Node())
		return finishedBefore == 1, fmt.Sprintf("%d Events", finishedBefore)
	})

	restartedAt := time.Now()
	p.restart(func() {
		for _, v := range vols {
			v.SetCondition(t, control.Hung, 400*time.Millisecond)
		}
	})
	heals := func() int {
		n := 0
		for _, v := range vols {
			n += p.calls.count(v, "HealVolume", restartedAt)
		}
		return n
	}
	harness.Eventually(t, time.Minute, "the leader's restart sweep to be under way", func() (bool, string) {
		n := heals()
		return n >= 4, fmt.Sprintf("%d heals", n)
	})
	first.Kill()
	if n := heals(); n >= len(vols) {
		t.Fatalf("the sweep had healed all %d volumes before the leader was killed; it must be killed mid-sweep", n)
	}
	t.Logf("leader killed after %d of %d heals", heals(), len(vols))

	f.SweepFinished(p.Node(), 2*time.Minute)
	for _, v := range vols {
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s is %s after the failover, want healthy", v.PV, c)
		}
	}
	if _, perVolume := p.calls.peaks(); perVolume > 1 {
		t.Errorf("a volume had %d calls at once across the two replicas", perVolume)
	}
	for id, n := range p.Driver().Counters().MaxConcurrentPerVolume {
		if n > 1 {
			t.Errorf("volume %s had %d calls at once", id, n)
		}
	}
	harness.Eventually(t, harness.EventWait, "the RestartSweepFinished Event of the restart", func() (bool, string) {
		_, finished := f.SweepMessages(p.Node())
		return finished > finishedBefore, fmt.Sprintf("%d before the restart, %d now", finishedBefore, finished)
	})

	// The restart is handled: no replica may sweep the node again.
	probes := p.calls.total("ProbeVolume")
	time.Sleep(4 * time.Second)
	if n := p.calls.total("ProbeVolume"); n != probes {
		t.Errorf("%d more probes after the restart was recorded as handled", n-probes)
	}
	if _, finished := f.SweepMessages(p.Node()); finished != finishedBefore+1 {
		t.Errorf("%d RestartSweepFinished Events for the restart, want 1", finished-finishedBefore)
	}
	if n, _ := harness.MetricValue(second.Scrape(), "volume_healer_sweeps_started_total", map[string]string{"trigger": "restart"}); n != 1 {
		t.Errorf("the second replica started %v restart sweeps, want 1: the one the killed leader left unfinished", n)
	}
}
