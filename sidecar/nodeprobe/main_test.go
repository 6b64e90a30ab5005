package nodeprobe_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/volume-healer/volume-healer/refdriver/mounter"
	"github.com/volume-healer/volume-healer/sidecar/nodeprobe"
)

// The test binary is also the processes the tests start beside themselves: the stat child, as
// the sidecar's binary is, and a FUSE mounter (the reference driver's) that a test can kill or
// freeze. mounterEnv holds "source:target" for the latter.
const mounterEnv = "NODEPROBE_TEST_MOUNTER"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == nodeprobe.StatArg {
		os.Exit(nodeprobe.StatMain(os.Args[2:], os.Stdout))
	}
	if v := os.Getenv(mounterEnv); v != "" {
		source, target, _ := strings.Cut(v, ":")
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		if err := mounter.Run(ctx, mounter.Options{Source: source, Target: target, FsName: "nodeprobe-test", Ready: os.Stdout}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// The tests mount under a root of this run's own, so that the check below sees their
	// mounts alone.
	root, err := os.MkdirTemp("", "nodeprobe-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.Setenv("TMPDIR", root); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if left := leftoverMounts(root); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "the tests left mounts behind:\n%s\n", strings.Join(left, "\n"))
		code = 1
	} else {
		_ = os.RemoveAll(root)
	}
	os.Exit(code)
}

// leftoverMounts lists the mounts under root.
func leftoverMounts(root string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var left []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], filepath.Clean(root)+"/") {
			left = append(left, line)
		}
	}
	return left
}
