package e2e

import (
	"fmt"
	"maps"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/volume-healer/volume-healer/refdriver/control"
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
		v.SetCondition(t, control.Hung, 400*time.Millisecond)
	}
	detaching.SetCondition(t, control.Gone, 0)
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

// TestLeaderCutOffMidHeal runs two controller replicas with leader election and cuts the leader
// off in the middle of its calls on hung volumes: first from the API server alone (its renewals
// fail while it still reaches the sidecar and starts calls), then from everything (SIGSTOP: its
// connections stay open, and nothing it sent is ever cancelled). Its calls must end before the
// standby can take the Lease over: the sidecar and the driver end them at the deadline they carry,
// the end of the time the leader knew it held the Lease, not at their own timeout. The standby
// takes over and heals every volume; no volume ever has two calls at once, and no call is turned
// away as busy. Then the old leader runs again, reconnected: it leaves the new leader's Lease
// alone, makes no call that overlaps the new leader's, and exits.
func TestLeaderCutOffMidHeal(t *testing.T) {
	f := newFixture(t, "cutoff")
	sc := f.StorageClass("cutoff-rbd-nbd", "rbd-nbd", nil)
	b := budgets{global: 2, perDriver: 2, perNode: 2}
	n := f.newNode("cutoff-node-1")
	vols := f.newVolumes(n, sc, "rbd-nbd", "v", 4)
	f.CreateVolumes(vols, true)
	n.start()

	// The leader steps down 12s after its last renewal; the standby takes over 15s after it.
	const timeout = 13 * time.Second
	settings := b.withSettings(map[string]string{
		"LEADER_ELECTION_ENABLED":        "true",
		"LEADER_ELECTION_LEASE_DURATION": "15s",
		"LEADER_ELECTION_RENEW_DEADLINE": "12s",
		"LEADER_ELECTION_RETRY_PERIOD":   "500ms",
		"LEADER_ELECTION_CALL_MARGIN":    "1s",
		// As long as the Lease allows: a call the leader starts late in its renew deadline would
		// outlive its Lease by most of this, were the call not cut at the Lease's end.
		"TIMEOUTS_PROBE": timeout.String(),
		"TIMEOUTS_HEAL":  timeout.String(),
		// Periodic sweeps every second: the leader's own clock fires them, without the API server.
		"SCHEDULE_DEFAULT": "@every 1s",
	})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	proxy, err := harness.ProxiedKubeconfig(f.s.Kubeconfig, kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	viaProxy := maps.Clone(settings)
	viaProxy["KUBECONFIG"] = kubeconfig
	leader := f.startController("cutoff-a", viaProxy)
	harness.Eventually(t, time.Minute, "the first replica to lead", func() (bool, string) {
		v := leader.Metric("volume_healer_leader", nil)
		return v == 1, fmt.Sprintf("volume_healer_leader = %v", v)
	})
	f.sweepsFinished([]*node{n}, time.Minute)
	standby := f.startController("cutoff-b", settings)
	if v := standby.Metric("volume_healer_leader", nil); v != 0 {
		t.Fatalf("the second replica leads (volume_healer_leader = %v) while the first lives", v)
	}

	// Cut off from the API server, the leader renews its Lease no more, and goes on sweeping until
	// its renew deadline. Well into it, its sweeps find the volumes hung, and it holds two calls on
	// them (its budget); then it freezes, the calls in flight.
	cutAt := time.Now()
	proxy.Cut()
	time.Sleep(time.Until(cutAt.Add(4 * time.Second)))
	hungAt := time.Now()
	for _, v := range vols {
		v.SetCondition(t, control.Hung, time.Hour)
	}
	harness.Eventually(t, 5*time.Second, "the cut-off leader to hold calls on hung volumes", func() (bool, string) {
		held := inFlightSince(t, n, hungAt)
		return held == b.perNode, fmt.Sprintf("%d calls in flight started after the volumes hung", held)
	})
	leader.MustRun()
	if err := leader.Pause(); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	if took := frozenAt.Sub(cutAt); took > 10*time.Second {
		t.Fatalf("the leader was frozen %s after it was cut off, too close to its renew deadline of 12s for this test to mean anything", took)
	}
	// From now on a call on these volumes returns soon: the new leader can heal them.
	for _, v := range vols {
		v.SetCondition(t, control.Hung, 300*time.Millisecond)
	}

	harness.Eventually(t, time.Minute, "the standby to take the Lease over", func() (bool, string) {
		standby.MustRun()
		v := standby.Metric("volume_healer_leader", nil)
		return v == 1, fmt.Sprintf("volume_healer_leader = %v", v)
	})
	harness.Eventually(t, 2*time.Minute, "the new leader to heal every volume", func() (bool, string) {
		for _, v := range vols {
			if c := v.Condition(t); c != control.Healthy {
				return false, fmt.Sprintf("%s is %s", v.PV, c)
			}
		}
		return true, ""
	})

	// The old leader runs again, and reaches the API server again.
	lease := f.lease()
	proxy.Restore()
	if err := leader.Resume(); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "the old leader to exit once it sees it lost the Lease", func() (bool, string) {
		return !leader.Running(), "running"
	})
	t.Logf("the old leader exited: %s", leader.ExitStatus())
	if after := f.lease(); *after.Spec.HolderIdentity != *lease.Spec.HolderIdentity || *after.Spec.LeaseTransitions != *lease.Spec.LeaseTransitions {
		t.Errorf("the old leader changed the new leader's Lease: holder %s, transitions %d before it ran again; holder %s, transitions %d after",
			*lease.Spec.HolderIdentity, *lease.Spec.LeaseTransitions, *after.Spec.HolderIdentity, *after.Spec.LeaseTransitions)
	}
	standby.MustRun()
	if v := standby.Metric("volume_healer_leader", nil); v != 1 {
		t.Errorf("volume_healer_leader of the new leader = %v after the old one ran again, want 1", v)
	}

	f.verify([]*node{n}, b, outcome{healed: vols})

	// The calls the old leader started while its renewals failed ended when the time it knew it
	// held the Lease ran out: before their own timeout, and before the new leader's first call.
	calls, _, err := n.record()
	if err != nil {
		t.Fatal(err)
	}
	var cut []control.Call
	var firstNew time.Time
	for _, c := range calls {
		switch {
		case c.Start.After(hungAt) && c.Start.Before(frozenAt):
			cut = append(cut, c)
		case c.Start.After(frozenAt) && (firstNew.IsZero() || c.Start.Before(firstNew)):
			firstNew = c.Start
		}
	}
	if len(cut) < b.perNode {
		t.Fatalf("the driver logged %d calls started between the volumes hanging and the leader freezing, want %d", len(cut), b.perNode)
	}
	for _, c := range cut {
		ran := c.End.Sub(c.Start)
		switch {
		case c.End.IsZero():
			t.Errorf("%s of %s, started %s after the cut, never ended", c.RPC, c.VolumeID, c.Start.Sub(cutAt))
		case ran > timeout-time.Second:
			t.Errorf("%s of %s, started %s after the cut, ran %s: to its own timeout (%s), past the end of the leader's Lease",
				c.RPC, c.VolumeID, c.Start.Sub(cutAt), ran, timeout)
		case !c.End.Before(firstNew):
			t.Errorf("%s of %s ended %s after the new leader's first call started", c.RPC, c.VolumeID, c.End.Sub(firstNew))
		default:
			t.Logf("%s of %s, started %s after the cut, was cut short after %s, %s before the new leader's first call",
				c.RPC, c.VolumeID, c.Start.Sub(cutAt).Round(time.Millisecond), ran.Round(time.Millisecond), firstNew.Sub(c.End).Round(time.Millisecond))
		}
	}
}

// inFlightSince counts the calls the node's driver logged as started after since and not ended.
func inFlightSince(t *testing.T, n *node, since time.Time) int {
	t.Helper()
	calls, _, err := n.record()
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, c := range calls {
		if c.Start.After(since) && c.End.IsZero() {
			held++
		}
	}
	return held
}

// lease reads the test's leader election Lease.
func (f *fixture) lease() *coordinationv1.Lease {
	f.t.Helper()
	var l coordinationv1.Lease
	if err := f.Client.Get(f.Ctx(), client.ObjectKey{Namespace: harness.ControllerNamespace, Name: f.Name}, &l); err != nil {
		f.t.Fatalf("read the Lease: %v", err)
	}
	if l.Spec.HolderIdentity == nil || l.Spec.LeaseTransitions == nil {
		f.t.Fatalf("the Lease %s/%s names no holder or no transitions: %+v", l.Namespace, l.Name, l.Spec)
	}
	return &l
}
