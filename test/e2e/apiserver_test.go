package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volume-healer/volume-healer/api/annotations"
	"github.com/volume-healer/volume-healer/refdriver/control"
	"github.com/volume-healer/volume-healer/test/harness"
)

// TestAPIServerRestartMidSweep stops kube-apiserver while a restart sweep runs and keeps it down
// until the sweep's calls are done, so the sweep ends with nowhere to write its Events and its
// handled marker; meanwhile another node plugin restarts and cannot register. Once the apiserver
// is back, the controller's watches resume and nothing is missed: the first sweep is recorded as
// handled, the second node's restart (registered after the apiserver came back) is swept, and a
// manual sweep requested on a PVC after the restart heals its volume. The controller keeps running
// throughout, and every invariant holds over all of it.
func TestAPIServerRestartMidSweep(t *testing.T) {
	f := newFixture(t, "apiserver")
	sc := f.StorageClass("apiserver-rbd-nbd", "rbd-nbd", nil)
	// One call at a time per node makes the sweep long enough to stop the apiserver in its middle.
	b := budgets{global: 2, perDriver: 2, perNode: 1}
	first, second := f.newNode("apiserver-node-1"), f.newNode("apiserver-node-2")
	firstVols := f.newVolumes(first, sc, "rbd-nbd", "n1", 10)
	secondVols := f.newVolumes(second, sc, "rbd-nbd", "n2", 6)
	f.CreateVolumes(append(append([]*volume{}, firstVols...), secondVols...), true)
	detaching := secondVols[5]
	f.Detach(detaching)
	first.start()
	second.start()
	c := f.startController("apiserver", b.settings())
	f.sweepsFinished([]*node{first, second}, time.Minute)

	for _, v := range firstVols {
		v.SetCondition(t, control.Hung, 500*time.Millisecond)
	}
	restartedAt := time.Now()
	first.restart()
	harness.Eventually(t, time.Minute, "the restart sweep of "+first.name+" to heal two volumes", func() (bool, string) {
		n := countCalls(t, first, "HealVolume", restartedAt)
		return n >= 2, fmt.Sprintf("%d heals", n)
	})

	stoppedAt := time.Now()
	if err := f.s.StopAPIServer(); err != nil {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
	apiDown := true
	t.Cleanup(func() {
		// A test that failed while the apiserver was down must not leave it down for the next.
		if apiDown {
			if err := f.s.StartAPIServer(); err != nil {
				t.Errorf("start kube-apiserver again: %v", err)
			}
		}
	})
	if heals := countCalls(t, first, "HealVolume", restartedAt); heals >= len(firstVols) {
		t.Fatalf("the sweep had healed all %d volumes before the apiserver stopped; it must stop mid-sweep", heals)
	}
	// The second node plugin restarts while the apiserver is down: its sidecar cannot register.
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	second.startDriver()
	for _, v := range secondVols[:4] {
		v.SetCondition(t, control.Gone, 0)
	}
	detaching.SetCondition(t, control.Gone, 0)
	second.startSidecar(false)
	// The first sweep goes on without the apiserver (the sidecars answer from their caches) until
	// every volume is healed.
	harness.Eventually(t, 2*time.Minute, "every volume of "+first.name+" to be healed with the apiserver down", func() (bool, string) {
		healthy := 0
		for _, v := range firstVols {
			if v.Condition(t) == control.Healthy {
				healthy++
			}
		}
		return healthy == len(firstVols), fmt.Sprintf("%d of %d healthy", healthy, len(firstVols))
	})
	if err := f.s.StartAPIServer(); err != nil {
		t.Fatalf("start kube-apiserver again: %v", err)
	}
	apiDown = false
	t.Logf("kube-apiserver was down for %s", time.Since(stoppedAt).Round(100*time.Millisecond))
	if err := f.s.Ready(f.Ctx()); err != nil {
		t.Fatal(err)
	}

	// A volume breaks after the restart, and an operator asks for a sweep of its PVC.
	late := firstVols[0]
	late.SetCondition(t, control.ReadOnly, 0)
	request := "after-apiserver-restart"
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annotations.SweepRequest: request}}})
	if _, err := f.Clientset.CoreV1().PersistentVolumeClaims(f.AppNS).Patch(f.Ctx(), late.PVC, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	second.waitRegistered(2 * time.Minute)
	f.sweepsFinished([]*node{first, second}, 2*time.Minute)
	harness.Eventually(t, 2*time.Minute, "the manual sweep of PVC "+late.PVC+" to be handled", func() (bool, string) {
		pvc, err := f.Clientset.CoreV1().PersistentVolumeClaims(f.AppNS).Get(f.Ctx(), late.PVC, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		handled := pvc.Annotations[annotations.SweepHandled]
		return handled == request, fmt.Sprintf("handled %q", handled)
	})
	c.MustRun()
	f.verify([]*node{first, second}, b, outcome{
		healed:    append(append([]*volume{}, firstVols...), secondVols[:4]...),
		untouched: []*volume{detaching},
	})
}

// countCalls counts the calls of rpc that the node's drivers began since at.
func countCalls(t *testing.T, n *node, rpc string, since time.Time) int {
	t.Helper()
	calls, _, err := n.record()
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, c := range calls {
		if c.RPC == rpc && !c.Start.Before(since) {
			count++
		}
	}
	return count
}
