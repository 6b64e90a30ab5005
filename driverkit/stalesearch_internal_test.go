package driverkit

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A probe takes the answer of a search of the mount namespaces begun at most staleSearchReuse
// before it, unless Repair changed its volume's mounts since that search began: then it waits
// for a newer one. The other volumes' probes still share the older search.
func TestProbeSearchFollowsItsVolumesRepair(t *testing.T) {
	proc := t.TempDir()
	for pid := 1; pid <= 3; pid++ {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("mnt:[4026531840]", filepath.Join(dir, "ns", "mnt")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "mountinfo"), []byte("22 1 0:21 / / rw - ext4 /dev/root rw\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := NewChecker(CheckerOptions{Proc: proc})
	searches := func() int64 { return c.scansRun.Load() }

	c.scanNamespaces(time.Now())
	if n := searches(); n != 1 {
		t.Fatalf("%d searches after the first call, want 1", n)
	}
	c.scanNamespaces(c.probeSearchSince("vol-a"))
	if n := searches(); n != 1 {
		t.Errorf("a probe right after a search ran one more (%d in all), want the last one taken", n)
	}
	c.markRepaired("vol-a")
	c.scanNamespaces(c.probeSearchSince("vol-b"))
	if n := searches(); n != 1 {
		t.Errorf("a probe of another volume after vol-a's repair ran a search (%d in all), want the last one taken", n)
	}
	c.scanNamespaces(c.probeSearchSince("vol-a"))
	if n := searches(); n != 2 {
		t.Errorf("a probe of vol-a after its repair: %d searches in all, want 2 (one begun after the repair)", n)
	}
	time.Sleep(staleSearchReuse + 10*time.Millisecond)
	c.scanNamespaces(c.probeSearchSince("vol-b"))
	if n := searches(); n != 3 {
		t.Errorf("a probe %s after the last search: %d searches in all, want 3 (the last one too old)", staleSearchReuse, n)
	}
}
