package driverkit_test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the processes the tests need beside themselves: a FUSE daemon
// that can be killed or frozen on its own, and a workload in its own mount namespace. The
// environment variable helperEnv says which one to be.
const (
	helperEnv      = "DRIVERKIT_TEST_HELPER"
	helperFUSE     = "fuse"
	helperWorkload = "workload"

	fuseMountEnv  = "DRIVERKIT_TEST_FUSE_MOUNT"
	fuseSourceEnv = "DRIVERKIT_TEST_FUSE_SOURCE"

	workloadTargetEnv  = "DRIVERKIT_TEST_WORKLOAD_TARGET"
	workloadDirEnv     = "DRIVERKIT_TEST_WORKLOAD_DIR"
	workloadPrivateEnv = "DRIVERKIT_TEST_WORKLOAD_PRIVATE"

	// sourceEnv passes testSource to the helpers.
	sourceEnv = "DRIVERKIT_TEST_SOURCE"

	// fuseName is the type of the tests' FUSE mounts.
	fuseName   = "driverkit-test"
	fuseFSType = "fuse." + fuseName

	// readyLine is what a helper prints once it is set up.
	readyLine = "ready"
	// dataFile is the file the FUSE volumes hold and the workloads read.
	dataFile = "hello"
)

// testSource is the source of every mount the tests make: one of this run's own, as a volume's
// source is its own, so that a search for a volume's mounts by source never finds those of a run
// beside it.
var testSource = "driverkit-test-" + strconv.Itoa(os.Getpid())

func TestMain(m *testing.M) {
	if s := os.Getenv(sourceEnv); s != "" {
		testSource = s
	}
	switch os.Getenv(helperEnv) {
	case helperFUSE:
		os.Exit(runFUSEDaemon())
	case helperWorkload:
		os.Exit(runWorkload())
	}
	// Every folder the tests mount on lies under a root of this process's own (t.TempDir
	// follows TMPDIR), so that the check below sees this run's mounts only, not those of a
	// run beside it.
	root, err := os.MkdirTemp("", "driverkit-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Setenv("TMPDIR", root); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	left := leftoverMounts(root)
	if len(left) == 0 {
		_ = os.RemoveAll(root)
	}
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "the tests left mounts behind:\n%s\n", strings.Join(left, "\n"))
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// runFUSEDaemon serves a loopback of a folder at a mount point until it is killed, like the
// userspace mounter of a volume.
func runFUSEDaemon() int {
	mnt, src := os.Getenv(fuseMountEnv), os.Getenv(fuseSourceEnv)
	root, err := fs.NewLoopbackRoot(src)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Long cache timeouts, as real mounters use, let the kernel answer a stat without the
	// daemon: a frozen daemon must be found anyway.
	cache := time.Minute
	server, err := fs.Mount(mnt, root, &fs.Options{AttrTimeout: &cache, EntryTimeout: &cache, MountOptions: fuse.MountOptions{
		DirectMountStrict: true,
		FsName:            testSource,
		Name:              fuseName,
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(readyLine)
	server.Wait()
	return 0
}

// runWorkload plays a container: in its own mount namespace (the test starts it with
// CLONE_NEWNS) it receives mounts from the host like a HostToContainer volume, bind-mounts the
// volume's publish target at its own folder, and reads the volume's file in a loop, printing
// "ok" or the error each time. With private set the folder stops receiving mounts, like a
// volume whose mount propagation is None.
func runWorkload() int {
	target, dir := os.Getenv(workloadTargetEnv), os.Getenv(workloadDirEnv)
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		fmt.Fprintln(os.Stderr, "make / a slave:", err)
		return 1
	}
	if err := unix.Mount(target, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		fmt.Fprintln(os.Stderr, "bind the publish target:", err)
		return 1
	}
	// runc applies a volumeMount's propagation to the bind: rprivate for None, rslave for
	// HostToContainer.
	flags := uintptr(unix.MS_REC | unix.MS_SLAVE)
	if os.Getenv(workloadPrivateEnv) != "" {
		flags = unix.MS_REC | unix.MS_PRIVATE
	}
	if err := unix.Mount("", dir, "", flags, ""); err != nil {
		fmt.Fprintln(os.Stderr, "set the propagation of the folder:", err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, readyLine)
	for {
		if _, err := os.ReadFile(filepath.Join(dir, dataFile)); err != nil {
			fmt.Fprintln(out, "err", err)
		} else {
			fmt.Fprintln(out, "ok")
		}
		if err := out.Flush(); err != nil {
			return 0 // the test is gone
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leftoverMounts lists the mounts of this namespace that the tests made and did not remove.
func leftoverMounts(root string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var left []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && strings.HasPrefix(fields[4], root+"/") {
			left = append(left, line)
		}
	}
	return left
}
