package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/cmd/refdriver/driver"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestLeaderKilledMidSweep runs two controller replicas with leader election and kills the leader
// with SIGKILL in the middle of a restart sweep over two nodes: no shutdown, no Lease release,
// calls cut off mid-flight. The standby takes the Lease over and finishes the sweep; every broken
// volume is healed, no volume ever has two calls at once across the two replicas, the budgets hold
// across the takeover, and the detaching volume is never called.
func TestLeaderKilledMidSweep(t *testing.T) {
	f := newFixture(t, "leader")
	sc := f.StorageClass("leader-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 3, perDriver: 3, perNode: 2}
	nodes := []*node{f.newNode("leader-node-1"), f.newNode("leader-node-2")}
	var vols []*volume
	for i, n := range nodes {
		vols = append(vols, f.newVolumes(n, sc, "rbd-nbd", fmt.Sprintf("n%d", i+1), 8)...)
	}
	f.CreateVolumes(vols, true)
	detaching := vols[len(vols)-1]
	f.Detach(detaching)
	for _, n := range nodes {
		n.start()
	}
	// A Lease short enough for a quick takeover, long enough that a replica slowed down by the
	// race detector on a busy machine does not lose it while it lives.
	settings := b.withSettings(map[string]string{
		"LEADER_ELECTION_ENABLED":        "true",
		"LEADER_ELECTION_LEASE_DURATION": "6s",
		"LEADER_ELECTION_RENEW_DEADLINE": "4s",
		"LEADER_ELECTION_RETRY_PERIOD":   "500ms",
		"LEADER_ELECTION_CALL_MARGIN":    "1s",
		// At most the lease duration less the retry period and the margin.
		"TIMEOUTS_PROBE": "4s",
		"TIMEOUTS_HEAL":  "4s",
	})
	leader := f.startController("leader-a", settings)
	harness.Eventually(t, time.Minute, "the first replica to lead", func() (bool, string) {
		v := leader.Metric("volume_healer_leader", nil)
		return v == 1, fmt.Sprintf("volume_healer_leader = %v", v)
	})
	f.sweepsFinished(nodes, time.Minute)
	standby := f.startController("leader-b", settings)
	if v := standby.Metric("volume_healer_leader", nil); v != 0 {
		t.Fatalf("the second replica leads (volume_healer_leader = %v) while the first lives", v)
	}

	healed := vols[:len(vols)-1]
	for _, v := range healed {
		v.SetCondition(t, driver.Hung, 400*time.Millisecond)
	}
	detaching.SetCondition(t, driver.Gone, 0)
	restartedAt := time.Now()
	for _, n := range nodes {
		n.restart()
	}
	heals := func() int {
		count := 0
		for _, n := range nodes {
			count += countCalls(t, n, "HealVolume", restartedAt)
		}
		return count
	}
	harness.Eventually(t, time.Minute, "the leader's restart sweeps to be under way", func() (bool, string) {
		count := heals()
		return count >= 3, fmt.Sprintf("%d heals", count)
	})
	if err := leader.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if count := heals(); count >= len(healed) {
		t.Fatalf("the sweeps had healed all %d volumes before the leader was killed; it must be killed mid-sweep", count)
	} else {
		t.Logf("leader killed after %d of %d heals", count, len(healed))
	}

	harness.Eventually(t, time.Minute, "the standby to take the Lease over", func() (bool, string) {
		standby.MustRun()
		v := standby.Metric("volume_healer_leader", nil)
		return v == 1, fmt.Sprintf("volume_healer_leader = %v", v)
	})
	f.sweepsFinished(nodes, 2*time.Minute)
	standby.MustRun()
	f.verify(nodes, b, outcome{healed: healed, untouched: []*volume{detaching}})
	if n := standby.Metric("volume_healer_sweeps_started_total", map[string]string{"trigger": "restart"}); n < 1 {
		t.Errorf("the standby started %v restart sweeps; it must finish those the killed leader left", n)
	}
}
