package healer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/volume-healer/volume-healer/probe"
)

// recountUnhealthy is the gauge computed the slow way, from every remembered volume, as the
// reference the kept counts must equal.
func recountUnhealthy(m *memory) map[unhealthyKey]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[unhealthyKey]int{}
	for _, nodes := range m.states {
		for _, s := range nodes {
			countOne(out, s)
		}
	}
	return out
}

// countOne adds s's statuses to out, as the gauge counts them.
func countOne(out map[unhealthyKey]int, s *volumeState) {
	if s.history.LastProbe == nil || s.history.LastProbe.Healthy {
		return
	}
	seen := map[string]bool{}
	for _, h := range s.history.LastProbe.Health {
		if !seen[string(h.Status)] {
			seen[string(h.Status)] = true
			out[unhealthyKey{s.driver, string(h.Status)}]++
		}
	}
}

func sameCounts(a, b map[unhealthyKey]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, n := range a {
		if b[k] != n {
			return false
		}
	}
	return true
}

// randomResult is a probe result: healthy a third of the time, else one to three statuses,
// repeats included, some outside the known vocabulary.
func randomResult(r *rand.Rand) *probe.Result {
	statuses := []string{"DEGRADED", "INACCESSIBLE", "DATA_LOSS", "SOMETHING_NEW"}
	res := &probe.Result{Healable: r.IntN(2) == 0}
	if r.IntN(3) == 0 {
		return res
	}
	for range 1 + r.IntN(3) {
		res.Health = append(res.Health, probe.Health{Status: statuses[r.IntN(len(statuses))], Reason: "Because"})
	}
	return res
}

func TestUnhealthyCountsMatchRecount(t *testing.T) {
	drivers := []string{"rbd.csi.ceph.com", "cephfs.csi.ceph.com", "nfs.csi.k8s.io"}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for seed := range uint64(200) {
		t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			m := newMemory()
			var ops []string
			for step := range 300 {
				pv := fmt.Sprintf("pv-%d", r.IntN(12))
				node := fmt.Sprintf("node-%d", r.IntN(2))
				switch op := r.IntN(10); {
				case op < 5:
					// A volume's driver can differ between probes only if the PV was recreated under
					// the same name; the counts must follow it all the same.
					driver := drivers[r.IntN(len(drivers))]
					res := randomResult(r)
					m.recordProbe(pv, node, driver, at, res, 1)
					ops = append(ops, fmt.Sprintf("probe %s %s %s %v", pv, node, driver, res.Health))
				case op < 6:
					m.recordFailure(pv, node)
					ops = append(ops, "failure "+pv+" "+node)
				case op < 7:
					m.recordHeal(pv, node, at)
					ops = append(ops, "heal "+pv+" "+node)
				default:
					m.forget(pv)
					ops = append(ops, "forget "+pv)
				}
				if got, want := m.unhealthy(), recountUnhealthy(m); !sameCounts(got, want) {
					t.Fatalf("after step %d, counts %v, recount %v; operations:\n%s", step, got, want, strings.Join(ops, "\n"))
				}
			}
		})
	}
}

func TestForgetRemovesUnhealthyVolume(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &Sweeper{mem: newMemory()}
	inaccessible := &probe.Result{Health: []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}}}
	both := &probe.Result{Health: []probe.Health{{Status: "INACCESSIBLE", Reason: "MountGone"}, {Status: "DEGRADED", Reason: "Slow"}}}
	s.mem.recordProbe("pv-1", "node-a", "rbd", at, inaccessible, 0)
	s.mem.recordProbe("pv-2", "node-a", "rbd", at, both, 0)
	s.mem.recordProbe("pv-3", "node-a", "rbd", at, &probe.Result{}, 0)

	expect := func(what, want string) {
		t.Helper()
		header := "# HELP volume_healer_volumes_unhealthy Volumes whose last probe found them unhealthy, by driver and health status (DEGRADED, INACCESSIBLE, DATA_LOSS).\n" +
			"# TYPE volume_healer_volumes_unhealthy gauge\n"
		if want != "" {
			want = header + want
		}
		if err := testutil.CollectAndCompare(s, strings.NewReader(want), "volume_healer_volumes_unhealthy"); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	expect("two unhealthy volumes", `volume_healer_volumes_unhealthy{driver="rbd",status="DEGRADED"} 1
volume_healer_volumes_unhealthy{driver="rbd",status="INACCESSIBLE"} 2
`)
	s.mem.forget("pv-2")
	expect("pv-2 forgotten", `volume_healer_volumes_unhealthy{driver="rbd",status="INACCESSIBLE"} 1
`)
	// Forgetting twice, or a volume never seen, changes nothing.
	s.mem.forget("pv-2")
	s.mem.forget("pv-unknown")
	expect("forgotten again", `volume_healer_volumes_unhealthy{driver="rbd",status="INACCESSIBLE"} 1
`)
	s.mem.recordProbe("pv-1", "node-a", "rbd", at, &probe.Result{}, 0)
	expect("pv-1 healthy again", "")
	// A volume forgotten and probed again counts once.
	s.mem.recordProbe("pv-2", "node-a", "rbd", at, both, 0)
	expect("pv-2 back", `volume_healer_volumes_unhealthy{driver="rbd",status="DEGRADED"} 1
volume_healer_volumes_unhealthy{driver="rbd",status="INACCESSIBLE"} 1
`)
}
