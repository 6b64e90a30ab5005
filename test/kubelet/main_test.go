package kubelet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/volume-healer/volume-healer/test/harness"
	"github.com/volume-healer/volume-healer/test/kubelet"
)

// workloadBin is test/workload, built once per run.
var workloadBin string

// The test binary runs itself as orphanHelper when orphanDirEnv is set.
const (
	orphanDirEnv = "KUBELET_TEST_ORPHAN_DIR"
	orphanBinEnv = "KUBELET_TEST_ORPHAN_BIN"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(orphanDirEnv); dir != "" {
		orphanHelper(dir, os.Getenv(orphanBinEnv))
	}
	// Every test needs root (requireRoot), and without it none needs the program.
	if os.Geteuid() == 0 {
		bin, err := harness.BuildWorkload()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build test/workload: %v\n", err)
			os.Exit(1)
		}
		workloadBin = bin
	}
	os.Exit(m.Run())
}

// orphanHelper starts a workload on a folder in dir, prints its PID and waits to be killed; it
// gives up after a minute, should its test be gone.
func orphanHelper(dir, bin string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	target := filepath.Join(dir, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	w, err := kubelet.StartWorkload(ctx, kubelet.WorkloadOptions{
		Bin: bin, Target: target, Dir: filepath.Join(dir, "volume"), Propagation: "HostToContainer", Name: "orphan",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("pid %d\n", w.Pid())
	time.Sleep(time.Minute)
	os.Exit(1)
}

// requireRoot skips t unless it runs as root, which mounting needs; with CI=true it fails it.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test mounts file systems and must run as root (CI=true)")
	}
	t.Skip("this test mounts file systems and must run as root")
}

// newKubelet returns a Kubelet on a temporary root that is closed when the test ends, and
// checks that Close left no mount there.
func newKubelet(t *testing.T) *kubelet.Kubelet {
	t.Helper()
	k, err := kubelet.New(t.TempDir() + "/kubelet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if left := mountsUnder(t, k.Root()); len(left) > 0 {
			t.Errorf("mounts left at or below %s after Close: %v", k.Root(), left)
		}
	})
	return k
}

// mountsUnder lists the mount points at dir or below it in this process's mount namespace.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, m := range mounts {
		points = append(points, m.Mountpoint)
	}
	return points
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
