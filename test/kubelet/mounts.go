package kubelet

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry = mountinfo.Info

// mountsUnder lists the mounts of this process's mount namespace at dir or below it. It reads
// mountinfo rather than stat-ing paths, which a mount whose FUSE daemon died answers with
// ENOTCONN.
func mountsUnder(dir string) ([]*mountEntry, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return mounts, nil
}

// mountsAt lists the mounts stacked at path, in no particular order.
func mountsAt(path string) ([]*mountEntry, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return mounts, nil
}

func isMountPoint(path string) (bool, error) {
	mounts, err := mountsAt(path)
	return len(mounts) > 0, err
}

// topMount returns the mount that path shows: of the mounts stacked there, the one no other
// is mounted on.
func topMount(path string) (*mountEntry, error) {
	mounts, err := mountsAt(path)
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		covered := slices.ContainsFunc(mounts, func(o *mountEntry) bool { return o.Parent == m.ID })
		if !covered {
			return m, nil
		}
	}
	return nil, fmt.Errorf("%s is not a mount point", path)
}

// sortDeepestFirst orders mounts so that a mount comes before every mount of a folder above it.
// Mounts stacked at one path are unmounted by that path, top first whatever their order.
func sortDeepestFirst(mounts []*mountEntry) {
	slices.SortStableFunc(mounts, func(a, b *mountEntry) int {
		return strings.Count(b.Mountpoint, "/") - strings.Count(a.Mountpoint, "/")
	})
}

// unmount lazily unmounts the top mount at path. A path that is no longer a mount point, because
// an unmount that propagated here already removed it, is not an error.
func unmount(path string) error {
	err := syscall.Unmount(path, syscall.MNT_DETACH)
	if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", path, err)
}
