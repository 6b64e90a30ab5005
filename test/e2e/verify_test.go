package e2e

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// budgets are the controller's limits on calls in flight.
type budgets struct {
	global, perDriver, perNode int
}

// settings are the controller settings of the budgets.
func (b budgets) settings() map[string]string {
	return map[string]string{
		"BUDGETS_GLOBAL":     fmt.Sprint(b.global),
		"BUDGETS_PER_DRIVER": fmt.Sprint(b.perDriver),
		"BUDGETS_PER_NODE":   fmt.Sprint(b.perNode),
	}
}

// withSettings returns the budgets' settings with more added.
func (b budgets) withSettings(more map[string]string) map[string]string {
	all := b.settings()
	for k, v := range more {
		all[k] = v
	}
	return all
}

// outcome is what a test expects of its volumes once the controller is done.
type outcome struct {
	// healed were broken and can be healed: each must be healthy again, with a HealVolume call
	// since it broke.
	healed []*volume
	// leftBroken were broken but must stay so, because the driver cannot heal them, the data is
	// lost, or the policy says so: no HealVolume call since they broke, still in the condition
	// they were broken into.
	leftBroken []*volume
	// untouched are detaching: no call at all since their VolumeAttachment began deleting.
	untouched []*volume
}

// peaks are the most calls the drivers served at once.
type peaks struct {
	// all is over every node of the test (all of one CSI driver).
	all int
	// perNode is the highest over the nodes, each on its own.
	perNode int
	// calls counts the ProbeVolume and HealVolume calls served.
	calls int
}

// verify checks, from what the reference drivers served over every start of every node, what
// each e2e test asserts: every healable broken volume healed, never two calls in flight on one
// volume, no call on a detaching volume, no budget exceeded. It returns the peaks, so that a test
// can also check that its calls did overlap (a budget never reached proves nothing).
//
// The budgets are checked on the calls the controller still waited for when they ended. A call
// whose caller had given up (its deadline passed, or the controller or sidecar was killed) freed
// its budget slot in the controller at that moment, while the driver may notice a little later:
// such a call counts for the one-call-per-volume rule, not for the budgets.
func (f *fixture) verify(nodes []*node, b budgets, o outcome) peaks {
	t := f.t
	t.Helper()
	var all []control.Call
	byVolume := map[string][]control.Call{}
	var p peaks
	for _, n := range nodes {
		calls, counters, err := n.record()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range counters {
			for id, most := range c.MaxConcurrentPerVolume {
				if most > 1 {
					t.Errorf("node %s: volume %s had %d calls in flight at once (driver counters)", n.name, id, most)
				}
			}
			for id, count := range c.Aborted {
				t.Errorf("node %s: volume %s: %d calls were turned away as busy: a second call came while one was in flight", n.name, id, count)
			}
		}
		var held []control.Call
		for _, c := range calls {
			byVolume[c.VolumeID] = append(byVolume[c.VolumeID], c)
			if !c.Abandoned {
				held = append(held, c)
			}
		}
		atOnce := mostAtOnce(held)
		if atOnce > b.perNode {
			t.Errorf("node %s served %d calls at once; the per-node budget is %d", n.name, atOnce, b.perNode)
		}
		p.perNode = max(p.perNode, atOnce)
		p.calls += len(calls)
		all = append(all, held...)
	}
	for id, calls := range byVolume {
		if most := mostAtOnce(calls); most > 1 {
			t.Errorf("volume %s had %d calls in flight at once", id, most)
		}
	}
	p.all = mostAtOnce(all)
	if limit := min(b.global, b.perDriver); p.all > limit {
		t.Errorf("the nodes served %d calls at once; the global and per-driver budgets allow %d", p.all, limit)
	}

	since := func(v *volume, at time.Time, rpcs ...string) int {
		count := 0
		for _, c := range byVolume[v.Handle] {
			if slices.Contains(rpcs, c.RPC) && !c.Start.Before(at) {
				count++
			}
		}
		return count
	}
	for _, v := range o.healed {
		if c := v.Condition(t); c != control.Healthy {
			t.Errorf("%s (broken %s, healable) is %s, want healthy", v.PV, v.Broken, c)
		}
		if since(v, v.BrokenAt, "HealVolume") == 0 {
			t.Errorf("%s (broken %s, healable) got no HealVolume call since it broke", v.PV, v.Broken)
		}
	}
	for _, v := range o.leftBroken {
		if c := v.Condition(t); c != v.Broken {
			t.Errorf("%s (broken %s, to be left alone) is %s", v.PV, v.Broken, c)
		}
		if n := since(v, v.BrokenAt, "HealVolume"); n != 0 {
			t.Errorf("%s (broken %s, to be left alone) got %d HealVolume calls", v.PV, v.Broken, n)
		}
	}
	for _, v := range o.untouched {
		if v.DetachedAt.IsZero() {
			t.Fatalf("%s is expected untouched but was never detached", v.PV)
		}
		if n := since(v, v.DetachedAt, "ProbeVolume", "HealVolume"); n != 0 {
			t.Errorf("%s got %d calls after its VolumeAttachment began deleting (detaching)", v.PV, n)
		}
	}
	t.Logf("%d calls served; most at once: %d over all nodes (budget %d), %d on one node (budget %d)",
		p.calls, p.all, min(b.global, b.perDriver), p.perNode, b.perNode)
	return p
}

// mostAtOnce returns the most calls that were in flight at the same moment. A call still in flight
// (no end yet) counts as running until now; a call that ends at the moment another starts does not
// overlap it.
func mostAtOnce(calls []control.Call) int {
	type edge struct {
		at    time.Time
		delta int
	}
	now := time.Now()
	edges := make([]edge, 0, 2*len(calls))
	for _, c := range calls {
		end := c.End
		if end.IsZero() {
			end = now
		}
		edges = append(edges, edge{c.Start, 1}, edge{end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.delta, b.delta) // ends first
	})
	most, cur := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

// TestMostAtOnce checks the overlap count the budget checks rest on; it needs no cluster.
func TestMostAtOnce(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1_700_000_000, 0).Add(time.Duration(ms) * time.Millisecond) }
	call := func(from, to int) control.Call { return control.Call{Start: at(from), End: at(to)} }
	tests := map[string]struct {
		calls []control.Call
		want  int
	}{
		"no calls":                             {nil, 0},
		"one call":                             {[]control.Call{call(0, 10)}, 1},
		"one after the other":                  {[]control.Call{call(0, 10), call(20, 30)}, 1},
		"one ends as the next starts":          {[]control.Call{call(0, 10), call(10, 20)}, 1},
		"two overlapping":                      {[]control.Call{call(0, 10), call(5, 15)}, 2},
		"three at once inside a long one":      {[]control.Call{call(0, 100), call(10, 20), call(15, 30), call(18, 19), call(40, 50)}, 4},
		"unordered":                            {[]control.Call{call(40, 50), call(0, 45), call(30, 60)}, 3},
		"a call still in flight runs to now":   {[]control.Call{{Start: at(0)}, call(1_000, 2_000)}, 2},
		"identical start and end of two calls": {[]control.Call{call(0, 10), call(0, 10)}, 2},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := mostAtOnce(tt.calls); got != tt.want {
				t.Errorf("mostAtOnce = %d, want %d", got, tt.want)
			}
		})
	}
}
