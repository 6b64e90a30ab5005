package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/refdriver/control"
)

// TestRestartFlow is the controller's main job, with every part a process: a node plugin restarts
// and its restart killed the rbd-nbd mounters of some volumes, turned one mount read-only, left one
// hanging and one with its data lost. The restart sweep heals exactly the broken volumes the
// driver can heal, leaves the krbd volumes (which it cannot) and the lost one alone, sends nothing
// for a volume that is detaching, and records the restart as handled, with the counts in the
// RestartSweepFinished Event.
func TestRestartFlow(t *testing.T) {
	f := newFixture(t, "restart")
	nbd := f.StorageClass("restart-rbd-nbd", "rbd-nbd", nil)
	krbd := f.StorageClass("restart-rbd", "", nil)
	b := budgets{global: 4, perDriver: 4, perNode: 2}
	n := f.newNode("restart-node-1")
	gone := f.newVolumes(n, nbd, "rbd-nbd", "gone", 3)
	readOnly := f.newVolumes(n, nbd, "rbd-nbd", "readonly", 1)
	hung := f.newVolumes(n, nbd, "rbd-nbd", "hung", 2)
	lost := f.newVolumes(n, nbd, "rbd-nbd", "lost", 1)
	krbdGone := f.newVolumes(n, krbd, "krbd", "krbd-gone", 1)
	f.newVolumes(n, nbd, "rbd-nbd", "healthy", 2)
	f.newVolumes(n, krbd, "krbd", "krbd-healthy", 1)
	detaching := f.newVolumes(n, nbd, "rbd-nbd", "detaching", 1)
	f.CreateVolumes(n.volumes, true)
	f.Detach(detaching[0])

	n.start()
	c := f.startController("restart", b.settings())
	f.SweepFinished(n.name, time.Minute)

	// The mounters die with the plugin: the volumes are broken when the new plugin starts.
	for _, v := range append(gone, detaching...) {
		v.SetCondition(t, control.Gone, 0)
	}
	readOnly[0].SetCondition(t, control.ReadOnly, 0)
	for _, v := range hung {
		v.SetCondition(t, control.Hung, 300*time.Millisecond)
	}
	lost[0].SetCondition(t, control.Lost, 0)
	krbdGone[0].SetCondition(t, control.Gone, 0)
	n.restart()
	f.SweepFinished(n.name, 2*time.Minute)
	c.MustRun()

	healed := slices.Concat(gone, readOnly, hung)
	f.verify([]*node{n}, b, outcome{
		healed:     healed,
		leftBroken: slices.Concat(lost, krbdGone),
		untouched:  detaching,
	})
	// 12 volumes: the detaching one skipped before the count; of the 11 probed 6 healed, the lost
	// and the broken krbd one left alone.
	want := []string{fmt.Sprintf("%d volumes:", len(n.volumes)-1), fmt.Sprintf("%d healed", len(healed)), "2 unhealthy left alone", "1 skipped", "0 failed"}
	f.WaitSweepMessage(n.name, want...)
}
