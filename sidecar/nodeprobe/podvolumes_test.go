package nodeprobe_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// TestFindWithPodVolumes: Find with a recent read of the pods' folders returns the publish targets
// of that read whose records are still there, finds a pod published since only once the read is
// MaxAge old, and never returns a pod whose record is gone.
func TestFindWithPodVolumes(t *testing.T) {
	k := newKubeletDir(t)
	staging := k.stage(testDriver, "vol-1", "pv-1")
	targetA := k.publish("pod-a", testDriver, "vol-1", "pv-1")
	k.publish("pod-c", testDriver, "vol-2", "pv-2")

	now := time.Unix(1000, 0)
	pods := nodeprobe.NewPodVolumes(k.dir, time.Second, func() time.Time { return now })
	recent := nodeprobe.Records{KubeletDir: k.dir, Pods: pods}
	find := func(r nodeprobe.Records) []string {
		t.Helper()
		v, err := r.Find(testDriver, "vol-1", "pv-1")
		if err != nil {
			t.Fatalf("Find: %v", err)
		}
		if v.StagingPath != staging {
			t.Fatalf("Find: staging path %q, want %q", v.StagingPath, staging)
		}
		return v.Targets
	}
	if got := find(recent); !slices.Equal(got, []string{targetA}) {
		t.Fatalf("first Find: targets %q, want %q", got, []string{targetA})
	}

	// pod-a ends and pod-b starts within the second.
	if err := os.RemoveAll(filepath.Join(k.dir, "pods", "pod-a")); err != nil {
		t.Fatal(err)
	}
	targetB := k.publish("pod-b", testDriver, "vol-1", "pv-1")
	now = now.Add(999 * time.Millisecond)
	if got := find(recent); len(got) != 0 {
		t.Fatalf("Find within MaxAge of the read: targets %q, want none (pod-a's record is gone, pod-b is not in the read)", got)
	}
	if got := find(nodeprobe.Records{KubeletDir: k.dir}); !slices.Equal(got, []string{targetB}) {
		t.Fatalf("Find without the recent read: targets %q, want %q", got, []string{targetB})
	}
	now = now.Add(time.Millisecond)
	if got := find(recent); !slices.Equal(got, []string{targetB}) {
		t.Fatalf("Find once the read is MaxAge old: targets %q, want %q", got, []string{targetB})
	}
}

// TestPodVolumesWithoutPods: a node without a pods folder has no publish targets, and a volume
// recorded nowhere is not on the node, as without the recent read.
func TestPodVolumesWithoutPods(t *testing.T) {
	k := newKubeletDir(t)
	staging := k.stage(testDriver, "vol-1", "pv-1")
	r := nodeprobe.Records{KubeletDir: k.dir, Pods: nodeprobe.NewPodVolumes(k.dir, time.Second, nil)}
	v, err := r.Find(testDriver, "vol-1", "pv-1")
	if err != nil || v.StagingPath != staging || len(v.Targets) != 0 {
		t.Fatalf("Find: %+v, %v; want staging path %q and no targets", v, err, staging)
	}
	if _, err := r.Find(testDriver, "vol-2", "pv-2"); !errors.Is(err, nodeprobe.ErrNotOnNode) {
		t.Fatalf("Find of a volume recorded nowhere: %v, want ErrNotOnNode", err)
	}
}
