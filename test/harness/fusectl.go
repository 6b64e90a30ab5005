package harness

import (
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// FuseControl is where a mount supervisor mounts the fusectl file system when nothing is mounted
// there (driverkit/supervisor's default FuseControl).
const FuseControl = "/sys/fs/fuse/connections"

// RunUnmountingFuseControl runs m, and unmounts the fusectl file system from FuseControl
// afterwards when it was not mounted there before: the mount supervisors the tests start mount
// it, and the machine keeps no mount a test left.
func RunUnmountingFuseControl(m *testing.M) int {
	before, err := mountinfo.Mounted(FuseControl)
	code := m.Run()
	if err != nil || before {
		return code
	}
	if after, err := mountinfo.Mounted(FuseControl); err == nil && after {
		_ = unix.Unmount(FuseControl, 0)
	}
	return code
}
