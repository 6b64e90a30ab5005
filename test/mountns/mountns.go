// Package mountns holds what the test programs that set up a mount namespace of their own
// (test/container, test/workload) share: the check that they run in one before they change any
// mount.
//
// It owns that check alone; it imports nothing of volume-healer and must not, since the programs
// that import it stand in for a user's container, which knows nothing of the healer.
package mountns

import (
	"errors"
	"fmt"
	"os"
)

// RequireOwn refuses to change mounts in the namespace of the process that started this one: run
// by hand, without CLONE_NEWNS, a set-up would change the host's mounts. startedBy names what
// starts the program correctly, for the error.
func RequireOwn(startedBy string) error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return err
	}
	if self == parent {
		return errors.New("not in a mount namespace of its own: start it with CLONE_NEWNS, as " + startedBy + " does")
	}
	return nil
}
