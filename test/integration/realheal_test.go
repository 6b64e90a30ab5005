package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/healer"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/kubelet"
)

// TestRealHealAfterCrashLoop kills a real node plugin twice in a row, the second time while the
// restart sweep of the first start runs, as a crash-looping plugin does; then one mounter is
// killed, one mount turns read-only and one mounter freezes, and a periodic sweep repairs them. Every workload on the
// node (HostToContainer propagation) must get its I/O back without a restart, every volume must
// be readable and writable through its publish target with the data written before, the driver
// must never have served two calls on one volume at once, and the restart must be recorded
// once it was swept completely. The test logs each workload's outage (plugin first killed ->
// first good write) and the time from the last start to the first probe.
func TestRealHealAfterCrashLoop(t *testing.T) {
	harness.RequireRealMounts(t)
	f := newFixture(t, "realloop")
	bins, err := harness.Build(harness.BuildOptions{NodePlugin: true})
	if err != nil {
		t.Fatal(err)
	}
	class := f.StorageClass("realloop-fuse", "fuse", nil)
	nodeName := "realloop-node"
	n := f.StartRealNode(harness.RealNodeOptions{Node: nodeName, Kube: f.s.Env.Config, DriverBinary: bins.Driver, KeepPort: true})
	ctx := f.Ctx()
	vols := f.NewVolumes(nodeName, n.Control(), class, "fuse", "v", 10)
	f.ProvisionAll(n, vols)
	var workloads []*kubelet.Workload
	for i, v := range vols {
		target, err := n.Mount(ctx, v, fmt.Sprintf("pod-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(target, "before"), []byte(v.PV), 0o644); err != nil {
			t.Fatal(err)
		}
		w, err := n.StartWorkload(ctx, fmt.Sprintf("w%d", i), target, corev1.MountPropagationHostToContainer)
		if err != nil {
			t.Fatal(err)
		}
		workloads = append(workloads, w)
	}
	startController(t, "realloop", map[string]string{"BUDGETS_PER_NODE": "4"})
	f.SweepFinished(nodeName, time.Minute)

	killedAt := time.Now()
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, w := range workloads {
		if _, err := w.WaitFailure(ctx, killedAt); err != nil {
			t.Fatalf("workload %s kept working with its mounter dead: %v", w.Name(), err)
		}
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The plugin crashes again while the sweep of its start may be under way: whatever that
	// sweep repaired dies again with the new mounters.
	time.Sleep(150 * time.Millisecond)
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	lastStart := time.Now()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.SweepFinished(nodeName, 2*time.Minute)

	var outages []time.Duration
	for i, w := range workloads {
		ok, err := w.WaitOK(ctx, lastStart)
		if err != nil {
			t.Fatalf("workload %s did not get its I/O back: %v", w.Name(), err)
		}
		outages = append(outages, ok.Time.Sub(killedAt))
		target := n.Kubelet().PublishPath(fmt.Sprintf("pod-%d", i), vols[i].PV)
		if b, err := os.ReadFile(filepath.Join(target, "before")); err != nil || string(b) != vols[i].PV {
			t.Errorf("%s: the data written before the crashes reads %q, %v", vols[i].PV, b, err)
		}
	}
	for _, v := range vols {
		f.WaitPVCEvent(v, healer.ReasonVolumeHealed)
	}
	calls, err := n.Control().Calls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o := overlapping(calls); o != "" {
		t.Errorf("the driver served two calls on one volume at once: %s", o)
	}
	var firstProbe time.Time
	for _, c := range calls {
		if c.RPC == "ProbeVolume" && c.Start.After(lastStart) && (firstProbe.IsZero() || c.Start.Before(firstProbe)) {
			firstProbe = c.Start
		}
	}
	// Later, without a restart: one mounter killed, one mount turned read-only, one mounter
	// frozen, each under a running workload. A periodic sweep finds and repairs them, and the
	// workloads write again.
	faults := map[int]control.Condition{0: control.Gone, 1: control.ReadOnly, 2: control.Hung}
	faultAt := time.Now()
	for i, c := range faults {
		setFault(t, vols[i], c)
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i, c := range faults {
		if c == control.Hung {
			// I/O on a frozen mounter does not fail: it never returns.
			if stalled(workloads[i], faultAt, 2*time.Second) {
				continue
			}
			t.Fatalf("workload %s kept working with its mounter frozen", workloads[i].Name())
		}
		if _, err := workloads[i].WaitFailure(waitCtx, faultAt); err != nil {
			t.Fatalf("workload %s kept working after its volume turned %s: %v", workloads[i].Name(), c, err)
		}
	}
	f.AnnotateClass(class, annotations.Schedule, "@every 2s")
	for i := range faults {
		if _, err := workloads[i].WaitOK(waitCtx, time.Now()); err != nil {
			t.Fatalf("workload %s did not get its I/O back after its volume turned %s: %v", workloads[i].Name(), faults[i], err)
		}
		if c := vols[i].Condition(t); c != control.Healthy {
			t.Errorf("%s is %s after the periodic sweep, want healthy", vols[i].PV, c)
		}
	}

	slices.Sort(outages)
	t.Logf("%d workloads: outage (first kill -> first good write) p50 %s, max %s; last start -> first probe %s",
		len(outages), outages[len(outages)/2].Round(time.Millisecond), outages[len(outages)-1].Round(time.Millisecond),
		firstProbe.Sub(lastStart).Round(time.Millisecond))
}

// setFault breaks the volume for real through its driver. A read-only remount fails while the
// workload holds the file open for writing, which it does for a moment in each iteration: the
// fault is tried again then.
func setFault(t *testing.T, v *volume, c control.Condition) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, "volume "+v.PV+" to turn "+string(c), func() (bool, string) {
		_, err := v.Control.SetCondition(t.Context(), v.Handle, c, 0)
		return err == nil, fmt.Sprint(err)
	})
}

// stalled reports whether the workload has had no good iteration for the time quiet, from a
// moment after since.
func stalled(w *kubelet.Workload, since time.Time, quiet time.Duration) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rs := w.Results()
		lastOK := since
		for _, r := range rs {
			if r.OK && r.Time.After(lastOK) {
				lastOK = r.Time
			}
		}
		if time.Since(lastOK) >= quiet {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// overlapping describes two calls on one volume that the driver served at the same time, or "".
func overlapping(calls []control.Call) string {
	byVolume := map[string][]control.Call{}
	for _, c := range calls {
		byVolume[c.VolumeID] = append(byVolume[c.VolumeID], c)
	}
	for id, cs := range byVolume {
		slices.SortFunc(cs, func(a, b control.Call) int { return a.Start.Compare(b.Start) })
		for i := 1; i < len(cs); i++ {
			prev := cs[i-1]
			if prev.End.IsZero() || cs[i].Start.Before(prev.End) {
				return fmt.Sprintf("%s: %s from %s and %s from %s", id, prev.RPC, prev.Start.Format(time.StampMicro), cs[i].RPC, cs[i].Start.Format(time.StampMicro))
			}
		}
	}
	return ""
}
