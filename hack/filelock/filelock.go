// Package filelock serializes, across processes, the builds that write into a shared folder:
// hack/images building the images' binaries, and test/harness building the programs the suites
// run, which go test starts as parallel processes. One advisory lock (flock) on a file in the
// folder lets one build in at a time.
//
// It lives under hack/ because both of its users are build tooling and neither may import the
// other's home: hack/ must not import test/, and shipped code needs no build lock. It imports
// nothing of the module, and nothing shipped (cmd/ and the pipeline's packages) may import it.
package filelock

import (
	"fmt"
	"os"
	"syscall"
)

// Lock takes an exclusive lock on file, creating it when missing and waiting while another
// process holds the lock, and returns its release. The lock goes with the process too, however
// it ends.
func Lock(file string) (unlock func(), err error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", file, err)
	}
	return func() { _ = f.Close() }, nil
}
