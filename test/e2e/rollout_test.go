package e2e

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// TestDaemonSetRollout restarts the node plugins of 50 nodes at once, as a DaemonSet rollout does:
// 100 new processes, 50 new restart markers within seconds. Each node has an rbd-nbd volume whose
// mounter died, a slow one (hung for a moment, so that calls overlap), a healthy one and a broken
// krbd one the driver cannot heal; on three nodes the dead volume is detaching. The controller's
// budgets (8 calls in flight in all, 2 per node) turn the storm into a queue: they are never
// exceeded, no volume gets two calls at once, every healable volume is healed, the krbd volumes
// and the detaching ones are left alone.
func TestDaemonSetRollout(t *testing.T) {
	const nodeCount = 50
	f := newFixture(t, "rollout")
	nbd := f.StorageClass("rollout-rbd-nbd", "rbd-nbd", nil)
	krbd := f.StorageClass("rollout-rbd", "", nil)
	b := budgets{global: 8, perDriver: 8, perNode: 2}
	var nodes []*node
	var dead, slow, unhealable, detaching []*volume
	for i := range nodeCount {
		n := f.newNode(fmt.Sprintf("rollout-node-%02d", i+1))
		nodes = append(nodes, n)
		tag := fmt.Sprintf("n%02d", i+1)
		vs := f.newVolumes(n, nbd, "rbd-nbd", tag, 3)
		if i < 3 {
			detaching = append(detaching, vs[0])
		} else {
			dead = append(dead, vs[0])
		}
		slow = append(slow, vs[1])
		unhealable = append(unhealable, f.newVolumes(n, krbd, "krbd", tag+"-krbd", 1)...)
	}
	var all []*volume
	for _, n := range nodes {
		all = append(all, n.volumes...)
	}
	setUpStart := time.Now()
	f.CreateVolumes(all, true)
	for _, v := range detaching {
		f.Detach(v)
	}
	inParallel(t, nodes, (*node).launch)
	t.Logf("%d volumes and %d node plugins set up in %s", len(all), nodeCount, time.Since(setUpStart).Round(100*time.Millisecond))
	c := f.startController("rollout", b.settings())
	f.sweepsFinished(nodes, 3*time.Minute)

	// The rollout: every plugin stops, its rbd-nbd mounters die with it, and every plugin starts
	// again.
	inParallel(t, nodes, (*node).stop)
	for _, n := range nodes {
		if err := n.launchDriver(); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range append(append([]*volume{}, dead...), detaching...) {
		v.SetCondition(t, control.Gone, 0)
	}
	for _, v := range slow {
		v.SetCondition(t, control.Hung, 300*time.Millisecond)
	}
	for _, v := range unhealable {
		v.SetCondition(t, control.Gone, 0)
	}
	rolledAt := time.Now()
	inParallel(t, nodes, func(n *node) error { return n.launchSidecar(true) })
	t.Logf("%d sidecars restarted in %s", nodeCount, time.Since(rolledAt).Round(100*time.Millisecond))
	f.sweepsFinished(nodes, 5*time.Minute)
	t.Logf("every restart sweep finished %s after the rollout began", time.Since(rolledAt).Round(100*time.Millisecond))
	c.MustRun()

	p := f.verify(nodes, b, outcome{
		healed:     append(append([]*volume{}, dead...), slow...),
		leftBroken: unhealable,
		untouched:  detaching,
	})
	if p.all <= b.perNode {
		t.Errorf("at most %d calls were in flight at once over all nodes: the nodes were never swept side by side, so the global budget was not tested", p.all)
	}
}

// inParallel runs fn for every node, a few at a time (the machine has few cores, and the processes
// they start need them), and fails the test with every error.
func inParallel(t *testing.T, nodes []*node, fn func(*node) error) {
	t.Helper()
	const workers = 8
	sem := make(chan struct{}, workers)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(n); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("node %s: %w", n.name, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
