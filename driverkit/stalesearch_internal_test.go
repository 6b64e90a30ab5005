package driverkit

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// writeFakeProcess puts process pid into the fake /proc folder proc, replacing what was there:
// its mount namespace ns (the target of ns/mnt) and its mount table.
func writeFakeProcess(t *testing.T, proc string, pid int, ns, mountinfo string) {
	t.Helper()
	dir := filepath.Join(proc, strconv.Itoa(pid))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ns, filepath.Join(dir, "ns", "mnt")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "mountinfo"), []byte(mountinfo), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A probe takes the answer of a search of the mount namespaces begun at most staleSearchReuse
// before it, unless Repair changed its volume's mounts since that search began: then it waits
// for a newer one. The other volumes' probes still share the older search.
func TestProbeSearchFollowsItsVolumesRepair(t *testing.T) {
	proc := t.TempDir()
	for pid := 1; pid <= 3; pid++ {
		writeFakeProcess(t, proc, pid, "mnt:[4026531840]", "22 1 0:21 / / rw - ext4 /dev/root rw\n")
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

// A dead mount a search found in another namespace is reported only if it is still there a
// moment later, in a process of that namespace: a container runtime's namespace of a container
// being set up holds a private copy of the node's mounts for a few milliseconds, and is gone by
// then; a pod's keeps its copy.
func TestStaleMountsAreLookedAtAgain(t *testing.T) {
	proc := t.TempDir()
	const dead = "0:448"
	deadAt := func(point string) string {
		return "22 1 0:21 / / rw - ext4 /dev/root rw\n30 22 " + dead + " / " + point + " rw - fuse.refdriver vol rw\n"
	}
	setProcess := func(pid int, ns, mountinfo string) { writeFakeProcess(t, proc, pid, ns, mountinfo) }
	setProcess(10, "mnt:[10]", deadAt("/data"))            // a pod: keeps its copy
	setProcess(20, "mnt:[20]", deadAt("/var/lib/kubelet")) // a runtime's setup: gone
	setProcess(30, "mnt:[30]", deadAt("/data"))            // a pod whose searched process exited...
	setProcess(31, "mnt:[30]", deadAt("/data"))            // ...while another of it runs on
	setProcess(40, "mnt:[40]", deadAt("/data"))            // a pod whose mount was covered since
	setProcess(50, "mnt:[50]", deadAt("/data"))            // a number taken by another namespace
	c := NewChecker(CheckerOptions{Proc: proc})
	found, err := c.StaleMounts([]string{dead})
	if err != nil || len(found) != 5 {
		t.Fatalf("first search: %v, %v; want the dead mount in 5 namespaces", found, err)
	}

	if err := os.RemoveAll(filepath.Join(proc, "20")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(proc, "30")); err != nil {
		t.Fatal(err)
	}
	setProcess(40, "mnt:[40]", deadAt("/data")+"31 30 0:500 / /data rw - fuse.refdriver vol rw\n")
	setProcess(50, "mnt:[51]", deadAt("/data"))
	var got []string
	for _, m := range c.confirmStale(found, 0) {
		got = append(got, m.Namespace+"@"+strconv.Itoa(m.PID)+":"+m.MountPoint)
	}
	if want := "mnt:[10]@10:/data mnt:[30]@31:/data"; strings.Join(got, " ") != want {
		t.Errorf("confirmed %v, want %s", got, want)
	}
}
