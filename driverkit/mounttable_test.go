package driverkit_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/volume-healer/volume-healer/driverkit"
)

// TestMountTableSeesEveryChange mounts and unmounts in quick succession: the kept-open table must
// show each change at the next read, never the table from before it, and a read with nothing
// changed since the previous one must not read the table again.
func TestMountTableSeesEveryChange(t *testing.T) {
	requireMounts(t, false)
	dir := mkdir(t, t.TempDir(), "mnt")
	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	for i := range 200 {
		if err := unix.Mount(testSource, dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatalf("mount tmpfs at %s: %v", dir, err)
		}
		if dev, err := c.MountDevice(dir); err != nil || dev == "" {
			t.Fatalf("round %d: MountDevice(%s) right after the mount = %q, %v; want its device", i, dir, dev, err)
		}
		before := driverkit.TableReads()
		if dev, err := c.MountDevice(dir); err != nil || dev == "" {
			t.Fatalf("round %d: MountDevice(%s) again = %q, %v", i, dir, dev, err)
		}
		if n := driverkit.TableReads() - before; n != 0 {
			t.Fatalf("round %d: a second look at an unchanged mount table read it %d more time(s), want 0", i, n)
		}
		if err := unix.Unmount(dir, 0); err != nil {
			t.Fatalf("unmount %s: %v", dir, err)
		}
		if dev, err := c.MountDevice(dir); err != nil || dev != "" {
			t.Fatalf("round %d: MountDevice(%s) right after the unmount = %q, %v; want nothing mounted", i, dir, dev, err)
		}
	}
}

// TestMountTableFileIsReadEachTime: a mount table that is a plain file (a test's, a copy) cannot
// say when it changed, so each call reads it.
func TestMountTableFileIsReadEachTime(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mountinfo")
	line := func(point string) string {
		return "36 35 98:0 / " + point + " rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"
	}
	for _, point := range []string{"/mnt/one", "/mnt/two"} {
		if err := os.WriteFile(file, []byte(line(point)), 0o644); err != nil {
			t.Fatal(err)
		}
		c := driverkit.NewChecker(driverkit.CheckerOptions{MountInfo: file})
		if dev, err := c.MountDevice(point); err != nil || dev != "98:0" {
			t.Fatalf("MountDevice(%s) after the file named it = %q, %v; want 98:0", point, dev, err)
		}
	}
}

// TestNamespaceTablesFollowTheirNamespaces: the stale-mount search sees a mount propagated into
// a pod's namespace after an earlier search read that namespace, and a search that ends with no
// other waiting leaves no table open, since an open table keeps its namespace alive and holds a
// descriptor of the driver.
func TestNamespaceTablesFollowTheirNamespaces(t *testing.T) {
	requireMounts(t, false)
	root := sharedRoot(t)
	target := mkdir(t, root, "target")
	w := startWorkload(t, target, false)
	ns, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(w.cmd.Process.Pid), "ns", "mnt"))
	if err != nil {
		t.Fatal(err)
	}
	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	if _, err := c.StaleMounts([]string{"0:0"}); err != nil {
		t.Fatalf("StaleMounts: %v", err)
	}
	if open := driverkit.NamespaceTables(c); len(open) != 0 {
		t.Fatalf("after a lone search the tables of %v are still open, want none", open)
	}

	// A mount on the publish target propagates into the workload's namespace.
	for round := range 3 {
		mountTmpfs(t, target, 0)
		dev, err := c.MountDevice(target)
		if err != nil || dev == "" {
			t.Fatalf("MountDevice(%s) = %q, %v", target, dev, err)
		}
		stale, err := c.StaleMounts([]string{dev})
		if err != nil {
			t.Fatalf("StaleMounts: %v", err)
		}
		if !slices.ContainsFunc(stale, func(m driverkit.StaleMount) bool { return m.Namespace == ns }) {
			t.Fatalf("round %d: StaleMounts(%s) = %+v, want the mount propagated into the workload's namespace %s", round, dev, stale, ns)
		}
	}
}

// TestNamespaceTablesAreClosedAfterABurst: searches asked for at once share the kept tables, and
// once the last of them ends no table is left open.
func TestNamespaceTablesAreClosedAfterABurst(t *testing.T) {
	requireMounts(t, false)
	root := sharedRoot(t)
	for i := range 3 {
		startWorkload(t, mkdir(t, root, "target"+strconv.Itoa(i)), false)
	}
	c := driverkit.NewChecker(driverkit.CheckerOptions{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				if _, err := c.StaleMounts([]string{"0:0"}); err != nil {
					t.Errorf("StaleMounts: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if open := driverkit.NamespaceTables(c); len(open) != 0 {
		t.Fatalf("after the burst the tables of %v are still open, want none", open)
	}
}
